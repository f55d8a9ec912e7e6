"""The serving loop's host cost (`CostParams` `LOOP_FIELDS`: `loop_overhead_s`,
`kv_handoff_step_s`, `kv_handoff_s`, `kv_handoff_token_s`), measured from the profile's
serving probe (`meta.serving_probe.loop`, written by realexec/profile_serving.py from the
workers' step logs).

A serving worker spends host time between its engine steps that no profiled step contains:
polling for requests, pushing each step's tokens to the front end and, on a PD prefill worker,
handing every finished prompt's KV to the transport (usually gathered into one frame first, a
copy that grows with the prompt; `realexec.pd_kv`). The workers log it per step ("l" in
`realexec.step_log`: the loop work that step waited on, `realexec.engine_proc.LoopClock`)
with each step's hand-offs and their prompt tokens ("h", "ht"). Here:

- `loop_overhead_s` = the median loop time before a step that follows a step without
  hand-offs, over every role;
- `kv_handoff_step_s`, `kv_handoff_s`, `kv_handoff_token_s`: the loop time after a
  prefill-worker step with hand-offs, less `loop_overhead_s`, fitted as once per such step +
  per hand-off + per prompt token (robust least squares, all >= 0), because a loop iteration
  now and then also carries a heartbeat or a burst of arrivals.

Run 16's real prefill worker (llama-50m, this 2-core CPU), steps that went straight on:
1.53, 2.30, 2.31 and 2.35 ms after a step that handed off 1, 2, 3 and 4 prompts, far more
than the loop's 0.27-0.41 ms without hand-offs (`bench/loop_times.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from simulator.costparams import LOOP_FIELDS

MIN_LOOP_STEPS = 20  # loop times; fewer measure a few iterations' luck
MIN_HANDOFF_STEPS = 5  # prefill steps after a hand-off


def encode_loop(steps: Sequence) -> list[list[float]]:
    """Per step (as `calibrate_serving.encode_steps` keeps them: those with requests), [loop
    seconds before it (-1: not measured), hand-offs, their prompt tokens]."""
    return [[-1.0 if s.loop_s is None else float(s.loop_s), int(s.handoffs),
             int(s.handoff_tokens)] for s in steps if s.shape.num_reqs]


def _pairs(rows: Any, role: str) -> list[tuple[float, int, int]]:
    """(loop s before step i, hand-offs and their tokens of step i - 1) for every measured
    step i >= 1."""
    if not isinstance(rows, list):
        raise ValueError(f"serving probe loop: {role} must be a list of [loop_s, handoffs, "
                         "handoff_tokens] rows")
    out = []
    prev = (0, 0)
    for i, row in enumerate(rows):
        if (not isinstance(row, list) or len(row) != 3
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row)):
            raise ValueError(f"serving probe loop: {role} row {i} must be [loop_s, handoffs, "
                             f"handoff_tokens], got {row!r}")
        loop_s = float(row[0])
        if i and loop_s >= 0 and np.isfinite(loop_s):
            out.append((loop_s, *prev))
        prev = (int(row[1]), int(row[2]))
    return out


def fit_handoff(loop_s: np.ndarray, handoffs: np.ndarray, tokens: np.ndarray,
                base_s: float) -> tuple[float, float, float]:
    """(s per step, s per hand-off, s per prompt token) from the loop times after steps with
    hand-offs, less `base_s`; robust (Cauchy) least squares, all terms >= 0."""
    y = loop_s - base_s
    x = np.column_stack([np.ones_like(handoffs), handoffs, tokens]).astype(float)
    scale = max(float(np.median(np.abs(y))), 1e-6)
    start = max(float(np.median(y / handoffs)), 0.0)
    res = least_squares(lambda p: (x @ p - y) / scale, x0=[0.0, start, 0.0],
                        bounds=([0.0] * 3, [np.inf] * 3), loss="cauchy", f_scale=0.2)
    return float(res.x[0]), float(res.x[1]), float(res.x[2])


def fit_loop(probe: dict[str, Any]) -> dict[str, Any]:
    """{"loop_overhead_s": s, "kv_handoff_step_s", "kv_handoff_s", "kv_handoff_token_s": s
    (the last three when the probe had PD hand-offs), "num_steps": {"loop": n, "handoff": n},
    "errors": {term: why}} from the probe's `loop` rows; {"error": why} when it has none (a
    profile from before the loop was logged)."""
    loop = probe.get("loop")
    if not loop:
        return {"error": "the serving probe has no loop times (profile again to measure them)"}
    if not isinstance(loop, dict):
        raise ValueError("serving probe loop: must map roles to rows")
    pairs = {role: _pairs(rows, role) for role, rows in loop.items()}
    plain = [s for rows in pairs.values() for s, h, _ in rows if h == 0]
    after = np.array([p for p in pairs.get("prefill", []) if p[1] > 0], dtype=float).reshape(-1, 3)
    out: dict[str, Any] = {"num_steps": {"loop": len(plain), "handoff": len(after)}, "errors": {}}
    if len(plain) < MIN_LOOP_STEPS:
        out["errors"]["loop_overhead_s"] = f"{len(plain)} loop time(s), need >= {MIN_LOOP_STEPS}"
        return out
    base = float(np.median(plain))
    out["loop_overhead_s"] = base
    if len(after) < MIN_HANDOFF_STEPS:
        out["errors"]["kv_handoff_s"] = (f"{len(after)} prefill step(s) after a hand-off, need "
                                         f">= {MIN_HANDOFF_STEPS}")
    else:
        out["kv_handoff_step_s"], out["kv_handoff_s"], out["kv_handoff_token_s"] = fit_handoff(
            after[:, 0], after[:, 1], after[:, 2], base)
    return out


def format_loop(fit: dict[str, Any]) -> str:
    """One report line: the measured terms and what could not be measured."""
    if "error" in fit:
        return f"serving loop: not measured ({fit['error']})"
    n = fit.get("num_steps") or {}
    parts = []
    if "loop_overhead_s" in fit:
        parts.append(f"{fit['loop_overhead_s'] * 1e3:.3f} ms per step ({n.get('loop', 0)} steps)")
    if "kv_handoff_s" in fit:
        parts.append(f"KV hand-off {fit['kv_handoff_step_s'] * 1e3:.3f} ms per step + "
                     f"{fit['kv_handoff_s'] * 1e3:.3f} ms per request + "
                     f"{fit['kv_handoff_token_s'] * 1e6:.2f} us per prompt token "
                     f"({n.get('handoff', 0)} steps)")
    text = "serving loop (host time between steps): " + (", ".join(parts) or "none")
    if fit.get("errors"):
        text += "; not measured: " + "; ".join(f"{k}: {v}" for k, v in fit["errors"].items())
    return text


def loop_params(fit: dict[str, Any]) -> dict[str, float]:
    """The `CostParams` fields a fit measured."""
    return {k: float(fit[k]) for k in LOOP_FIELDS if k in fit}
