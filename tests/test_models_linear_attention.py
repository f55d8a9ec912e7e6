"""Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): config parsing against transformers'
own parameter counts, the KV and state sizes, the cost model's `linear_attn` operator and the
memory plan's per-request state."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Qwen3_5Config,
    Qwen3_5MoeConfig,
    Qwen3NextConfig,
)

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.memory_plan import linear_attention_note, plan_memory
from simulator.cost.models import ModelSpec, get_model


def _shape(reqs: list[tuple[int, int]]) -> BatchShape:
    """A step of (new tokens, cached context) per request."""
    return BatchShape.from_lists([q for q, _ in reqs], [c for _, c in reqs])


TINY = dict(hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4,
            vocab_size=300)
TINY_MOE = dict(moe_intermediate_size=48, shared_expert_intermediate_size=40, num_experts=8,
                num_experts_per_tok=2)


def _configs():
    return [
        ("Qwen3NextForCausalLM", Qwen3NextConfig(**TINY, **TINY_MOE, intermediate_size=96,
                                                  mlp_only_layers=[1])),
        ("Qwen3_5ForConditionalGeneration", Qwen3_5Config(text_config={**TINY,
                                                                        "intermediate_size": 96})),
        ("Qwen3_5MoeForConditionalGeneration", Qwen3_5MoeConfig(text_config={**TINY, **TINY_MOE})),
    ]


@pytest.mark.parametrize("arch,cfg", _configs(), ids=lambda x: x if isinstance(x, str) else "")
def test_parameter_count_equals_transformers(arch, cfg):
    d = {**cfg.to_dict(), "architectures": [arch]}
    spec = ModelSpec.from_hf_config(d)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg.get_text_config())
    assert spec.num_params == sum(p.numel() for p in model.parameters())
    assert spec.num_linear_layers == 6 and spec.num_full_attention_layers == 2
    assert spec.attn_output_gate


def test_catalog_models_match_their_model_cards():
    for name, total, active in [("qwen3-next-80b-a3b", 80e9, 3e9),
                                ("qwen3.5-397b-a17b", 397e9, 17e9),
                                ("qwen3.5-122b-a10b", 122e9, 10e9),
                                ("qwen3.5-35b-a3b", 35e9, 3e9), ("qwen3.5-27b", 27e9, 27e9)]:
        m = get_model(name)
        assert abs(m.num_params / total - 1) < 0.02, name
        assert abs(m.num_active_params / active - 1) < 0.3, name  # (cards round to 3B, 10B)
        assert m.num_linear_layers == 3 * m.num_full_attention_layers


def test_kv_counts_the_softmax_layers_and_the_state_its_own_dtype():
    m = get_model("qwen3.5-397b-a17b")
    assert m.kv_bytes_per_token("bf16") == 2 * 15 * 2 * 256 * 2
    ssm = 64 * 128 * 128 * 4  # fp32 (mamba_ssm_dtype)
    conv = 3 * (2 * 16 * 128 + 64 * 128) * 2
    assert m.linear_state_bytes("bf16") == 45 * (ssm + conv)
    nxt = get_model("qwen3-next-80b-a3b")  # no mamba_ssm_dtype: the model's dtype
    assert nxt.linear_state_bytes("bf16") == 36 * (32 * 128 * 128 * 2
                                                     + 3 * (2 * 16 * 128 + 32 * 128) * 2)


def test_layer_types_and_the_interval_agree_and_bad_fields_are_named():
    base = {**TINY, "intermediate_size": 96, "architectures": ["Qwen3_5ForCausalLM"]}
    by_interval = ModelSpec.from_hf_config({**base, "full_attention_interval": 2})
    types = ["linear_attention", "full_attention"] * 4
    by_types = ModelSpec.from_hf_config({**base, "layer_types": types})
    assert by_interval.num_linear_layers == by_types.num_linear_layers == 4
    with pytest.raises(ValueError, match="linear_num_value_heads"):
        ModelSpec.from_hf_config({k: v for k, v in base.items() if k != "linear_num_value_heads"})
    with pytest.raises(ValueError, match="'layer_types' must list 8"):
        ModelSpec.from_hf_config({**base, "layer_types": types[:7]})
    with pytest.raises(ValueError, match="at least one full-attention layer"):
        ModelSpec.from_hf_config({**base, "layer_types": ["linear_attention"] * 8})
    with pytest.raises(ValueError, match="mamba_ssm_dtype"):
        ModelSpec.from_hf_config({**base, "mamba_ssm_dtype": "fp64"})


def test_tp_must_split_the_linear_heads():
    spec = ModelSpec.from_hf_config({**TINY, "intermediate_size": 96,
                                     "architectures": ["Qwen3_5ForCausalLM"]})
    with pytest.raises(ValueError, match="tp=4 does not divide linear_num_key_heads=2"):
        CostModel(spec, "h100-sxm", "bf16", tp=4)


@pytest.mark.parametrize("hw", ["h100-sxm", "b200", "cpu"])
def test_explain_adds_up_to_the_step_time_with_the_linear_attention_operator(hw):
    model = get_model("qwen3.5-35b-a3b")
    cm = CostModel(model, hw, "bf16", tp=1)
    for shape in (_shape([(1000, 0)]),
                  _shape([(1, 500)] * 8),
                  _shape([(700, 300)] + [(1, 900)] * 4)):
        br = cm.explain(shape)
        assert br.total_s == pytest.approx(cm.step_time(shape), rel=1e-9)
        ops = {op.name: op for op in br.ops}
        assert ops["linear_attn"].time_s > 0
    decode = _shape([(1, 500)] * 8)
    run = cm.decode_run_times(decode, 5)
    for k in range(5):
        assert run[k] == pytest.approx(cm.step_time(decode.advanced(k)), rel=1e-9)


def test_a_decode_reads_and_writes_each_state_and_prefill_pays_the_chunk_kernels():
    model = get_model("qwen3.5-397b-a17b")
    cm = CostModel(model, "b200", "fp8", tp=8)
    one = cm.explain(_shape([(1, 2000)]))
    many = cm.explain(_shape([(1, 2000)] * 64))
    state_rank = model.linear_state_bytes("bf16") / 8
    lin1 = next(op for op in one.ops if op.name == "linear_attn")
    lin64 = next(op for op in many.ops if op.name == "linear_attn")
    assert lin1.bytes == pytest.approx(2 * state_rank)
    assert lin64.time_s == pytest.approx(64 * lin1.time_s)
    # the chunked prefill: a fixed call per layer plus time per token (kernels.yaml)
    p1 = next(op for op in cm.explain(_shape([(2048, 0)])).ops
              if op.name == "linear_attn")
    p2 = next(op for op in cm.explain(_shape([(4096, 0)])).ops
              if op.name == "linear_attn")
    la = cm.kernels.linear_attention
    per_token = 45 * (la.token_s + la.token_head_s * 64 / 8)
    assert p2.time_s - p1.time_s == pytest.approx(2048 * per_token)
    assert p1.time_s == pytest.approx(45 * la.call_s + 2048 * per_token)


def test_memory_plan_counts_softmax_layers_per_block_and_the_state_in_blocks():
    model = get_model("qwen3.5-397b-a17b")
    plan = plan_memory(model, "h200-sxm", "fp8", tp=8)
    assert plan.kv_bytes_per_block == 16 * 15 * 2 * 1 * 256 * 2  # one KV head per rank
    assert plan.state_bytes_per_request == pytest.approx(model.linear_state_bytes("bf16") / 8)
    assert plan.state_blocks_per_request == -(-plan.state_bytes_per_request
                                              // plan.kv_bytes_per_block)
    note = linear_attention_note(model, plan)
    assert "45 of 60 layers" in note and f"{plan.state_blocks_per_request} KV blocks" in note
    assert linear_attention_note(get_model("llama-3.1-8b")) is None


def test_a_qwen3_5_scenario_runs_without_prefix_caching_and_holds_state_blocks():
    from tests.sim_helpers import sim

    # 2,112 tokens are 132 KV blocks; a request's state takes 197 more (61.4 MiB in blocks of
    # 320 KiB): 60 requests need 19,740 blocks, so a 15,000-block pool runs them in waves
    patch = {"model": "qwen3.5-35b-a3b", "hardware": "h200-sxm",
             "cache": {"num_gpu_blocks": 15000},
             "scheduler": {"max_num_batched_tokens": 131072, "max_num_seqs": 64},
             "workload": {"synthetic": {"num_requests": 60,
                                        "arrival": {"process": "burst"},
                                        "prompt_len": {"dist": "fixed", "value": 2048},
                                        "output_len": {"dist": "fixed", "value": 64}}}}
    small = sim(patch).summary
    large = sim({**patch, "cache": {"num_gpu_blocks": 100000}}).summary
    assert small["requests"]["finished"] == large["requests"]["finished"] == 60
    assert small["kv"]["prefix_hit_rate"] == 0.0  # (off for the linear-attention state)
    assert small["kv"]["peak_usage"] > 0.9
    assert large["kv"]["peak_usage"] == pytest.approx(60 * (132 + 197) / 100000)
    assert small["span_s"] > large["span_s"]


def test_swap_preemption_is_refused_for_a_linear_attention_model():
    from tests.sim_helpers import sim

    with pytest.raises(ValueError, match="swap does not move the recurrent state"):
        sim({"model": "qwen3-next-80b-a3b", "cluster": {"tp": 4},
             "scheduler": {"preemption_mode": "swap"}, "cache": {"swap_space_gb": 4}})


@pytest.mark.parametrize("name", ["tiny-qwen3-next", "tiny-qwen3.5", "tiny-qwen3.5-moe",
                                  "tiny-qwen3.5-mm", "tiny-nemotron-h",
                                  "tiny-nemotron-h-latent"])
def test_the_real_engine_accounts_the_state_as_the_simulator_does(name):
    from realexec.engine.configs import builtin_config
    from realexec.engine.llm import LLM

    llm = LLM(name, num_gpu_blocks=64, block_size=4, enable_prefix_caching=True)
    spec = ModelSpec.from_hf_config(builtin_config(name))
    kv = llm.kv_cache.spec
    assert kv.num_layers == spec.num_full_attention_layers  # the pool caches softmax layers
    assert llm.kv_cache_manager.state_blocks == -(-spec.linear_state_bytes("fp32")
                                                  // kv.bytes_per_block)
    assert not llm.kv_cache_manager.enable_prefix_caching
    with pytest.raises(ValueError, match="run this model colocated"):
        LLM(name, num_gpu_blocks=64, block_size=4, role="decode")


def test_data_parallel_attention_prices_the_linear_layers_on_the_attention_side():
    from simulator.cost.breakdown import explain_step
    from simulator.cost.dp_attention import (
        ATTENTION_OPS,
        EXPERT_OPS,
        REPLACED_OPS,
        DPAttentionCost,
    )

    attn = CostModel("qwen3.5-35b-a3b", "h200-sxm", "fp8", tp=1)
    experts = CostModel("qwen3.5-35b-a3b", "h200-sxm", "fp8", tp=8, ep=8)
    dp = DPAttentionCost(attn, experts)
    known = ATTENTION_OPS | EXPERT_OPS | REPLACED_OPS | {"tp_allreduce", "logits_gather"}
    mixed = _shape([(1, 2000)] * 16 + [(512, 0)])
    for cm in (attn, experts):
        assert {op.name for op in explain_step(cm, mixed).ops} <= known
    ranks = [_shape([(1, 2000)] * 4) for _ in range(7)] + [_shape([(512, 0)])]
    assert dp.step_time(ranks) == pytest.approx(dp.breakdown(ranks).total_s)


def test_estimate_explains_the_linear_layers_and_their_state(capsys):
    from kvpd.cli import main

    assert main(["estimate", "--model", "qwen3.5-397b-a17b", "--hardware", "h200-sxm",
                 "--dtype", "fp8", "--tp", "8", "--prefill", "2048", "--decode", "16x4096",
                 "--explain"]) == 0
    out = capsys.readouterr().out
    assert "linear_attn" in out and "chunked prefill: simulator/catalog/kernels.yaml hopper" in out
    assert "Gated DeltaNet on 45 of 60 layers" in out
    assert "98 KV blocks of the pool" in out  # the state, 22.9 MiB per GPU at TP8
