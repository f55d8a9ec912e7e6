"""Fit host sharing (`cluster.host_memory_share` s, `cluster.host_compute_share` c) from the
profile's contended steps (`device_facts.host_contention`, see realexec/fidelity/profile/contention.py).

Each point was timed alone (a), beside a neighbour streaming memory (f = 1) and beside one
spinning on a core (f = 0). With the calibrated cost model's memory share of the step, phi
(`simulator.cost.host_share`), the model is

    stream / a = phi / s + (1 - phi) / c        spin / a = phi + (1 - phi) / c

and (s, c) in (0, 1] are fitted by least squares on the log ratios.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import least_squares

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.host_share import HostSharing

MIN_POINTS = 2  # contended points (each gives two ratios) for two parameters


def fit_host_sharing(contention: dict[str, Any], cost_model: CostModel) -> dict[str, Any]:
    """{"memory_share", "compute_share", "num_points", "mape", "points": [...]}; ValueError
    when there are too few points, saying how many more are needed."""
    pts = [p for p in contention.get("points") or []
           if all(p.get(k, 0) > 0 for k in ("none_s", "stream_s", "spin_s"))]
    if len(pts) < MIN_POINTS:
        raise ValueError(f"host contention: {len(pts)} usable point(s), the fit of two shares "
                         f"needs {MIN_POINTS} ({MIN_POINTS - len(pts)} more)")
    hs = HostSharing(cost_model)
    phi, stream, spin = [], [], []
    for p in pts:
        shape = BatchShape(**p["shape"])
        t = cost_model.step_time(shape)
        phi.append(min(1.0, hs.memory_seconds(shape, t) / t) if t > 0 else 0.0)
        stream.append(p["stream_s"] / p["none_s"])
        spin.append(p["spin_s"] / p["none_s"])
    phi_a, measured = np.array(phi), np.log(np.concatenate([stream, spin]))

    def ratios(x: np.ndarray) -> np.ndarray:
        s, c = x
        rest = (1 - phi_a) / c
        return np.concatenate([phi_a / s + rest, phi_a + rest])

    fit = least_squares(lambda x: np.log(ratios(x)) - measured, x0=[0.6, 0.95],
                        bounds=([0.05, 0.05], [1.0, 1.0]))
    s, c = (float(v) for v in fit.x)
    pred = ratios(fit.x)
    obs = np.exp(measured)
    n = len(pts)
    return {"memory_share": s, "compute_share": c, "num_points": n,
            "mape": float(np.mean(np.abs(pred / obs - 1))),
            "points": [{"kind": p.get("kind"), "tokens": p["shape"].get("num_tokens"),
                        "memory_fraction": float(phi_a[i]),
                        "stream_ratio": float(obs[i]), "stream_fit": float(pred[i]),
                        "spin_ratio": float(obs[n + i]), "spin_fit": float(pred[n + i])}
                       for i, p in enumerate(pts)]}


def host_shares(extra: dict[str, Any]) -> tuple[float | None, float | None]:
    """(memory share, compute share) of two engines on this host from a calibration's
    `extra`: the fitted `host_sharing`, else the memory share of two plain streams
    (`device_facts.mem_bw_share`) and no compute share; None where unknown. Capped at 1."""
    fitted = extra.get("host_sharing") or {}
    memory = fitted.get("memory_share") or (extra.get("device_facts") or {}).get("mem_bw_share")
    compute = fitted.get("compute_share")
    return (min(1.0, float(memory)) if memory else None,
            min(1.0, float(compute)) if compute else None)
