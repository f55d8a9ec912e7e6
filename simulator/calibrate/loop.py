"""The serving loop's host cost (`CostParams` `LOOP_FIELDS`: `loop_overhead_s`,
`kv_handoff_step_s`, `kv_handoff_s`, `kv_handoff_token_s`, `kv_land_s`, `kv_land_token_s`),
measured from the profile's serving probe (`meta.serving_probe.loop`, written by
realexec/fidelity/profile/serving_probe.py from the workers' step logs).

A serving worker spends host time between its engine steps that no profiled step contains:
polling for requests, pushing each step's tokens to the front end, on a PD prefill worker
handing every finished prompt's KV to the transport (usually gathered into one frame first, a
copy that grows with the prompt; `realexec.serving.pd.kv_wire`) and on a PD decode worker writing received
KV into its pool (`realexec.serving.pd.decode`). The workers log it per step ("l" in
`realexec.serving.step_log`: the loop work that step waited on, `realexec.serving.engine_proc.LoopClock`)
with each step's hand-offs and their prompt tokens ("h", "ht") and the landings the loop
before it wrote ("k", "kt"). Here:

- `loop_overhead_s` = the median loop time before a step that follows a step without
  hand-offs and had no landing before it, over every role;
- `kv_handoff_step_s`, `kv_handoff_s`, `kv_handoff_token_s`: the loop time after a
  prefill-worker step with hand-offs, less `loop_overhead_s`, fitted as once per such step +
  per hand-off + per prompt token (robust least squares, all >= 0), because a loop iteration
  now and then also carries a heartbeat or a burst of arrivals;
- `kv_land_s`, `kv_land_token_s`: the loop time before a decode-worker step with landings,
  less `loop_overhead_s`, fitted as per landing + per token written (the same way).

Run 16's real prefill worker (llama-50m, this 2-core CPU), steps that went straight on:
1.53, 2.30, 2.31 and 2.35 ms after a step that handed off 1, 2, 3 and 4 prompts, far more
than the loop's 0.27-0.41 ms without hand-offs (`bench/diagnostics/loop_times.py`). A landing costs
0.26-2.2 ms for prompts of 64-1024 tokens (`bench/kv_handoff.py`, decode-side write).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from simulator.cost.params import LOOP_FIELDS

MIN_LOOP_STEPS = 20  # loop times; fewer measure a few iterations' luck
MIN_HANDOFF_STEPS = 5  # prefill steps after a hand-off
MIN_LAND_STEPS = 5  # decode steps after a landing
ROW_LEN = 5  # [loop_s, handoffs, handoff_tokens, landings, landing_tokens]


def encode_loop(steps: Sequence) -> list[list[float]]:
    """Per step (as `calibrate_serving.encode_steps` keeps them: those with requests), [loop
    seconds before it (-1: not measured), hand-offs, their prompt tokens, landings before it,
    tokens they wrote]."""
    return [[-1.0 if s.loop_s is None else float(s.loop_s), int(s.handoffs),
             int(s.handoff_tokens), int(s.landings), int(s.landing_tokens)]
            for s in steps if s.shape.num_reqs]


def _pairs(rows: Any, role: str) -> list[tuple[float, int, int, int, int]]:
    """(loop s before step i, hand-offs and their tokens of step i - 1, landings and their
    tokens before step i) for every measured step i >= 1. Rows of 3 (profiles from before
    landings were logged) read as without landings."""
    if not isinstance(rows, list):
        raise ValueError(f"serving probe loop: {role} must be a list of [loop_s, handoffs, "
                         "handoff_tokens, landings, landing_tokens] rows")
    out = []
    prev = (0, 0)
    for i, row in enumerate(rows):
        if (not isinstance(row, list) or len(row) not in (3, ROW_LEN)
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row)):
            raise ValueError(f"serving probe loop: {role} row {i} must be [loop_s, handoffs, "
                             f"handoff_tokens, landings, landing_tokens], got {row!r}")
        loop_s = float(row[0])
        land = (int(row[3]), int(row[4])) if len(row) == ROW_LEN else (0, 0)
        if i and loop_s >= 0 and np.isfinite(loop_s):
            out.append((loop_s, *prev, *land))
        prev = (int(row[1]), int(row[2]))
    return out


def _robust_fit(x: np.ndarray, y: np.ndarray, start: list[float]) -> np.ndarray:
    """Robust (Cauchy) least squares of y ~ x @ p, all p >= 0."""
    scale = max(float(np.median(np.abs(y))), 1e-6)
    res = least_squares(lambda p: (x @ p - y) / scale, x0=start,
                        bounds=([0.0] * x.shape[1], [np.inf] * x.shape[1]), loss="cauchy",
                        f_scale=0.2)
    return res.x


def fit_handoff(loop_s: np.ndarray, handoffs: np.ndarray, tokens: np.ndarray,
                base_s: float) -> tuple[float, float, float]:
    """(s per step, s per hand-off, s per prompt token) from the loop times after steps with
    hand-offs, less `base_s`; robust least squares, all terms >= 0."""
    y = loop_s - base_s
    x = np.column_stack([np.ones_like(handoffs), handoffs, tokens]).astype(float)
    p = _robust_fit(x, y, [0.0, max(float(np.median(y / handoffs)), 0.0), 0.0])
    return float(p[0]), float(p[1]), float(p[2])


def fit_landing(loop_s: np.ndarray, landings: np.ndarray, tokens: np.ndarray,
                base_s: float) -> tuple[float, float]:
    """(s per landing, s per token written) from the loop times before steps with landings,
    less `base_s`; robust least squares, both >= 0."""
    y = loop_s - base_s
    x = np.column_stack([landings, tokens]).astype(float)
    p = _robust_fit(x, y, [max(float(np.median(y / landings)), 0.0), 0.0])
    return float(p[0]), float(p[1])


def fit_loop(probe: dict[str, Any]) -> dict[str, Any]:
    """{"loop_overhead_s": s, "kv_handoff_step_s", "kv_handoff_s", "kv_handoff_token_s": s
    (when the probe had PD hand-offs), "kv_land_s", "kv_land_token_s": s (when it had
    landings), "num_steps": {"loop": n, "handoff": n, "land": n}, "errors": {term: why}} from
    the probe's `loop` rows; {"error": why} when it has none (a profile from before the loop
    was logged)."""
    loop = probe.get("loop")
    if not loop:
        return {"error": "the serving probe has no loop times (profile again to measure them)"}
    if not isinstance(loop, dict):
        raise ValueError("serving probe loop: must map roles to rows")
    pairs = {role: _pairs(rows, role) for role, rows in loop.items()}
    plain = [r[0] for rows in pairs.values() for r in rows if r[1] == 0 and r[3] == 0]
    after = np.array([r[:3] for r in pairs.get("prefill", []) if r[1] > 0 and r[3] == 0],
                     dtype=float).reshape(-1, 3)
    landed = np.array([(r[0], r[3], r[4]) for r in pairs.get("decode", []) if r[3] > 0 and r[1] == 0],
                      dtype=float).reshape(-1, 3)
    out: dict[str, Any] = {"num_steps": {"loop": len(plain), "handoff": len(after),
                                         "land": len(landed)}, "errors": {}}
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
    decode_rows = loop.get("decode") or []
    if decode_rows and all(len(r) == 3 for r in decode_rows):
        out["errors"]["kv_land_s"] = "the probe did not log landings (profile again to measure them)"
    elif decode_rows:  # a PD probe whose decode worker logged its landings
        if len(landed) < MIN_LAND_STEPS:
            out["errors"]["kv_land_s"] = (f"{len(landed)} decode step(s) after a landing, need "
                                          f">= {MIN_LAND_STEPS}")
        else:
            out["kv_land_s"], out["kv_land_token_s"] = fit_landing(
                landed[:, 0], landed[:, 1], landed[:, 2], base)
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
    if "kv_land_s" in fit:
        parts.append(f"KV landing {fit['kv_land_s'] * 1e3:.3f} ms per request + "
                     f"{fit['kv_land_token_s'] * 1e6:.2f} us per token written "
                     f"({n.get('land', 0)} steps)")
    text = "serving loop (host time between steps): " + (", ".join(parts) or "none")
    if fit.get("errors"):
        text += "; not measured: " + "; ".join(f"{k}: {v}" for k, v in fit["errors"].items())
    return text


def loop_params(fit: dict[str, Any]) -> dict[str, float]:
    """The `CostParams` fields a fit measured."""
    return {k: float(fit[k]) for k in LOOP_FIELDS if k in fit}
