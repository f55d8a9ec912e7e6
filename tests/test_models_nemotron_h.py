"""Nemotron-H's Mamba-2 hybrids (Nemotron-H, Nemotron-3 Nano, Super and Ultra): the block
pattern read into layers against transformers' own parameter counts, the catalog entries
against their model cards, and the cost model's MLP-free layers, LatentMoE experts and
Mamba-2 prefill kernels."""

from __future__ import annotations

import pytest
import torch
from transformers import NemotronHConfig, NemotronHForCausalLM

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.memory_plan import linear_attention_note, plan_memory
from simulator.cost.models import ModelSpec, get_model

TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            mamba_num_heads=8, mamba_head_dim=8, n_groups=2, ssm_state_size=16,
            conv_kernel=4, intermediate_size=96, vocab_size=300,
            max_position_embeddings=4096, mamba_ssm_cache_dtype="float32")
TINY_MOE = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                moe_shared_expert_intermediate_size=48, n_shared_experts=1)


def _config(pattern: str, **extra: object) -> dict:
    return {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
            "hybrid_override_pattern": pattern, "num_hidden_layers": len(pattern),
            **TINY, **extra}


def _shape(reqs: list[tuple[int, int]]) -> BatchShape:
    return BatchShape.from_lists([q for q, _ in reqs], [c for _, c in reqs])


CASES = {
    "dense": _config("M-M-*-M*-"),  # Nemotron-H: Mamba, attention and squared-ReLU MLPs
    "moe": _config("MEM*EMEM*E", **TINY_MOE),  # Nemotron-3 Nano's kind
    "latent-moe": _config("MEMEM*EM*E", **TINY_MOE, moe_latent_size=24),  # Super's kind
}


@pytest.mark.parametrize("case", CASES)
def test_parameter_count_equals_transformers(case):
    cfg = CASES[case]
    spec = ModelSpec.from_hf_config(cfg)
    hf = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}
    with torch.device("meta"):
        model = NemotronHForCausalLM(NemotronHConfig(**hf))
    assert spec.num_params == sum(p.numel() for p in model.parameters())


def test_blocks_pair_into_layers_and_a_mixer_without_an_mlp_keeps_none():
    # M-M-*-M*- : mixers M M * M * (5 layers), the fourth (M) followed by a mixer: no MLP
    spec = ModelSpec.from_hf_config(CASES["dense"])
    assert spec.num_layers == 5 and spec.num_linear_layers == 3
    assert spec.mlp_free_layer_ids == (3,) and spec.num_mlp_layers == 4
    assert spec.linear_kind == "mamba2" and not spec.gated_mlp
    # the list form and its legacy names read the same
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    listed = {k: v for k, v in CASES["dense"].items() if k != "hybrid_override_pattern"}
    listed["layers_block_type"] = [names[c] for c in "M-M-*-M*-"]
    assert ModelSpec.from_hf_config(listed) == spec
    moe = ModelSpec.from_hf_config(CASES["moe"])
    assert (moe.num_layers, moe.num_moe_layers, moe.num_dense_layers) == (6, 4, 0)
    # MEM*EMEM*E: the Mamba layer before each attention block keeps no MLP
    assert moe.mlp_free_layer_ids == (1, 4)


@pytest.mark.parametrize("pattern,message", [
    ("-M*", "block 0 \\(mlp\\) follows no mixer"),
    ("M--*", "block 2 \\(mlp\\) follows no mixer"),
    ("M-M-", "no attention block"),
    ("M*X", "hybrid_override_pattern"),
])
def test_a_pattern_kvpd_cannot_price_is_refused(pattern, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_hf_config(_config(pattern))


def test_a_missing_mamba_field_is_refused_naming_it():
    cfg = {k: v for k, v in CASES["moe"].items() if k != "mamba_num_heads"}
    with pytest.raises(ValueError, match="mamba_num_heads"):
        ModelSpec.from_hf_config(cfg)
    cfg = {k: v for k, v in CASES["moe"].items() if k != "n_routed_experts"}
    with pytest.raises(ValueError, match="n_routed_experts"):
        ModelSpec.from_hf_config(cfg)


@pytest.mark.parametrize("name,total,active", [
    ("nemotron-3-nano-30b-a3b", 31.6e9, 3.6e9),  # the model card: 31.6B, 3.6B with embeddings
    ("nemotron-3-super-120b-a12b", 120e9, 12e9),
    ("nemotron-3-ultra-550b-a55b", 550e9, 55e9),
])
def test_catalog_entries_match_their_model_cards(name, total, active):
    m = get_model(name)
    assert abs(m.num_params / total - 1) < 0.01
    assert abs(m.num_active_params / active - 1) < 0.07
    assert m.num_full_attention_layers < m.num_linear_layers  # mostly Mamba-2


@pytest.mark.parametrize("name,total", [
    ("nemotron-h-8b", 8.1e9), ("nemotron-h-56b", 56.3e9),
    ("nemotron-nano-9b-v2", 8.89e9),  # the model card's 8.89B
    ("nemotron-nano-12b-v2", 12.31e9),  # the model card's 12.31B
])
def test_dense_catalog_entries_count_as_transformers_does(name, total):
    """The dense releases (squared-ReLU MLPs, no experts): kvpd's count is transformers' own
    for the catalog's config, and the model card's size."""
    m = get_model(name)
    cfg = {k: v for k, v in _catalog_config(name).items() if k != "architectures"}
    with torch.device("meta"):
        model = NemotronHForCausalLM(NemotronHConfig(**cfg))
    assert m.num_params == sum(p.numel() for p in model.parameters())
    assert abs(m.num_params / total - 1) < 0.005 and not m.is_moe
    assert m.num_linear_layers > 4 * m.num_full_attention_layers  # mostly Mamba-2


def _catalog_config(name: str) -> dict:
    from simulator.cost.catalog_file import read_catalog
    return dict(read_catalog("models.yaml")[name]["config"])


def test_aliases_name_the_exports():
    nano = get_model("nemotron-3-nano-30b-a3b")
    for alias in ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8",
                  "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"):
        assert get_model(alias).num_params == nano.num_params
    assert get_model("nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4") \
        .max_position_embeddings == 1_048_576
    super_ = get_model("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4")
    assert super_.moe_latent_size == 1024 and super_.expert_width == 1024


def test_mlp_free_layers_pay_no_mlp_and_one_all_reduce_fewer():
    """A layer without an MLP has no MLP GEMMs, one all-reduce (not two) and a shorter
    kernel floor: price "M*-" against "M-*-" (the same but for one MLP)."""
    with_mlp = ModelSpec.from_hf_config(_config("M-*-"))
    without = ModelSpec.from_hf_config(_config("M*-"))
    shape = _shape([(512, 0)])
    full, free = (CostModel(m, "h100-sxm", "bf16", tp=2) for m in (with_mlp, without))
    mlp = {m: {op.name: op for op in cm.explain(shape).ops}["mlp"]
           for m, cm in (("full", full), ("free", free))}
    assert mlp["free"].flops == pytest.approx(mlp["full"].flops / 2)
    calls = [cm._stages[0]["raw"]["allreduce_calls"] for cm in (full, free)]
    assert calls == [4, 3]  # one per block: M, -, *, -  against M, *, -
    assert free.step_time(shape) < full.step_time(shape)
    assert full.explain(shape).total_s == pytest.approx(full.step_time(shape), rel=1e-9)


def test_latent_experts_stream_their_latent_width():
    """LatentMoE's routed experts read and write the latent: a one-token decode streams k
    experts of 2 x latent x ffn weights per MoE layer, plus the projections to and from it."""
    model = get_model("nemotron-3-super-120b-a12b")
    cm = CostModel(model, "b200", "bf16", tp=1)
    ops = {op.name: op for op in cm.explain(_shape([(1, 1000)])).ops}
    expert = 2 * model.moe_latent_size * model.ffn_size * 2  # up and down, bf16
    routed = model.num_moe_layers * model.experts_per_token * expert
    assert ops["moe_experts"].bytes >= routed
    fixed = model.num_moe_layers * (model.latent_proj_params + model.shared_expert_params) * 2
    assert ops["moe_experts"].bytes == pytest.approx(routed + fixed, rel=0.02)


def test_mamba2_prefill_pays_its_chunk_scan_kernels_and_decodes_its_state():
    model = get_model("nemotron-3-nano-30b-a3b")
    cm = CostModel(model, "h100-sxm", "bf16", tp=2)
    k = cm.kernels.mamba2
    heads = model.linear_value_heads / 2
    p1, p2 = (next(op for op in cm.explain(_shape([(n, 0)])).ops if op.name == "linear_attn")
              for n in (2048, 4096))
    per_token = model.num_linear_layers * (k.token_s + k.token_head_s * heads)
    assert p2.time_s - p1.time_s == pytest.approx(2048 * per_token)
    assert p1.time_s == pytest.approx(model.num_linear_layers * k.call_s + 2048 * per_token)
    decode = next(op for op in cm.explain(_shape([(1, 2000)])).ops if op.name == "linear_attn")
    assert decode.bytes == pytest.approx(2 * model.linear_state_bytes("bf16") / 2)


def test_tp_must_split_the_mamba_heads_and_the_plan_says_what_the_state_is():
    model = get_model("nemotron-3-nano-30b-a3b")
    with pytest.raises(ValueError, match="does not divide num_heads=32|mamba_num_heads"):
        CostModel(model, "h100-sxm", "bf16", tp=3)
    plan = plan_memory(model, "h100-sxm", "fp8", tp=2)
    note = linear_attention_note(model, plan)
    assert note.startswith("23 of 29 layers are Mamba-2 state-space")
    # the KV cache holds the 6 attention layers only
    assert model.kv_bytes_per_token("bf16") == 2 * 6 * 2 * 128 * 2


def test_a_nemotron_3_nano_scenario_runs():
    from tests.sim_helpers import sim

    summary = sim({"model": "nemotron-3-nano-30b-a3b", "hardware": "h100-sxm", "dtype": "fp8",
                   "workload": {"synthetic": {"num_requests": 24,
                                              "arrival": {"process": "burst"},
                                              "prompt_len": {"dist": "fixed", "value": 1024},
                                              "output_len": {"dist": "fixed", "value": 32}}}}
                  ).summary
    assert summary["requests"]["finished"] == 24
    assert summary["kv"]["prefix_hit_rate"] == 0.0  # (off for the recurrent state)
