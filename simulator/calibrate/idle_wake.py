"""`CostParams.idle_wake_s` and `idle_wake_tau_s` from the profile's idle-wake timings
(`device_facts.idle_wake`, realexec/fidelity/profile/idle_wake.py).

The first step after an idle spell of g seconds took longer than the same step run back to
back; the extra is fitted as a saturating wake-up cost, extra(g) = idle_wake_s x (1 - exp(-g /
idle_wake_tau_s)), by least squares over the measured gaps (for each tau of a log grid the
best idle_wake_s is linear; the pair with the smallest squared error wins). A wake cost under
`MIN_EXTRA_FRACTION` of the back-to-back step is no effect: both are 0 then.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

TAU_GRID_S = tuple(float(t) for t in np.geomspace(0.005, 5.0, 121))  # candidate tau (s)
MIN_EXTRA_FRACTION = 0.03  # of the back-to-back step: below this the wake cost is left at 0


def fit_idle_wake(measured: dict[str, Any]) -> dict[str, Any]:
    """{"idle_wake_s", "idle_wake_tau_s", "gaps_s", "extra_s", "fitted_s", "base_s"} from
    `measured` ({"gaps_s": [...], "median_s": [...]} with a gap of 0); ValueError when it
    cannot be fitted."""
    gaps = np.asarray(measured.get("gaps_s") or [], dtype=float)
    med = np.asarray(measured.get("median_s") or [], dtype=float)
    if gaps.size != med.size or gaps.size < 3 or not (gaps == 0).any():
        raise ValueError("idle wake: need >= 3 gaps including 0 with one median each, got "
                         f"gaps {gaps.tolist()} and {med.size} medians")
    if not np.all(np.isfinite(med)) or (med <= 0).any():
        raise ValueError(f"idle wake: step times must be > 0 s, got {med.tolist()}")
    base = float(med[gaps == 0].mean())
    pos = gaps > 0
    x, y = gaps[pos], med[pos] - base
    best = (math.inf, 0.0, 0.0)
    for tau in TAU_GRID_S:
        f = -np.expm1(-x / tau)
        a = max(0.0, float(f @ y) / float(f @ f))
        err = float(((a * f - y) ** 2).sum())
        if err < best[0]:
            best = (err, a, tau)
    _, a, tau = best
    if a < MIN_EXTRA_FRACTION * base:
        a, tau = 0.0, 0.0
    fitted = (a * -np.expm1(-x / tau)).tolist() if a else [0.0] * x.size
    return {"idle_wake_s": a, "idle_wake_tau_s": tau, "base_s": base,
            "gaps_s": x.tolist(), "extra_s": y.tolist(), "fitted_s": fitted}


def format_idle_wake(fit: dict[str, Any]) -> str:
    """One line for `kvpd calibrate`'s report."""
    if "error" in fit:
        return f"idle wake: not fitted ({fit['error']})"
    if not fit["idle_wake_s"]:
        return "idle wake: no effect measured"
    pairs = ", ".join(f"{g:g} s +{e * 1e3:.1f} ms" for g, e in zip(fit["gaps_s"], fit["extra_s"]))
    return (f"idle wake: +{fit['idle_wake_s'] * 1e3:.1f} ms x (1 - exp(-idle / "
            f"{fit['idle_wake_tau_s']:.3g} s)) on the first step after idle (measured {pairs})")
