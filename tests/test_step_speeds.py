"""Two speeds (compute, memory) fitted from an engine's steps: `simulator.calibrate.step_speeds`."""

from __future__ import annotations

import numpy as np
import pytest

from realexec.engine.configs import builtin_config
from simulator.calibrate.calibrated import at_speed, at_speeds
from simulator.calibrate.step_pricing import TimedStep, step_errors
from simulator.calibrate.step_speeds import cost_model_at, fit_two_speeds, step_groups
from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.models import ModelSpec
from simulator.cost.params import CostParams


@pytest.fixture(scope="module")
def cm() -> CostModel:
    params = CostParams(gemm_compute_efficiency=0.3, gemm_memory_efficiency=0.6,
                        attn_compute_efficiency=0.2, attn_memory_efficiency=0.4,
                        step_overhead_s=2e-3, token_overhead_s=1e-5, device="cpu",
                        model="llama-50m")
    spec = ModelSpec.from_hf_config(builtin_config("llama-50m"), name="llama-50m")
    return CostModel(spec, "cpu", "fp32", params=params)


def serving_like_shapes(seed: int = 0) -> list[BatchShape]:
    """Prompt steps of many lengths, mixed steps and decode batches at many contexts."""
    rng = np.random.default_rng(seed)
    shapes = []
    for _ in range(40):
        shapes.append(BatchShape.from_lists([int(rng.integers(16, 512))], [0]))
    for _ in range(40):
        n = int(rng.integers(1, 16))
        shapes.append(BatchShape.from_lists([int(rng.integers(16, 256))] + [1] * n,
                                            [0] + rng.integers(16, 900, n).tolist()))
    for _ in range(120):
        n = int(rng.integers(1, 32))
        shapes.append(BatchShape.from_lists([1] * n, rng.integers(16, 1500, n).tolist()))
    return shapes


def timed(shapes: list[BatchShape], cm: CostModel, noise: float = 0.0, seed: int = 1):
    rng = np.random.default_rng(seed)
    return [TimedStep(float(i), cm.step_time(s) * (1 + noise * rng.standard_normal()), s)
            for i, s in enumerate(shapes)]


def test_at_speeds_scales_compute_and_memory_apart(cm):
    same = cost_model_at(cm, 0.8, 0.8)
    acc, params = at_speed(cm.accelerator, cm.params, 0.8)
    assert same.accelerator == acc and same.params == params
    acc, params = at_speeds(cm.accelerator, cm.params, 0.5, 2.0)
    assert acc.fp32_tflops == pytest.approx(cm.accelerator.fp32_tflops * 0.5)
    assert acc.mem_bw_bytes_per_s == pytest.approx(cm.accelerator.mem_bw_bytes_per_s * 2.0)
    assert params.step_overhead_s == pytest.approx(cm.params.step_overhead_s / 0.5)
    with pytest.raises(ValueError, match="memory speed factor must be > 0"):
        at_speeds(cm.accelerator, cm.params, 1.0, 0.0)


def test_the_groups_need_both_compute_and_memory(cm):
    """The premise: on this device prompt steps are compute-bound and decode steps mostly
    memory-bound, so the two speeds move the two groups differently."""
    groups = step_groups(timed(serving_like_shapes(), cm))
    slow_memory = cost_model_at(cm, 1.0, 0.5)
    ratio = {g: sum(slow_memory.step_time(s.shape) for s in ss) / sum(s.duration_s for s in ss)
             for g, ss in groups.items()}
    assert ratio["decode"] > 1.3 and ratio["prompt"] < ratio["decode"]


@pytest.mark.parametrize("compute,memory", [(1.0, 1.0), (0.9, 1.12), (1.15, 0.8), (0.7, 0.7)])
def test_known_speeds_come_back(cm, compute, memory):
    steps = timed(serving_like_shapes(), cost_model_at(cm, compute, memory))
    fit = fit_two_speeds(steps, cm)
    assert fit["compute"] == pytest.approx(compute, rel=1e-3)
    assert fit["memory"] == pytest.approx(memory, rel=1e-3)
    assert all(abs(g["error"]) < 1e-3 for g in fit["groups"].values())
    assert sum(g["num_steps"] for g in fit["groups"].values()) == len(steps)


def test_two_speeds_price_both_groups_where_one_factor_cannot(cm):
    steps = timed(serving_like_shapes(), cost_model_at(cm, 1.0, 1.15), noise=0.05)
    fit = fit_two_speeds(steps, cm)
    one = 1 + step_errors(steps, cm)["total"]  # the single speed factor
    single, two = cost_model_at(cm, one, one), cost_model_at(cm, fit["compute"], fit["memory"])
    for ss in step_groups(steps).values():
        real = sum(s.duration_s for s in ss)
        err_two = sum(two.step_time(s.shape) for s in ss) / real - 1
        err_one = sum(single.step_time(s.shape) for s in ss) / real - 1
        assert abs(err_two) < 0.01 and abs(err_two) < abs(err_one)


def test_an_engine_of_one_kind_of_step_has_no_second_speed(cm):
    shapes = serving_like_shapes()
    decodes = [s for s in shapes if s.num_prefill_reqs == 0]
    assert fit_two_speeds(timed(decodes, cm), cm) is None
    # a handful of prompt steps beside many decodes is not enough either
    assert fit_two_speeds(timed(decodes + shapes[:3], cm), cm) is None
    assert fit_two_speeds([], cm) is None


def test_a_probe_without_recorded_speeds_gets_them_from_the_step_logs(cm):
    from realexec.fidelity.validate.steps import with_probe_speeds

    probe_steps = timed(serving_like_shapes(), cost_model_at(cm, 0.9, 1.1))
    later = [TimedStep(s.t_start + 1000.0, s.duration_s * 3, s.shape) for s in probe_steps]
    logs = {"colocated": probe_steps + later}
    window = [0.0, probe_steps[-1].t_start]
    probes = {"serving": {"factors": {"engine": 1.0}, "window": window},
              "serving_after": {"factors": {"engine": 1.0}}}  # no window: left as it is
    got = with_probe_speeds(probes, logs, cm)
    speeds = got["serving"]["speeds"]["engine"]
    assert speeds["compute"] == pytest.approx(0.9, rel=1e-3)
    assert speeds["memory"] == pytest.approx(1.1, rel=1e-3)
    assert "speeds" not in got["serving_after"] and "speeds" not in probes["serving"]
    # recorded speeds are kept, and PD logs (no colocated engine) are left alone
    assert with_probe_speeds(got, {}, cm) == got
    assert with_probe_speeds(probes, {"prefill": [], "decode": []}, cm) == probes


def test_prompt_steps_after_idle_spells_do_not_read_as_a_slower_engine(cm):
    # every prompt-only step follows 1 s idle and pays the calibrated wake cost; with it in
    # the pricing the two speeds stay at the calibration's, without it compute reads slow
    import dataclasses

    woke = CostModel(cm.model, cm.accelerator, cm.dtype,
                     params=dataclasses.replace(cm.params, idle_wake_s=0.02, idle_wake_tau_s=0.25))
    steps, t = [], 0.0
    for shape in serving_like_shapes():
        gap = 1.0 if shape.num_prefill_reqs and not shape.num_decode_reqs else 3e-4
        t += gap
        d = cm.step_time(shape) + (woke.params.wake_extra_s(gap) if gap > 0.01 else 0.0)
        steps.append(TimedStep(t, d, shape))
        t += d
    fit = fit_two_speeds(steps, woke)
    assert fit["compute"] == pytest.approx(1.0, rel=5e-3)
    assert fit["memory"] == pytest.approx(1.0, rel=5e-3)
    assert fit_two_speeds(steps, cm)["compute"] < 0.95
