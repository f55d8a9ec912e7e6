"""Two speeds for one engine, fitted from its logged steps: how fast it ran its compute and
how fast it streamed memory, relative to the calibrated cost model.

One speed factor (`step_pricing.speed_factors`) scales every step time alike. On a shared
host the two parts drift apart: in run 17 of `bench/validate_cpu.py` the colocated engine's
decode steps (memory-bound) ran 7-14% faster than priced while its prompt steps (compute-
bound) ran within -1..+4%, so one factor over-sped the prompts and under-sped the decodes.
Here the steps are split into those with a prompt (or prompt chunk) and decode-only ones,
and the device's compute peaks (with the fixed overheads: host work) and its memory
bandwidth are scaled apart (`simulator.calibrate.calibrated.at_speeds`) until the cost model's total
over each group equals its measured total. An engine whose steps are nearly all of one kind
(a PD worker) has no second speed to find: None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from simulator.calibrate.calibrated import at_speeds
from simulator.calibrate.step_pricing import usable_steps, wake_extras
from simulator.cost.costmodel import CostModel

Speed = float | dict[str, float]  # one factor, or {"compute": c, "memory": m}

# A group fits a speed only with enough steps and time behind it (steps, fraction of the
# measured total): a few prompt steps among hundreds of decodes say little of the compute.
MIN_GROUP_STEPS = 10
MIN_GROUP_SHARE = 0.1
SPEED_BOUNDS = (0.2, 5.0)  # x the calibration; beyond these the machine is not the same one


def compute_memory(speed: Speed) -> tuple[float, float]:
    """(compute, memory) factors of a `Speed`: one factor stands for both."""
    if isinstance(speed, dict):
        return float(speed["compute"]), float(speed["memory"])
    return float(speed), float(speed)


def cost_model_at(cm: CostModel, compute: float, memory: float) -> CostModel:
    """`cm` on its device with compute `compute` x and memory `memory` x as fast."""
    acc, params = at_speeds(cm.accelerator, cm.params, compute, memory)
    return CostModel(cm.model, acc, cm.dtype, cm.tp, cm.pp, params=params,
                     kv_cache_dtype=cm.kv_cache_dtype, link=cm.link,
                     quantization=cm.precision.quantization(), ep=cm.ep, ep_link=cm.ep_link,
                     allreduce=cm.allreduce, attention_backend=cm.attention_backend,
                     moe_a2a_backend=cm.moe_a2a_backend, fused_moe_config=cm.fused_moe_config)


def step_groups(steps: Sequence) -> dict[str, list]:
    """"prompt" (steps with a prompt or prompt chunk) and "decode" (decode-only) steps."""
    usable = usable_steps(steps)
    return {"prompt": [s for s in usable if s.shape.num_prefill_reqs > 0],
            "decode": [s for s in usable if s.shape.num_prefill_reqs == 0]}


def fit_two_speeds(steps: Sequence, cost_model: CostModel) -> dict[str, Any] | None:
    """{"compute": c, "memory": m, "groups": per group its steps, measured total (s) and
    error at the fitted speeds}: the speeds at which the cost model's total over each group
    equals the measured one. None when a group has fewer than `MIN_GROUP_STEPS` steps or
    under `MIN_GROUP_SHARE` of the measured time."""
    groups = step_groups(steps)
    real = {g: float(sum(s.duration_s for s in ss)) for g, ss in groups.items()}
    total = sum(real.values())
    if total <= 0 or any(len(ss) < MIN_GROUP_STEPS or real[g] < MIN_GROUP_SHARE * total
                         for g, ss in groups.items()):
        return None
    shapes = {g: [s.shape for s in ss] for g, ss in groups.items()}
    # steps after an idle spell carry the wake cost, as the simulator prices them (host
    # time: it scales with the compute speed, as every fixed overhead does)
    wake = wake_extras(usable_steps(steps), cost_model.params)
    woke = {g: sum(wake.get(id(s), 0.0) for s in ss) for g, ss in groups.items()}

    def priced(x: np.ndarray) -> dict[str, float]:
        c = float(np.exp(x[0]))
        cm = cost_model_at(cost_model, c, float(np.exp(x[1])))
        return {g: float(sum(cm.step_time(sh) for sh in shs)) + woke[g] / c
                for g, shs in shapes.items()}

    def residuals(x: np.ndarray) -> np.ndarray:
        p = priced(x)
        return np.array([np.log(real[g] / p[g]) for g in ("prompt", "decode")])

    # start from one factor for both (the cost model's total / the measured total)
    base = priced(np.zeros(2))
    x0 = np.full(2, np.log(sum(base.values()) / total))
    lo, hi = np.log(SPEED_BOUNDS)
    fit = least_squares(residuals, np.clip(x0, lo, hi), bounds=(lo, hi), x_scale=0.1)
    c, m = (float(v) for v in np.exp(fit.x))
    at = priced(fit.x)
    return {"compute": c, "memory": m,
            "groups": {g: {"num_steps": len(groups[g]), "measured_s": real[g],
                           "error": at[g] / real[g] - 1} for g in groups}}
