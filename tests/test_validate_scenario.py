"""The simulator scenario that mirrors a real validation run."""

from realexec.fidelity.validate.plan import RunKnobs, scenario_dict
from simulator.cost.params import CostParams
from simulator.scenario import scenario_from_dict
from tests.sim_helpers import TINY_HF_CONFIG


def test_pd_scenario_counts_the_first_token_at_hand_off_like_the_real_front_end(tmp_path):
    params = CostParams()
    params.extra["links"] = {"kv_transfer": {"name": "zmq-ipc", "bandwidth_gb_s": 1.5, "latency_us": 200.0}}
    cfg = TINY_HF_CONFIG
    knobs = RunKnobs(num_gpu_blocks=77)
    sc = scenario_dict(cfg, "fp32", tmp_path / "cal.yaml", params, knobs, "pd", tmp_path / "t.csv")
    assert sc["cluster"]["pd"]["first_token"] == "prefill"
    assert sc["cache"]["num_gpu_blocks"] == 77
    parsed = scenario_from_dict(sc)
    assert parsed.cluster.pd.first_token == "prefill"
    colo = scenario_dict(cfg, "fp32", tmp_path / "cal.yaml", params, knobs, "colocated", tmp_path / "t.csv")
    assert "cluster" not in colo


def test_pd_scenario_shares_the_host_memory_the_profile_measured(tmp_path):
    """The real 1P1D workers are two processes on one host: the simulated pools share its
    memory bandwidth at the share the profile measured (no measurement: separate devices)."""
    params = CostParams()
    params.extra["links"] = {"kv_transfer": {"name": "zmq-ipc", "bandwidth_gb_s": 1.5, "latency_us": 200.0}}
    cfg = TINY_HF_CONFIG
    args = (cfg, "fp32", tmp_path / "cal.yaml", params, RunKnobs())
    assert "host_memory_share" not in scenario_dict(*args, "pd", tmp_path / "t.csv")["cluster"]
    params.extra["device_facts"] = {"mem_bw_share": 0.63}
    sc = scenario_dict(*args, "pd", tmp_path / "t.csv")
    assert scenario_from_dict(sc).cluster.host_memory_share == 0.63
    assert "cluster" not in scenario_dict(*args, "colocated", tmp_path / "t.csv")
    # shares fitted from the profile's contended steps win over the two-stream measurement
    params.extra["host_sharing"] = {"memory_share": 0.41, "compute_share": 0.95}
    c = scenario_from_dict(scenario_dict(*args, "pd", tmp_path / "t.csv")).cluster
    assert (c.host_memory_share, c.host_compute_share) == (0.41, 0.95)
    # a fit that failed (too few points) falls back to the measurement
    params.extra["host_sharing"] = {"error": "too few"}
    c = scenario_from_dict(scenario_dict(*args, "pd", tmp_path / "t.csv")).cluster
    assert (c.host_memory_share, c.host_compute_share) == (0.63, None)


def test_an_in_process_engine_is_simulated_without_the_serving_loop(tmp_path):
    """`colocated_engine: inproc` drives an `LLM` in the validating process: no worker loop
    runs between its steps, so its scenario (and a re-scaled copy of it) drops the loop."""
    from realexec.fidelity.validate.plan import rescaled_scenario

    params = CostParams(loop_overhead_s=3e-4, device="cpu")
    args = (TINY_HF_CONFIG, "fp32", tmp_path / "cal.yaml", params, RunKnobs(), "colocated",
            tmp_path / "t.csv")
    assert "serving_loop" not in scenario_dict(*args)["hardware"]
    inproc = scenario_dict(*args, serving_loop=False)
    assert inproc["hardware"]["serving_loop"] is False
    faster = rescaled_scenario(params, inproc, {"engine": 1.1}, tmp_path / "r", "x")
    assert faster["hardware"]["serving_loop"] is False
    assert "serving_loop" not in rescaled_scenario(params, scenario_dict(*args), {"engine": 1.1},
                                                   tmp_path / "r", "y")["hardware"]


# ----------------------------------------------------------------------------- scenario files
def _cal(tmp_path):
    from tests.test_validate import tiny_calibration

    return CostParams.load(str(tiny_calibration(tmp_path / "cal.yaml")))


def _write(tmp_path, name="s.yaml", **changes):
    from tests.test_validate import write_scenario

    return write_scenario(tmp_path / name, **changes)


def test_a_scenario_becomes_a_case_with_its_own_knobs_and_requests(tmp_path):
    """Knobs, KV blocks, prefix caching and requests come from the scenario; model and dtype
    from the calibration when the scenario leaves them out; --modes adds the other mode."""
    import pytest

    from realexec.fidelity.validate.source import load_cases

    params = _cal(tmp_path)
    path = _write(tmp_path, cache={"num_gpu_blocks": 40, "enable_prefix_caching": True,
                                   "swap_space_gb": 0.001},
                  scheduler={"max_num_seqs": 5, "max_num_batched_tokens": 96,
                             "preemption_mode": "swap"})
    cases, config, name, dtype = load_cases([path], params)
    (case,) = cases
    assert (case.tag, name, dtype) == ("tiny-colocated", "tiny-llama", "fp32")
    k = case.knobs
    assert (k.max_num_seqs, k.max_num_batched_tokens, k.num_gpu_blocks) == (5, 96, 40)
    assert k.enable_prefix_caching and k.preemption_mode == "swap" and k.num_cpu_blocks > 0
    assert k.max_model_len == config["max_position_embeddings"] == 512
    assert len(case.base) == 60
    both, *_ = load_cases([path], params, modes=("colocated", "pd"))
    assert [c.tag for c in both] == ["tiny-colocated", "tiny-pd"]
    # --set overrides every scenario; the scenario's default block count fills in
    more, *_ = load_cases([path], params, overrides=["workload.synthetic.num_requests=9",
                                                     "cache.num_gpu_blocks=null"], num_gpu_blocks=33)
    assert len(more[0].base) == 9 and more[0].knobs.num_gpu_blocks == 33
    with pytest.raises(ValueError, match="share a name and mode"):
        load_cases([path, path], params)


def test_a_trace_with_prefix_hashes_keeps_them(tmp_path):
    """A Mooncake-format trace: its hash ids reach both backends (prefix caching)."""
    import json

    from realexec.fidelity.validate.source import load_cases

    rows = [{"timestamp": 100 * i, "input_length": 40, "output_length": 4,
             "hash_ids": [0, 1, 100 + i]} for i in range(6)]
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = _write(tmp_path, workload={"trace": "mooncake.jsonl", "scale_prompt": 0.5},
                  cache={"num_gpu_blocks": 40, "enable_prefix_caching": True})
    (case,), *_ = load_cases([path], _cal(tmp_path))
    assert case.base.hash_ids is not None and case.info["prefix_hashes"]
    assert (case.base.prompt_len == 20).all()


def _refused(tmp_path, match, name="bad.yaml", **changes):
    import pytest

    from realexec.fidelity.validate.source import ScenarioRefused, load_cases

    path = _write(tmp_path, name, **changes)
    with pytest.raises(ScenarioRefused, match=match):
        load_cases([path], _cal(tmp_path))


def test_scenarios_the_real_engine_cannot_run_are_refused_naming_the_key(tmp_path):
    _refused(tmp_path, r"bad.yaml: model: 'qwen2.5-7b' is a catalog model with no config the "
             "real engine can build", model="qwen2.5-7b")
    _refused(tmp_path, "model: 'tiny-qwen2', but the calibration is for 'tiny-llama'",
             model="tiny-qwen2")
    _refused(tmp_path, "hardware: 'h100-sxm' is not the calibrated device 'cpu'",
             hardware="h100-sxm")
    _refused(tmp_path, r"cluster.pd.decode.hardware: 'a100-80gb' is not the calibrated device",
             cluster={"pd": {"decode": {"hardware": "a100-80gb"}}})
    _refused(tmp_path, "dtype: 'bf16', but the calibration was profiled in 'fp32'", dtype="bf16")
    _refused(tmp_path, r"quantization: \{'method': 'fp8'\}: the real engine runs the "
             "calibration's unquantized fp32 weights", quantization={"method": "fp8"})
    _refused(tmp_path, "cache.kv_cache_dtype: 'fp8': the real engine keeps its KV cache in the "
             "model's fp32", cache={"kv_cache_dtype": "fp8"})
    _refused(tmp_path, "cluster.tp: 2: the real engine runs no tensor or pipeline parallelism",
             cluster={"tp": 2})
    _refused(tmp_path, "cluster.replicas: 2", cluster={"replicas": 2})
    _refused(tmp_path, "cluster.pd.prefill.replicas: 2", cluster={"pd": {"prefill": {"replicas": 2}}})
    _refused(tmp_path, "workload: 60 of 60 requests are longer .* than the model's context of "
             "512 tokens", workload={"synthetic": {
                 "num_requests": 60, "arrival": {"process": "poisson", "rate": 1.0},
                 "prompt_len": {"dist": "fixed", "value": 600},
                 "output_len": {"dist": "fixed", "value": 4}}})
    _refused(tmp_path, "cache.swap_space_gb: preemption_mode swap needs a host pool",
             scheduler={"preemption_mode": "swap"})
    _refused(tmp_path, "workload: .*missing.csv: expected an existing trace file", workload={"trace": "missing.csv"})
    # the calibrated device by name, or by a calibration of it, is fine
    from realexec.fidelity.validate.source import load_cases

    assert load_cases([_write(tmp_path, hardware="cpu")], _cal(tmp_path))[0]


def test_the_shipped_scenarios_fit_the_default_model(traces_dir):
    """`--traces azure,gamma` names two shipped scenario files; their requests fit llama-50m."""
    from realexec.fidelity.validate.source import TRACE_KINDS, load_cases, shipped

    params = CostParams(device="cpu", model="llama-50m", extra={"dtype": "fp32"})
    cases, *_ = load_cases([shipped(k) for k in TRACE_KINDS], params)
    assert [c.tag for c in cases] == ["azure-colocated", "gamma-colocated"]
    azure, gamma = (c.base for c in cases)
    assert (azure.prompt_len + azure.output_len).max() <= 2048 and azure.arrival_s.max() <= 180
    assert len(gamma) == 400


def test_a_warmup_is_refused_by_validate(tmp_path):
    from tests.test_validate import TINY_SCENARIO

    workload = dict(TINY_SCENARIO["workload"], warmup_requests=2)
    _refused(tmp_path, "workload.warmup_requests: 2: a validation measures every request",
             workload=workload)


def test_the_admission_and_batching_policies_reach_both_backends(tmp_path):
    """A validated scenario's `scheduler.capacity_policy` and `mixed_batches` (e.g. set by
    `engine: sglang`) go to the real engine's `LLM` and to the simulated mirror alike."""
    from realexec import LLM
    from realexec.fidelity.validate.source import _knobs

    sc = scenario_from_dict({"engine": {"name": "sglang"}, "model": "llama-3-8b",
                             "scheduler": {"capacity_policy": "guaranteed_no_evict",
                                           "first_token_from_decode": True}})
    knobs = _knobs(sc, "s.yaml", TINY_HF_CONFIG, "fp32", 256, 64)
    want = ("guaranteed_no_evict", False, True)
    assert (knobs.capacity_policy, knobs.mixed_batches, knobs.first_token_from_decode) == want
    mirror = scenario_from_dict(scenario_dict(TINY_HF_CONFIG, "fp32", tmp_path / "cal.yaml",
                                              CostParams(), knobs, "colocated", tmp_path / "t.csv"))
    m = mirror.scheduler
    assert (m.capacity_policy, m.mixed_batches, m.first_token_from_decode) == want
    kw = {k: v for k, v in knobs.to_dict().items() if k != "max_model_len"}
    cfg = LLM(TINY_HF_CONFIG, dtype="fp32", device="cpu", **kw).engine.scheduler.config
    assert (cfg.capacity_policy, cfg.mixed_batches, cfg.first_token_from_decode) == want
