"""Serving speed: a calibration measures how fast real engines ran their steps while serving
(the profile's serving probe), and `kvpd validate` simulates each engine at that speed."""

import pytest

from realexec.fidelity.validate.plan import RunKnobs, scenario_dict
from simulator.calibrate.serving_speed import (
    MIN_STEPS,
    STEP_SHAPE_FIELDS,
    encode_steps,
    fit_serving_speed,
    format_serving_speed,
)
from simulator.calibrate.step_pricing import TimedStep
from simulator.cluster.cluster import resolve_hardware
from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_accelerator
from simulator.cost.models import ModelSpec
from simulator.cost.params import CostParams
from simulator.scenario import scenario_from_dict
from tests.sim_helpers import TINY_HF_CONFIG

CFG = TINY_HF_CONFIG
PARAMS = CostParams(step_overhead_s=2e-3, layer_overhead_s=3e-5, token_overhead_s=1e-6,
                    device="cpu", model="m")


def cost_model(params: CostParams = PARAMS) -> CostModel:
    return CostModel(ModelSpec.from_hf_config(CFG, name="m"), get_accelerator("cpu"), "fp32",
                     params=params)


def steps_at(speed: float, shapes, t0: float = 0.0, gap_s: float = 1.0) -> list[TimedStep]:
    """Steps of `shapes` that took 1 / speed of the cost model's time, `gap_s` apart."""
    cm, out, t = cost_model(), [], t0
    for shape in shapes:
        d = cm.step_time(shape) / speed
        out.append(TimedStep(t, d, shape))
        t += d + gap_s
    return out


def probe_of(steps_by_role) -> dict:
    return {"shape_fields": list(STEP_SHAPE_FIELDS),
            "steps": {r: encode_steps(s) for r, s in steps_by_role.items()}}


DECODES = [BatchShape.from_lists([1] * (1 + i % 5), [40 + i] * (1 + i % 5)) for i in range(MIN_STEPS)]
PROMPTS = [BatchShape.from_lists([16 + 8 * i], [0]) for i in range(MIN_STEPS)]


def test_each_role_gets_the_speed_its_steps_ran_at():
    # the PD workers' steps never overlap here (one after the other), so host sharing
    # changes nothing and the factors are exact
    probe = probe_of({"colocated": steps_at(0.9, DECODES + PROMPTS),
                      "prefill": steps_at(0.8, PROMPTS, t0=0.0),
                      "decode": steps_at(1.05, DECODES, t0=1e4)})
    got = fit_serving_speed(probe, cost_model(), memory_share=0.7, compute_share=0.9)
    assert got["colocated"] == pytest.approx(0.9, rel=1e-9)
    assert got["prefill"] == pytest.approx(0.8, rel=1e-9)
    assert got["decode"] == pytest.approx(1.05, rel=1e-9)
    assert got["num_steps"] == {"colocated": 2 * MIN_STEPS, "prefill": MIN_STEPS, "decode": MIN_STEPS}
    assert not got["errors"]
    assert "prefill 0.800 (20 steps)" in format_serving_speed(got)


def test_overlapping_pd_steps_are_priced_with_host_sharing():
    """A prefill step that ran beside a decode step is priced slower (as the simulator
    prices it), so the same measured time reads as a faster engine than plain pricing."""
    prefill = steps_at(1.0, PROMPTS, gap_s=0.5)
    decode = [TimedStep(s.t_start, s.duration_s, DECODES[0]) for s in prefill]  # beside each
    probe = probe_of({"prefill": prefill, "decode": decode})
    alone = fit_serving_speed(probe, cost_model())
    shared = fit_serving_speed(probe, cost_model(), memory_share=0.5, compute_share=0.8)
    assert alone["prefill"] == pytest.approx(1.0, rel=1e-9)
    assert shared["prefill"] > 1.05


def test_too_few_steps_or_one_pd_worker_missing_measure_nothing_for_that_role():
    probe = probe_of({"colocated": steps_at(0.9, DECODES[:5]), "prefill": steps_at(0.8, PROMPTS)})
    probe["errors"] = {"pd": "RuntimeError: decode worker died"}
    got = fit_serving_speed(probe, cost_model())
    assert "colocated" not in got and "prefill" not in got and "decode" not in got
    assert got["errors"]["colocated"] == f"5 step(s), need >= {MIN_STEPS}"
    assert got["errors"]["pd"] == "RuntimeError: decode worker died"
    text = format_serving_speed(got)
    assert "none; not measured: pd: RuntimeError" in text


def test_malformed_probe_names_what_is_wrong():
    good = probe_of({"colocated": steps_at(1.0, DECODES)})
    with pytest.raises(ValueError, match="unknown role 'engine'"):
        fit_serving_speed({**good, "steps": {"engine": []}}, cost_model())
    bad = {**good, "steps": {"colocated": [[0.0, 0.01, 1]]}}
    with pytest.raises(ValueError, match="colocated step 0 must be"):
        fit_serving_speed(bad, cost_model())
    with pytest.raises(ValueError, match="shape_fields must list BatchShape fields"):
        fit_serving_speed({**good, "shape_fields": ["num_reqs", "batch"]}, cost_model())


def _step_time(sc: dict, role: str | None, shape: BatchShape) -> float:
    parsed = scenario_from_dict(sc)
    spec = sc["hardware"] if role is None else sc["cluster"]["pd"][role]["hardware"]
    acc, params = resolve_hardware(spec, parsed, role or "colocated")
    return CostModel(ModelSpec.from_hf_config(CFG, name="m"), acc, "fp32", params=params).step_time(shape)


def test_validate_simulates_each_engine_at_the_calibrated_speed(tmp_path):
    """The profile's serving speed is not a speed refresh of `kvpd validate` (its one is the
    serving probes around each real run): its scenarios run the calibrated device as is."""
    params = CostParams(**{**PARAMS.__dict__, "extra": {}})
    params.extra["links"] = {"kv_transfer": {"name": "zmq", "bandwidth_gb_s": 1.5, "latency_us": 200.0}}
    cal = tmp_path / "cal.yaml"
    params.extra["serving_speed"] = {"colocated": 0.9, "prefill": 0.8, "decode": 0.95}
    params.save(str(cal))
    params.extra["hardware"] = {"calibration": str(cal)}
    shape = BatchShape.from_lists([1, 1, 30], [50, 60, 0])
    base = cost_model(params).step_time(shape)
    args = (CFG, "fp32", cal, params, RunKnobs())
    colo = scenario_dict(*args, "colocated", tmp_path / "a.csv")
    assert "serving_speed" not in colo["hardware"]
    assert _step_time(colo, None, shape) == pytest.approx(base, rel=1e-9)
    pd = scenario_dict(*args, "pd", tmp_path / "b.csv")
    for role in ("prefill", "decode"):
        pd["cluster"]["pd"][role] = {"hardware": pd["hardware"]}
        assert _step_time(pd, role, shape) == pytest.approx(base, rel=1e-9)


def _pools(sc: dict, tmp_path) -> dict[str, float]:
    """Step time (s) of one mixed batch on each pool of scenario `sc` as `kvpd simulate`
    plans it."""
    from simulator.cluster.cluster import plan_pool
    from simulator.scenario import PoolSpec

    parsed = scenario_from_dict(sc)
    model = ModelSpec.from_hf_config(CFG, name="m")
    shape = BatchShape.from_lists([1, 1, 30], [50, 60, 0])
    c = parsed.cluster
    pools = ({"colocated": PoolSpec()} if c.pd is None
             else {"prefill": c.pd.prefill, "decode": c.pd.decode})
    return {role: plan_pool(parsed, model, spec, role).cost_model.step_time(shape)
            for role, spec in pools.items()}


def test_simulate_runs_each_pool_at_its_roles_serving_speed(tmp_path):
    params = CostParams(**{**PARAMS.__dict__, "extra": {
        "serving_speed": {"colocated": 0.9, "prefill": 0.8, "decode": 1.1}}})
    cal = tmp_path / "cal.yaml"
    params.save(str(cal))
    base = {"model": CFG, "dtype": "fp32", "hardware": {"calibration": str(cal)},
            "cache": {"num_gpu_blocks": 64}, "workload": {"synthetic": {"num_requests": 4}}}
    plain = _pools(base, tmp_path)["colocated"]
    fast = dict(base, hardware={"calibration": str(cal), "serving_speed": True})
    assert _pools(fast, tmp_path)["colocated"] == pytest.approx(plain / 0.9, rel=1e-9)
    pd = dict(fast, cluster={"pd": {"link": "ib-ndr"}})
    got = _pools(pd, tmp_path)
    assert got["prefill"] == pytest.approx(plain / 0.8, rel=1e-9)
    assert got["decode"] == pytest.approx(plain / 1.1, rel=1e-9)
    off = dict(base, hardware={"calibration": str(cal), "serving_speed": False})
    assert _pools(off, tmp_path)["colocated"] == pytest.approx(plain, rel=1e-9)


def test_serving_speed_that_cannot_apply_is_refused_naming_why(tmp_path):
    cal = tmp_path / "cal.yaml"
    params = CostParams(**{**PARAMS.__dict__, "extra": {
        "serving_speed": {"colocated": 0.9, "errors": {"prefill": "3 step(s), need >= 20"}}}})
    params.save(str(cal))
    base = {"model": CFG, "dtype": "fp32", "cache": {"num_gpu_blocks": 64},
            "workload": {"synthetic": {"num_requests": 4}}}
    with pytest.raises(ValueError, match="no serving speed for the prefill role "
                                         r"\(3 step\(s\), need >= 20\); measured: \['colocated'\]"):
        _pools(dict(base, hardware={"calibration": str(cal), "serving_speed": True},
                    cluster={"pd": {"link": "ib-ndr"}}), tmp_path)
    with pytest.raises(ValueError, match="serving_speed needs hardware.calibration"):
        _pools(dict(base, hardware={"base": "cpu", "serving_speed": True}), tmp_path)
    with pytest.raises(ValueError, match="serving_speed must be true or false, got 'yes'"):
        _pools(dict(base, hardware={"calibration": str(cal), "serving_speed": "yes"}), tmp_path)
    bare = tmp_path / "bare.yaml"
    CostParams(**{**PARAMS.__dict__, "extra": {}}).save(str(bare))
    with pytest.raises(ValueError, match="has no serving speed .*kvpd profile --serving-requests"):
        _pools(dict(base, hardware={"calibration": str(bare), "serving_speed": True}), tmp_path)
