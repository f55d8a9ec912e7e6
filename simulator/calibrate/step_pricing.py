"""Pricing a real engine's logged steps with the calibrated cost model: how fast the engine
ran its steps relative to the calibration (`kvpd validate`, and `kvpd calibrate`'s serving
speed from the profile's serving probe).

A step is anything with `shape` (a `BatchShape`) and `duration_s` (s); PD workers' steps also
carry wall-clock starts (`t_start`, `t_end`, s), so a worker's steps can be priced as the
simulator prices them on a shared host (`simulator.cost.host_share`): while the other worker is
in a step (as logged), a step streams memory and computes at the shared rates.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from simulator.core.batch_shape import BatchShape
from simulator.cost.host_share import HostSharing


@dataclasses.dataclass(slots=True)
class TimedStep:
    """One step an engine ran: wall start (s, epoch), duration (s) and shape; for serving
    workers also the loop's host seconds before it (`loop_s`, None if not measured), the
    requests whose KV it handed off (`handoffs`) with their prompt tokens (`handoff_tokens`),
    and the received KV the loop wrote into the pool before it (`landings` requests,
    `landing_tokens` tokens; PD decode worker)."""

    t_start: float
    duration_s: float
    shape: BatchShape
    loop_s: float | None = None
    handoffs: int = 0
    handoff_tokens: int = 0
    landings: int = 0
    landing_tokens: int = 0

    @property
    def t_end(self) -> float:
        return self.t_start + self.duration_s


def _summary(pred: np.ndarray, real: np.ndarray) -> dict[str, Any]:
    return {"num_steps": int(real.size), "total": float(pred.sum() / real.sum() - 1),
            "median": float(np.median(pred / real - 1))}


def usable_steps(steps: Sequence) -> list:
    """The steps that computed tokens and took time (the ones a speed can be read from)."""
    return [s for s in steps if s.shape.num_tokens > 0 and s.duration_s > 0]


STEP_KINDS = ("prefill", "mixed", "decode 1-4", "decode 5-16", "decode 17+")  # report order


def step_kind(shape) -> str:
    """One of `STEP_KINDS`: "prefill" (no decodes), "mixed", or a decode-only step by the
    size of its batch."""
    n = shape.num_decode_reqs
    if n == 0:
        return "prefill"
    if shape.num_prefill_reqs:
        return "mixed"
    return "decode 1-4" if n <= 4 else "decode 5-16" if n <= 16 else "decode 17+"


def priced_total(role_entry: dict[str, Any]) -> float:
    """A `pd_step_errors` role's total error as the simulator prices its steps (with host
    sharing when the host is shared, else plain)."""
    return (role_entry.get("shared") or role_entry["plain"])["total"]


IDLE_GAP_S = 0.002  # a step that began this long after the last one ended followed idling


def wake_extras(steps: Sequence, params) -> dict[int, float]:
    """{id(step): seconds} the simulator adds to each step of `steps` that followed an idle
    spell (`CostParams.wake_extra_s` of the time since the previous step ended, when over
    `IDLE_GAP_S`; the first step's spell is unknown: none). Steps without wall-clock starts
    (`t_start`), or no wake cost: none."""
    if not params.idle_wake_s or not steps or not hasattr(steps[0], "t_start"):
        return {}
    out: dict[int, float] = {}
    prev_end = None
    for st in sorted(steps, key=lambda st: st.t_start):
        if prev_end is not None and st.t_start - prev_end > IDLE_GAP_S:
            out[id(st)] = params.wake_extra_s(st.t_start - prev_end)
        prev_end = st.t_end
    return out


def step_errors(steps: Sequence, cost_model) -> dict[str, Any] | None:
    """Total predicted / total measured - 1 (what sets throughput and latency) and the
    median per-step error, over all steps and `by_kind` (`step_kind`: one speed factor
    cannot correct an error that depends on the batch); None without steps. Steps after an
    idle spell carry the calibration's wake cost, as the simulator prices them."""
    steps = usable_steps(steps)
    if not steps:
        return None
    real = np.array([s.duration_s for s in steps])
    wake = wake_extras(steps, cost_model.params)
    pred = np.array([cost_model.step_time(s.shape) + wake.get(id(s), 0.0) for s in steps])
    kinds = np.array([step_kind(s.shape) for s in steps])
    by_kind = {k: _summary(pred[kinds == k], real[kinds == k]) for k in sorted(set(kinds))}
    return {**_summary(pred, real), "by_kind": by_kind}


def pd_step_errors(steps_by_role: dict[str, Sequence], cost_model, memory_share: float | None,
                   compute_share: float | None = None) -> dict[str, Any]:
    """Per worker role ("prefill", "decode"; steps with `t_start`), the cost model's error
    alone (`plain`) and priced with host sharing as the simulator does (`shared`, when a
    share is < 1: slower while the other worker is in a step, `HostSharing.finish_s` over
    its logged steps; `shared_at_start`: at the price when the step started, for the whole
    step), over all steps and split by whether the other worker was in a step when the step
    started (`overlapped`, `alone`). With 1P1D the other worker's steps never overlap."""
    s, c = memory_share or 1.0, compute_share or 1.0
    hs = HostSharing(cost_model, s, c) if s < 1 or c < 1 else None
    priced: dict[str, list[tuple[Any, float, float]]] = {}
    for role, steps in steps_by_role.items():
        rows = []
        usable = sorted(usable_steps(steps), key=lambda st: st.t_start)
        wake = wake_extras(usable, cost_model.params)  # host time: streams no memory
        for st in usable:
            base = cost_model.step_time(st.shape)
            mem = hs.memory_seconds(st.shape, base) if hs else 0.0
            rows.append((st, base + wake.get(id(st), 0.0), mem))
        priced[role] = rows
    out: dict[str, Any] = {}
    for role, rows in priced.items():
        if not rows:
            continue
        others = sorted((r for o, rr in priced.items() if o != role for r in rr),
                        key=lambda r: r[0].t_start)
        starts = [r[0].t_start for r in others]
        real = np.array([st.duration_s for st, _, _ in rows])
        plain = np.array([b for _, b, _ in rows])
        spans = [(o.t_start, o.t_end, nm / nb if nb > 0 else 0.0) for o, nb, nm in others]
        shared, at_start, overlapped = [], [], []
        for st, b, m in rows:
            i = bisect.bisect_right(starts, st.t_start) - 1
            busy = i >= 0 and spans[i][1] > st.t_start
            overlapped.append(busy)
            if hs is not None:
                at_start.append(hs.price(b, m, spans[i][2] if busy else None))
                shared.append(hs.finish_s(b, m, st.t_start,
                                          (spans[j] for j in range(max(i, 0), len(spans)))))
        shared_a, mask = np.array(shared), np.array(overlapped)
        entry: dict[str, Any] = {"plain": _summary(plain, real),
                                 "overlapped_fraction": float(mask.mean())}
        if hs is not None:
            entry["shared"] = _summary(shared_a, real)
            entry["shared_at_start"] = _summary(np.array(at_start), real)
        for name, m in (("overlapped", mask), ("alone", ~mask)):
            if m.any():
                entry[name] = {"plain": _summary(plain[m], real[m])}
                if hs is not None:
                    entry[name]["shared"] = _summary(shared_a[m], real[m])
        out[role] = entry
    return out


def factors_from_errors(step_error: dict[str, Any] | None,
                        by_role: dict[str, Any] | None) -> dict[str, float] | None:
    """Speed factors (the cost model's total / the measured total) from errors already
    computed: colocated (`by_role` None) {"engine": f} from `step_errors`; PD {"prefill": f,
    "decode": f} from `pd_step_errors`, as the simulator prices them. None when an engine
    ran no usable step."""
    if by_role is None:
        return None if step_error is None else {"engine": 1.0 + step_error["total"]}
    if not all(by_role.get(role) for role in ("prefill", "decode")):
        return None
    return {role: 1.0 + priced_total(by_role[role]) for role in ("prefill", "decode")}


def speed_factors(steps_by_role: dict[str, Sequence], cost_model,
                  cluster: dict[str, Any] | None = None) -> dict[str, float] | None:
    """How fast each engine ran its steps relative to the calibration (< 1: slower than
    calibrated; `factors_from_errors`). Colocated: role "colocated"; PD: "prefill" and
    "decode" roles (steps with `t_start`), priced with the `cluster`'s host sharing."""
    if set(steps_by_role) == {"colocated"}:
        return factors_from_errors(step_errors(steps_by_role["colocated"], cost_model), None)
    cluster = cluster or {}
    return factors_from_errors(None, pd_step_errors(
        steps_by_role, cost_model, cluster.get("host_memory_share"),
        cluster.get("host_compute_share")))
