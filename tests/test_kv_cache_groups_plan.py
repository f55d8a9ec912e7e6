"""vLLM V1's hybrid KV cache manager above the core: which models split into KV cache groups
(vLLM's grouping rule), the memory plan's blocks of one group's layers, the `vllm` preset that
turns it on, the scenario checks, and a simulation whose sliding layers hold only the window."""

from __future__ import annotations

import pytest

from simulator.cost.memory_plan import kv_cache_groups, mixed_window_note, plan_memory
from simulator.cost.models import get_model
from simulator.run import run_scenario
from simulator.scenario import scenario_from_dict

GPT_OSS = {"model": "gpt-oss-120b", "hardware": "h100-sxm", "dtype": "fp4",
           "quantization": {"method": "mxfp4", "scope": "experts"}}


@pytest.mark.parametrize(("model", "groups"), [
    ("gpt-oss-120b", (18, 1)),  # 18 sliding + 18 full
    ("gpt-oss-20b", (12, 1)),
    ("gemma-3-27b", (10, 6)),  # 52 sliding + 10 full: six sliding groups, the last padded
    ("gemma-2-27b", (23, 1)),
    ("llama-4-scout", None),  # chunked local attention: vLLM keeps one table by default
    ("mistral-7b", None),  # every layer slides: one table that slides
    ("llama-3.1-8b", None),
    ("qwen3.5-35b-a3b", None),  # linear attention
])
def test_kv_cache_groups_follow_vllms_grouping(model, groups):
    assert kv_cache_groups(get_model(model)) == groups


def test_a_block_holds_one_groups_layers():
    one = plan_memory(get_model("gpt-oss-120b"), "h100-sxm", "fp4", quantization={
        "method": "mxfp4", "scope": "experts"})
    grouped = plan_memory(get_model("gpt-oss-120b"), "h100-sxm", "fp4", quantization={
        "method": "mxfp4", "scope": "experts"}, hybrid_kv_cache=True)
    assert (one.kv_group_layers, one.sliding_groups) == (0, 0)
    assert (grouped.kv_group_layers, grouped.sliding_groups) == (18, 1)
    assert grouped.kv_bytes_per_block == pytest.approx(one.kv_bytes_per_block / 2)
    assert grouped.num_gpu_blocks in (2 * one.num_gpu_blocks, 2 * one.num_gpu_blocks + 1)
    gemma = plan_memory(get_model("gemma-3-27b"), "h100-sxm", hybrid_kv_cache=True)
    assert gemma.kv_bytes_per_block == pytest.approx(
        plan_memory(get_model("gemma-3-27b"), "h100-sxm").kv_bytes_per_block * 10 / 62)
    # at pp > 1 the plan keeps one table
    assert plan_memory(get_model("gemma-3-27b"), "h100-sxm", pp=2,
                       hybrid_kv_cache=True).sliding_groups == 0


def test_the_vllm_preset_turns_the_manager_on_where_vllm_does():
    engine = {"name": "vllm", "version": "0.11.0"}
    sc = scenario_from_dict({**GPT_OSS, "engine": engine})
    assert sc.cache.disable_hybrid_kv_cache_manager is False
    assert any("hybrid KV cache manager" in n and "1 sliding-window group of 18" in n
               for n in sc.engine_notes)
    dense = scenario_from_dict({"model": "llama-3.1-8b", "engine": engine})
    assert dense.cache.disable_hybrid_kv_cache_manager is None  # nothing to split
    assert scenario_from_dict({**GPT_OSS, "engine": {"name": "vllm", "version": "0.9.1"}}
                              ).cache.disable_hybrid_kv_cache_manager is None
    assert scenario_from_dict({**GPT_OSS, "engine": {"name": "sglang"}}
                              ).cache.disable_hybrid_kv_cache_manager is None
    kept = scenario_from_dict({**GPT_OSS, "engine": engine,
                               "cache": {"disable_hybrid_kv_cache_manager": True}})
    assert kept.cache.disable_hybrid_kv_cache_manager is True
    pd = scenario_from_dict({**GPT_OSS, "engine": engine, "hardware": "h200-sxm", "cluster": {
        "pd": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}}})
    assert pd.cache.disable_hybrid_kv_cache_manager is None
    assert any("off with a KV connector" in n for n in pd.engine_notes)


def test_the_manager_is_refused_where_it_is_not_modelled():
    with pytest.raises(ValueError, match=r"disable_hybrid_kv_cache_manager: false.*cluster\.pd"):
        scenario_from_dict({**GPT_OSS, "hardware": "h200-sxm",
                            "cache": {"disable_hybrid_kv_cache_manager": False},
                            "cluster": {"pd": {"prefill": {"replicas": 1},
                                               "decode": {"replicas": 1}}}})
    with pytest.raises(ValueError, match="cache.swap_space_gb"):
        scenario_from_dict({**GPT_OSS, "cache": {"disable_hybrid_kv_cache_manager": False,
                                                 "swap_space_gb": 4}})


def test_the_sliding_layers_hold_only_the_window_in_a_simulation():
    def run(disable: bool) -> dict:
        return run_scenario(scenario_from_dict({
            **GPT_OSS, "seed": 1, "output": {"plots": False},
            "cache": {"disable_hybrid_kv_cache_manager": disable},
            "workload": {"synthetic": {"num_requests": 60, "arrival": {"process": "burst"},
                                       "prompt_len": {"dist": "fixed", "value": 16000},
                                       "output_len": {"dist": "fixed", "value": 200}}}})).summary

    one, grouped = run(True), run(False)
    assert "sliding_groups" not in one["cluster"][0]
    assert (grouped["cluster"][0]["kv_group_layers"], grouped["cluster"][0]["sliding_groups"]) \
        == (18, 1)
    # twice the blocks, each request's sliding layers holding ~9 of them instead of 1,000:
    # about twice the requests decode side by side, so each decode step takes longer
    assert grouped["tpot_s"]["mean"] > 1.3 * one["tpot_s"]["mean"]
    assert grouped["requests"]["finished"] == one["requests"]["finished"] == 60


def test_the_kv_plan_note_says_which_layout_the_plan_keeps():
    model = get_model("gpt-oss-120b")
    assert "kvpd KV block holds every layer" in mixed_window_note(model)
    note = mixed_window_note(model, 18, 1)
    assert "hybrid KV cache manager" in note and "group of 18 layers" in note


def test_vllm_sizes_the_attention_block_to_hold_a_linear_layers_state():
    """vLLM's HybridAttentionMambaModelConfig (v0.11.0): 16 x cdiv(state page, 16 x attention
    page per token), both on one layer of one GPU. Qwen3-Next-80B at TP4: conv 3 x 8192 / 4
    bf16 values + SSM 32 / 4 heads x 128 x 128 bf16 = 274,432 bytes; attention 2 x 1 KV head
    (replicated) x 256 x 2 = 1,024 bytes per token -> 16 x cdiv(274,432, 16,384) = 272."""
    from simulator.cost.memory_plan import mamba_block_size

    next80 = get_model("qwen3-next-80b-a3b")
    assert mamba_block_size(next80, 4, "bf16", "auto") == 272
    assert mamba_block_size(next80, 4, "bf16", "fp8") == 544  # half the page per token
    sc = scenario_from_dict({"model": "qwen3.5-397b-a17b", "hardware": "h200-sxm",
                             "dtype": "fp8", "cluster": {"tp": 8},
                             "engine": {"name": "vllm", "version": "0.11.0"}})
    assert sc.cache.block_size == 528
    assert any(n.startswith("block_size 528: vLLM 0.11.0") for n in sc.engine_notes)
    # each request's state: one block per group of 15 layers (45 linear layers: 3 groups)
    plan = sc.memory_plan(sc.model_spec(), "h200-sxm", 8, 1, 1)
    assert plan.state_blocks_per_request == 3
    kept = scenario_from_dict({"model": "qwen3.5-397b-a17b", "hardware": "h200-sxm",
                               "dtype": "fp8", "cluster": {"tp": 8}, "cache": {"block_size": 16},
                               "engine": {"name": "vllm", "version": "0.11.0"}})
    assert kept.cache.block_size == 16
