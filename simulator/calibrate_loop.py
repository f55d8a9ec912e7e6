"""The serving loop's host cost (`loop_overhead_s`, `kv_handoff_s` in `CostParams`), measured
from the profile's serving probe (`meta.serving_probe.loop`, written by
realexec/profile_serving.py from the workers' step logs).

A serving worker spends host time between its engine steps that no profiled step contains:
polling for requests, pushing each step's tokens to the front end and, on a PD prefill worker,
handing every finished prompt's KV to the transport. The workers log it per step ("l" in
`realexec.step_log`: seconds worked since the previous step ended, waits for input excluded)
with the hand-offs of each step ("h"). Here:

- `loop_overhead_s` = the median loop time before a step that follows a step without
  hand-offs, over every role;
- `kv_handoff_s` = the median, over prefill-worker steps that follow a step with hand-offs,
  of (loop time - `loop_overhead_s`) / hand-offs of that step (>= 0).

Measured on this 2-core CPU (llama-50m, run 14's real runs, from the gaps between their
steps): 0.21-0.35 ms per step and ~0.85 ms per hand-off. Medians, because a loop iteration
now and then also carries a heartbeat or a burst of arrivals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

MIN_LOOP_STEPS = 20  # loop times; fewer measure a few iterations' luck
MIN_HANDOFF_STEPS = 5  # prefill steps after a hand-off


def encode_loop(steps: Sequence) -> list[list[float]]:
    """Per step (as `calibrate_serving.encode_steps` keeps them: those with requests), [loop
    seconds before it (-1: not measured), hand-offs]."""
    return [[-1.0 if s.loop_s is None else float(s.loop_s), int(s.handoffs)]
            for s in steps if s.shape.num_reqs]


def _pairs(rows: Any, role: str) -> list[tuple[float, int]]:
    """(loop s before step i, hand-offs of step i - 1) for every measured step i >= 1."""
    if not isinstance(rows, list):
        raise ValueError(f"serving probe loop: {role} must be a list of [loop_s, handoffs] rows")
    out = []
    prev = 0
    for i, row in enumerate(rows):
        if (not isinstance(row, list) or len(row) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row)):
            raise ValueError(f"serving probe loop: {role} row {i} must be [loop_s, handoffs], "
                             f"got {row!r}")
        loop_s, handoffs = float(row[0]), int(row[1])
        if i and loop_s >= 0 and np.isfinite(loop_s):
            out.append((loop_s, prev))
        prev = handoffs
    return out


def fit_loop(probe: dict[str, Any]) -> dict[str, Any]:
    """{"loop_overhead_s": s, "kv_handoff_s": s (when the probe had PD hand-offs),
    "num_steps": {"loop": n, "handoff": n}, "errors": {term: why}} from the probe's `loop`
    rows; {"error": why} when it has none (a profile from before the loop was logged)."""
    loop = probe.get("loop")
    if not loop:
        return {"error": "the serving probe has no loop times (profile again to measure them)"}
    if not isinstance(loop, dict):
        raise ValueError("serving probe loop: must map roles to rows")
    pairs = {role: _pairs(rows, role) for role, rows in loop.items()}
    plain = [s for rows in pairs.values() for s, h in rows if h == 0]
    after = [(s, h) for s, h in pairs.get("prefill", []) if h > 0]
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
        out["kv_handoff_s"] = max(0.0, float(np.median([(s - base) / h for s, h in after])))
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
        parts.append(f"{fit['kv_handoff_s'] * 1e3:.3f} ms per KV hand-off "
                     f"({n.get('handoff', 0)} steps)")
    text = "serving loop (host time between steps): " + (", ".join(parts) or "none")
    if fit.get("errors"):
        text += "; not measured: " + "; ".join(f"{k}: {v}" for k, v in fit["errors"].items())
    return text


def loop_params(fit: dict[str, Any]) -> dict[str, float]:
    """The `CostParams` fields a fit measured."""
    return {k: float(fit[k]) for k in ("loop_overhead_s", "kv_handoff_s") if k in fit}
