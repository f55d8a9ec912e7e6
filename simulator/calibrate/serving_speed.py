"""Serving speed (`serving_speed` in a calibration's extra): how fast a real engine ran its
steps while serving, relative to the calibrated cost model, from the profile's serving probe
(`meta.serving_probe`, written by realexec/fidelity/profile/serving_probe.py).

Per role, factor = the cost model's total over the probe's steps / their measured total
(< 1: serving steps ran slower than the grid's isolated ones): "colocated" from the colocated
engine's steps; "prefill" and "decode" from the 1P1D workers' steps, priced with the fitted
host sharing as the simulator prices them (`simulator.calibrate.step_pricing.pd_step_errors`).
`kvpd validate` simulates each engine's device at its role's factor
(`realexec.fidelity.validate.plan.scenario_dict`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from simulator.calibrate.profile_meta import PROBE_ROLES
from simulator.calibrate.step_pricing import TimedStep, pd_step_errors, priced_total, step_errors
from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel

ROLES = PROBE_ROLES
MIN_STEPS = 20  # per role: fewer measure one request's luck, not the engine's speed
# every BatchShape field (a profile row's SHAPE_FIELDS lack max_decode_context)
STEP_SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(BatchShape))


def encode_steps(steps) -> list[list[float]]:
    """Steps as rows [t_start (s, epoch), duration (s), *shape in STEP_SHAPE_FIELDS order]
    (compact JSON; what `decode_steps` reads back)."""
    return [[s.t_start, s.duration_s, *(getattr(s.shape, f) for f in STEP_SHAPE_FIELDS)]
            for s in steps if s.shape.num_reqs]


def decode_steps(probe: dict[str, Any]) -> dict[str, list[TimedStep]]:
    """The probe's steps by role; ValueError naming what is malformed."""
    fields = probe.get("shape_fields")
    if not isinstance(fields, list) or not set(fields) <= set(STEP_SHAPE_FIELDS):
        raise ValueError(f"serving probe: shape_fields must list BatchShape fields "
                         f"{list(STEP_SHAPE_FIELDS)}, got {fields!r}")
    out: dict[str, list[TimedStep]] = {}
    for role, rows in (probe.get("steps") or {}).items():
        if role not in ROLES:
            raise ValueError(f"serving probe: unknown role {role!r}; expected one of {list(ROLES)}")
        steps = []
        for i, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != 2 + len(fields):
                raise ValueError(f"serving probe: {role} step {i} must be [t_start, duration_s, "
                                 f"{', '.join(fields)}], got {row!r}")
            shape = BatchShape(**{f: int(v) for f, v in zip(fields, row[2:])})
            steps.append(TimedStep(float(row[0]), float(row[1]), shape))
        out[role] = steps
    return out


def fit_serving_speed(probe: dict[str, Any], cost_model: CostModel,
                      memory_share: float | None = None,
                      compute_share: float | None = None) -> dict[str, Any]:
    """{"colocated"/"prefill"/"decode": factor for each role the probe measured with at least
    `MIN_STEPS` steps, "num_steps": {role: n}, "errors": {role or mode: why}}. PD roles need
    both workers' steps (each is priced beside the other)."""
    steps = decode_steps(probe)
    out: dict[str, Any] = {"num_steps": {r: len(s) for r, s in steps.items()},
                           "errors": dict(probe.get("errors") or {})}
    for role, got in out["num_steps"].items():
        if got < MIN_STEPS:
            out["errors"][role] = f"{got} step(s), need >= {MIN_STEPS}"
    if out["num_steps"].get("colocated", 0) >= MIN_STEPS:
        e = step_errors(steps["colocated"], cost_model)
        if e is not None:
            out["colocated"] = 1.0 + e["total"]
    pd = {r: steps.get(r, []) for r in ("prefill", "decode")}
    if all(len(s) >= MIN_STEPS for s in pd.values()):
        by_role = pd_step_errors(pd, cost_model, memory_share, compute_share)
        for role in pd:
            if by_role.get(role):
                out[role] = 1.0 + priced_total(by_role[role])
    return out


def format_serving_speed(ss: dict[str, Any]) -> str:
    """One report line: each role's factor and step count, and what could not be measured."""
    if "error" in ss:
        return f"serving speed: not measured ({ss['error']})"
    n = ss.get("num_steps") or {}
    parts = [f"{r} {ss[r]:.3f} ({n.get(r, 0)} steps)" for r in ROLES if r in ss]
    errors = ss.get("errors") or {}
    text = "serving speed (the serving probe's steps, predicted / measured): " + (
        ", ".join(parts) if parts else "none")
    if errors:
        text += "; not measured: " + "; ".join(f"{k}: {v}" for k, v in errors.items())
    return text
