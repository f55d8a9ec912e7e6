"""`engine:` in a scenario: the engine's documented defaults fill the keys left out
(`simulator.engines.presets`), a key the scenario sets wins, and a bad engine is refused by name."""

from __future__ import annotations

import json

import pytest

from simulator.engines import presets as engines
from simulator.run import run_scenario
from simulator.scenario import scenario_from_dict


def _resolve(engine: dict, **data):
    return scenario_from_dict({"model": "llama-3-70b", "hardware": "h100-sxm", "engine": engine,
                               **data}, "s.yaml")


def test_tensorrt_llm_never_evicts_takes_whole_prompts_and_an_fp8_cache_for_fp8_weights():
    sc = _resolve({"name": "tensorrt-llm"}, dtype="fp8", cluster={"tp": 4})
    assert sc.scheduler.capacity_policy == "guaranteed_no_evict"
    assert sc.scheduler.enable_chunked_prefill is False
    assert sc.scheduler.max_num_batched_tokens == engines.TRTLLM_MAX_NUM_TOKENS
    assert sc.cache.kv_cache_dtype == "fp8" and sc.cluster.allreduce == "custom"
    assert _resolve({"name": "tensorrt-llm"}).cache.kv_cache_dtype == "auto"  # bf16 weights


@pytest.mark.parametrize("model, quantization, want", [
    ("llama-3.1-8b", None, "fp8"),  # FP4 weights default to NVFP4: a ModelOpt export
    ("llama-3.1-8b", {"method": "nvfp4"}, "fp8"),
    ("llama-3.1-8b", {"method": "mxfp4"}, "auto"),
    ("gpt-oss-120b", None, "auto"),  # released in MXFP4, not a ModelOpt export
])
def test_tensorrt_llm_nvfp4_checkpoints_carry_an_fp8_cache(model, quantization, want):
    extra = {"quantization": quantization} if quantization else {}
    sc = scenario_from_dict({"model": model, "hardware": "b200", "dtype": "fp4",
                             "engine": {"name": "tensorrt-llm"}, **extra}, "s.yaml")
    assert sc.cache.kv_cache_dtype == want
    assert any("NVFP4" in n for n in sc.engine_notes) == (want == "fp8")


def test_a_key_the_scenario_sets_wins():
    sc = _resolve({"name": "tensorrt-llm"}, dtype="fp8", cache={"kv_cache_dtype": "bf16"},
                  scheduler={"capacity_policy": "max_utilization", "max_num_batched_tokens": 4096,
                             "enable_chunked_prefill": True})
    assert (sc.scheduler.capacity_policy, sc.scheduler.max_num_batched_tokens) == (
        "max_utilization", 4096)
    assert sc.scheduler.enable_chunked_prefill is True and sc.cache.kv_cache_dtype == "bf16"
    sc = _resolve({"name": "lmdeploy-turbomind"}, cluster={"tp": 4, "allreduce": "custom"})
    assert sc.cluster.allreduce == "custom"


@pytest.mark.parametrize("engine, hardware, want", [
    ({"name": "vllm", "version": "0.11.0"}, "h200-sxm", (1024, 8192, True)),
    ({"name": "vllm", "version": "0.11.0", "entry_point": "offline"}, "h200-sxm", (1024, 16384, True)),
    ({"name": "vllm", "version": "0.11.0"}, "a100-80gb-sxm", (256, 2048, True)),
    ({"name": "vllm", "version": "0.8.3"}, "l4", (256, 2048, True)),  # 24 GiB
    ({"name": "vllm", "version": "0.7.3"}, "h100-sxm", (256, 8192, False)),  # V0, 8K context
    ({"name": "vllm"}, "h100-sxm", (256, 8192, True)),  # no version: kvpd's defaults
])
def test_vllm_limits_by_version_gpu_and_entry_point(engine, hardware, want):
    sc = scenario_from_dict({"model": "llama-3-8b", "hardware": hardware, "engine": engine})
    s = sc.scheduler
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.enable_chunked_prefill) == want
    assert s.capacity_policy == "max_utilization"
    assert s.mixed_batches is want[2]  # V0 without chunking runs prompts in steps of their own


def test_vllm_v0_budget_follows_max_model_len_and_long_context_keeps_chunking():
    sc = scenario_from_dict({"model": "llama-3-8b", "engine": {"name": "vllm", "version": "0.6.6"},
                             "scheduler": {"max_model_len": 4096}})
    assert (sc.scheduler.max_num_batched_tokens, sc.scheduler.enable_chunked_prefill) == (4096, False)
    data = {"model": "llama-3.1-8b", "engine": {"name": "vllm", "version": "0.6.6"}}
    notes = engines.apply_engine(data)
    assert data["scheduler"]["max_num_seqs"] == 256 and "enable_chunked_prefill" not in data["scheduler"]
    assert any("long context" in n for n in notes)


@pytest.mark.parametrize("version, hardware, model, want", [
    ("0.6.6", "h100-sxm", "llama-3.1-8b", (True, 2048)),  # long context: chunked, 2048
    ("0.6.3", "h100-sxm", "llama-3.1-8b", (True, 512)),  # before v0.6.5: 512-token chunks
    ("0.7.3", "mi300x", "llama-3.1-8b", (False, 131072)),  # not on ROCm from v0.6.5
    ("0.6.3", "mi300x", "llama-3.1-8b", (True, 512)),
    ("0.7.3", "h100-sxm", "llama-3-8b", (False, 8192)),  # 8K context: whole prompts
    # v0.7.1-v0.7.3 force chunked prefill off for MLA (DeepSeek-V2-Lite: 163,840 tokens)
    ("0.7.3", "h100-sxm", "deepseek-v2-lite", (False, 163840)),
    ("0.7.1", "h100-sxm", "deepseek-v2-lite", (False, 163840)),
    ("0.7.4.dev181", "h100-sxm", "deepseek-v2-lite", (True, 2048)),  # nightlies after it: chunked
    ("0.7.0", "h100-sxm", "deepseek-v2-lite", (True, 2048)),
])
def test_vllm_v0_chunking_by_context_version_and_platform(version, hardware, model, want):
    """V0 switches chunked prefill on by itself only past a 32K context, on CUDA (not ROCm from
    v0.6.5), without a sliding window; its chunk budget is 512 before v0.6.5, 2048 from it;
    without chunking a step holds max(max_model_len, 2048) prompt tokens."""
    sc = _resolve({"name": "vllm", "version": version}, model=model, hardware=hardware)
    s = sc.scheduler
    assert (s.enable_chunked_prefill, s.max_num_batched_tokens) == want
    assert s.mixed_batches is want[0]  # V0 runs prompt steps of their own without chunking


def test_vllm_07_says_it_forces_chunked_prefill_off_for_mla():
    sc = _resolve({"name": "vllm", "version": "0.7.2"}, model="deepseek-v2-lite",
                  hardware="h100-sxm")
    assert any("forces chunked prefill off for an MLA model" in n for n in sc.engine_notes)
    assert any("prefill steps of their own" in n for n in sc.engine_notes)
    # a scenario's own choice wins, and says nothing of the rule
    sc = _resolve({"name": "vllm", "version": "0.7.2"}, model="deepseek-v2-lite",
                  hardware="h100-sxm", scheduler={"enable_chunked_prefill": True})
    assert sc.scheduler.enable_chunked_prefill is True
    assert not any("MLA model" in n for n in sc.engine_notes)


def test_tp_allreduce_by_engine_and_version():
    def allreduce(engine, tp):
        return _resolve(engine, cluster={"tp": tp}).cluster.allreduce
    assert allreduce({"name": "vllm", "version": "0.2.6"}, 4) == "nccl"
    assert allreduce({"name": "vllm", "version": "0.2.7"}, 4) == "custom"
    assert allreduce({"name": "lmdeploy-turbomind"}, 2) == "nccl"
    assert allreduce({"name": "sglang"}, 8) == "custom"
    assert _resolve({"name": "sglang"}).scheduler.mixed_batches is False  # prefill batches first
    assert _resolve({"name": "sglang"}, scheduler={"mixed_batches": True}).scheduler.mixed_batches
    data = {"engine": {"name": "lmdeploy-turbomind"}, "cluster": {"tp": 1}}
    engines.apply_engine(data)
    assert "allreduce" not in data["cluster"]  # a TP1 replica calls no all-reduce


def test_pd_pools_keep_the_scenario_wide_limits_and_a_second_pass_changes_nothing():
    data = {"engine": {"name": "vllm", "version": "0.11.0"}, "hardware": "h100-sxm",
            "cluster": {"pd": {"prefill": {"tp": 2}, "decode": {"tp": 2}}}}
    engines.apply_engine(data)
    assert data["scheduler"] == {"capacity_policy": "max_utilization"}  # no V1 limits for PD
    snapshot = json.dumps(data, sort_keys=True)
    engines.apply_engine(data)  # (a resolved scenario validated again, e.g. in a worker)
    assert json.dumps(data, sort_keys=True) == snapshot


@pytest.mark.parametrize("engine, match", [
    ({"name": "tgi"}, "engine.name 'tgi' unknown; kvpd knows: vllm, sglang, tensorrt-llm"),
    ({"name": "vllm", "entry_point": "batch"}, "engine.entry_point 'batch' unknown"),
    ("vllm", "engine must be a mapping"),
    # a version kvpd cannot read was taken as none, silently (YAML reads 0.11 as a number)
    ({"name": "vllm", "version": 0.11}, r"engine.version 0.11 names no version; write "
                                        r"major.minor.patch in quotes, e.g. '0.11.0'"),
    ({"name": "sglang", "version": "latest"}, r"engine.version 'latest' names no version"),
    ({"version": "0.11.0"}, "engine.name is missing; kvpd knows: vllm"),  # was "name None"
])
def test_a_bad_engine_is_refused_naming_the_file_and_key(engine, match):
    with pytest.raises(ValueError, match=match) as exc:
        scenario_from_dict({"engine": engine}, "plan.yaml")
    assert str(exc.value).startswith("plan.yaml")


def test_the_run_records_the_resolved_scenario(tmp_path):
    sc = scenario_from_dict({
        "model": "llama-3-8b", "engine": {"name": "tensorrt-llm"},
        "workload": {"synthetic": {"num_requests": 20, "arrival": {"process": "burst"},
                                   "prompt_len": {"dist": "fixed", "value": 256},
                                   "output_len": {"dist": "fixed", "value": 16}}},
        "output": {"plots": False, "timeseries": False}})
    run_scenario(sc).write(tmp_path)
    written = json.loads((tmp_path / "scenario.json").read_text())
    assert written["engine"]["name"] == "tensorrt-llm"
    assert written["scheduler"]["capacity_policy"] == "guaranteed_no_evict"


def test_a_sweep_over_engines_gets_each_engines_defaults():
    from simulator.plan.keys import build_scenario

    base = {"model": "llama-3-8b", "engine": {"name": "vllm", "version": "0.11.0"}}
    points = {e: build_scenario(base, {"engine.name": e}, "sweep.yaml", ".").scheduler
              for e in ("vllm", "tensorrt-llm")}
    assert points["vllm"].capacity_policy == "max_utilization"
    assert points["vllm"].max_num_seqs == 1024  # V1 on an 80 GB H100, the OpenAI server
    assert points["tensorrt-llm"].capacity_policy == "guaranteed_no_evict"
    assert points["tensorrt-llm"].enable_chunked_prefill is False


@pytest.mark.parametrize("engine, want", [
    ({"name": "vllm", "version": "0.7.3"}, False),  # V0: --enable-prefix-caching opt-in
    ({"name": "vllm", "version": "0.8.0"}, True),  # V1: on by default
    ({"name": "vllm"}, True),
    ({"name": "lmdeploy-turbomind", "version": "v0.1.0a1"}, False),
    ({"name": "sglang", "version": "0.5.7"}, True),  # the radix cache
])
def test_prefix_caching_by_engine_and_version(engine, want):
    sc = _resolve(engine)
    assert sc.cache.enable_prefix_caching is want
    assert any("enable_prefix_caching false" in n for n in sc.engine_notes) == (not want)
    assert _resolve(engine, cache={"enable_prefix_caching": True}).cache.enable_prefix_caching


@pytest.mark.parametrize(("engine", "data", "want"), [
    # before v0.5.10 piecewise CUDA graphs are opt-in: every prefill batch runs eagerly
    ({"name": "sglang", "version": "0.5.7"}, {}, 0),
    ({"name": "sglang", "version": "0.5.9"}, {"model": "deepseek-v3", "hardware": "h200-sxm",
                                              "dtype": "fp8", "cluster": {"tp": 8}}, 0),
    # from v0.5.10 on by default: up to 2048 tokens for an MLA model, the chunk size otherwise
    ({"name": "sglang", "version": "0.5.12"}, {"model": "deepseek-v3", "hardware": "h200-sxm",
                                               "dtype": "fp8", "cluster": {"tp": 8}}, 2048),
    ({"name": "sglang", "version": "0.5.10"}, {"scheduler": {"max_num_batched_tokens": 8192}},
     8192),
    # ... and off with what SGLang turns them off for
    ({"name": "sglang", "version": "0.5.12"}, {"model": "deepseek-v3", "hardware": "h200-sxm",
                                               "dtype": "fp8", "cluster": {"tp": 8,
                                                                           "dp_attention": True}}, 0),
    ({"name": "sglang", "version": "0.5.12"}, {"cluster": {"tp": 2, "pp": 2}}, 0),
    ({"name": "sglang", "version": "0.5.12"}, {"model": "llama-3.1-8b", "hardware": "mi300x"}, 0),
    # ... for the architectures SGLang lists without them
    ({"name": "sglang", "version": "0.5.10"}, {"model": "deepseek-v3.2", "hardware": "h200-sxm",
                                               "dtype": "fp8", "cluster": {"tp": 8}}, 0),
    # ... and under its MoE runner flashinfer_trtllm, its default on SM100 GPUs for
    # DeepSeek-V3's FP8 / NVFP4 experts (BF16 from v0.5.12) and Qwen3-MoE's FP8 / BF16 ones
    ({"name": "sglang", "version": "0.5.12"}, {"model": "deepseek-v3", "hardware": "b200",
                                               "dtype": "fp8", "cluster": {"tp": 8}}, 0),
    ({"name": "sglang", "version": "0.5.10"}, {"model": "deepseek-v3", "hardware": "b300",
                                               "dtype": "fp4", "cluster": {"tp": 8}}, 0),
    ({"name": "sglang", "version": "0.5.11"}, {"model": "deepseek-v3", "hardware": "b200",
                                               "dtype": "bf16", "cluster": {"tp": 16}}, 2048),
    ({"name": "sglang", "version": "0.5.12"}, {"model": "deepseek-v3", "hardware": "b200",
                                               "dtype": "bf16", "cluster": {"tp": 16}}, 0),
    ({"name": "sglang", "version": "0.5.10"}, {"model": "qwen3-30b-a3b", "hardware": "b200",
                                               "scheduler": {"max_num_batched_tokens": 8192}}, 0),
    ({"name": "sglang", "version": "0.5.10"}, {"model": "qwen3-30b-a3b", "hardware": "h100-sxm",
                                               "scheduler": {"max_num_batched_tokens": 8192}},
     8192),
    ({"name": "sglang", "version": "0.5.12"}, {"model": "gpt-oss-120b", "hardware": "b200",
                                               "dtype": "fp4",
                                               "scheduler": {"max_num_batched_tokens": 8192}},
     8192),
    ({"name": "sglang", "version": "0.5.12"}, {"model": "qwen3-30b-a3b", "hardware": "b200",
                                               "dtype": "int4",
                                               "scheduler": {"max_num_batched_tokens": 8192}},
     8192),
    # a key the scenario sets wins; other engines and an unstated version price graphs
    ({"name": "sglang", "version": "0.5.7"}, {"cluster": {"prefill_graph_max_tokens": 512}}, 512),
    ({"name": "sglang"}, {}, None),
    ({"name": "vllm", "version": "0.7.3"}, {}, None),
    ({"name": "tensorrt-llm"}, {}, None),
])
def test_sglang_prefill_steps_outside_cuda_graphs_by_version(engine, data, want):
    sc = _resolve(engine, **data)
    assert sc.cluster.prefill_graph_max_tokens == want
    if want is not None and "prefill_graph_max_tokens" not in data.get("cluster", {}):
        assert any("prefill_graph_max_tokens" in n for n in sc.engine_notes)
    if want == 0 and data.get("hardware") in ("b200", "b300"):
        assert any("flashinfer_trtllm" in n for n in sc.engine_notes)


def test_the_run_prices_sglangs_eager_prefill():
    """A one-request SGLang 0.5.7 run: the prompt's step pays every layer's dispatch, so the
    first token comes that much later than with graphs; the decode steps do not."""
    def run(cluster: dict) -> dict:
        sc = _resolve({"name": "sglang", "version": "0.5.7"}, model="llama-3.1-8b",
                      cluster=cluster, workload={"synthetic": {
                          "num_requests": 1, "arrival": {"process": "burst"},
                          "prompt_len": {"dist": "fixed", "value": 512},
                          "output_len": {"dist": "fixed", "value": 8}}})
        return run_scenario(sc).summary
    eager, graphed = run({}), run({"prefill_graph_max_tokens": 4096})
    layers = 32
    from simulator.cost.eager_dispatch import SGLANG_EAGER_LAYER_S

    assert eager["ttft_s"]["mean"] - graphed["ttft_s"]["mean"] == pytest.approx(
        layers * SGLANG_EAGER_LAYER_S, rel=1e-6)
    assert eager["tpot_s"]["mean"] == pytest.approx(graphed["tpot_s"]["mean"], rel=1e-9)


@pytest.mark.parametrize(("cluster", "says"), [
    ({"eager_layer_s": "abc"}, "cluster.eager_layer_s"),
    ({"eager_layer_s": -1.0}, "cluster.eager_layer_s"),
    ({"prefill_graph_max_tokens": -5}, "cluster.prefill_graph_max_tokens"),
])
def test_bad_eager_keys_are_refused_by_name_not_a_crash(cluster, says):
    with pytest.raises(ValueError, match=says):
        _resolve({"name": "sglang", "version": "0.5.7"}, cluster=cluster)


@pytest.mark.parametrize(("engine", "host", "asynchronous"), [
    ({"name": "vllm", "version": "0.11.0"}, 5.5e-6, False),  # V1, synchronous scheduling
    ({"name": "vllm", "version": "0.8.0"}, 5.5e-6, False),  # V1 the default from here
    ({"name": "vllm", "version": "0.13.0"}, 5.5e-6, False),
    ({"name": "vllm", "version": "0.14.0"}, 5.5e-6, True),  # async scheduling by default
    ({"name": "vllm"}, 5.5e-6, True),  # no version: the engine as released now
    ({"name": "vllm", "version": "0.7.3"}, 10e-6, False),  # V0: its own, synchronous
    ({"name": "vllm", "version": "0.6.6"}, 10e-6, False),
    ({"name": "sglang", "version": "0.5.7"}, None, None),
    ({"name": "tensorrt-llm"}, None, None),
])
def test_vllm_scheduler_host_time_by_engine_and_version(engine, host, asynchronous):
    sc = _resolve(engine)
    assert sc.cluster.host_request_s == host
    assert sc.cluster.async_scheduling is asynchronous
    assert any("host_request_s" in n for n in sc.engine_notes) == (host is not None)


def test_the_run_prices_the_host_time_per_request_and_a_set_value_wins():
    """Ten requests decoding side by side on vLLM 0.11.0: every step costs ten times the
    host time per request more than with it set to 0, and a value the scenario sets wins."""
    def run(cluster: dict) -> tuple[dict, float]:
        sc = _resolve({"name": "vllm", "version": "0.11.0"}, model="llama-3.1-8b",
                      cluster=cluster, workload={"synthetic": {
                          "num_requests": 10, "arrival": {"process": "burst"},
                          "prompt_len": {"dist": "fixed", "value": 64},
                          "output_len": {"dist": "fixed", "value": 32}}})
        return run_scenario(sc).summary, sc.cluster.host_request_s
    (priced, h), (free, h0) = run({}), run({"host_request_s": 0.0})
    assert h == pytest.approx(5.5e-6) and h0 == 0.0
    assert priced["tpot_s"]["mean"] - free["tpot_s"]["mean"] == pytest.approx(10 * h, rel=1e-6)
    with pytest.raises(ValueError, match="cluster.host_request_s"):
        _resolve({"name": "vllm", "version": "0.11.0"}, cluster={"host_request_s": -1e-6})
