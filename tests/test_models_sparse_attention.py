"""DeepSeek-V3.2's sparse attention (DSA): the indexer's weights and FP8 keys as transformers
builds and vLLM caches them, attention priced over each query's top-k keys plus the indexer
over all of them, and the KV pool keeping every block (any earlier key may be picked)."""

from __future__ import annotations

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.models import ModelSpec, get_model
from tests.sim_helpers import sim

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = {"num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 4, "intermediate_size": 96, "moe_intermediate_size": 32,
         "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
         "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "kv_lora_rank": 16,
         "q_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
         "vocab_size": 320, "max_position_embeddings": 256, "index_topk": 8,
         "index_n_heads": 4, "index_head_dim": 16}


def test_parameter_count_equals_what_transformers_builds() -> None:
    hf_cfg = transformers.AutoConfig.for_model("deepseek_v32", **SMALL)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    spec = ModelSpec.from_hf_config({"architectures": ["DeepseekV32ForCausalLM"], **SMALL})
    assert spec.num_params == model.num_parameters()
    assert spec.is_sparse_attention and spec.attention_window == 8


def test_the_catalog_entry_is_v3_with_an_indexer() -> None:
    v3, v32 = get_model("deepseek-v3"), get_model("deepseek-ai/DeepSeek-V3.2-Exp")
    indexer = 1536 * 64 * 128 + 7168 * 128 + 7168 * 64 + 2 * 128  # wq_b, wk, weights, k_norm
    assert v32.num_params - v3.num_params == 61 * indexer
    assert v32.kv_bytes_per_token("bf16") == v3.kv_bytes_per_token("bf16") + 61 * (128 + 4)
    assert (v32.index_topk, v32.attention_window, v32.sliding_window) == (2048, 2048, 0)
    assert v3.attention_window == 0 and not v3.is_sparse_attention


def test_a_long_context_decode_reads_the_top_k_and_the_indexer_keys() -> None:
    v3 = CostModel("deepseek-v3", "h200-sxm", dtype="fp8", tp=8)
    v32 = CostModel("deepseek-v3.2", "h200-sxm", dtype="fp8", tp=8)
    pairs, tokens = v32.indexer_shares
    # the indexer's FP8 pair against a pair of the absorbed (MQA-form) attention over 16 heads
    assert tokens == pytest.approx(132 / (576 * 2)) and pairs == pytest.approx(
        (2 * 64 * 128 / 2) / (2 * 16 * (2 * 512 + 64)))
    for ctx, lo, hi in ((1_000, 1.0, 1.10), (100_000, 0.3, 0.5)):
        a = v3.step_time(BatchShape.from_lists([1] * 32, [ctx] * 32))
        b = v32.step_time(BatchShape.from_lists([1] * 32, [ctx] * 32, window=2048))
        assert lo < b / a < hi, (ctx, b / a)
    shape = BatchShape.from_lists([1] * 8, [50_000] * 8, window=2048)
    assert shape.decode_window_tokens == 8 * 2048
    assert v32.decode_attn_tokens(shape) == pytest.approx(
        shape.decode_window_tokens + tokens * shape.decode_context_tokens)


def test_sparse_prefill_runs_in_the_absorbed_form() -> None:
    """DSA runs under MLA's MQA mode (DeepSeek-V3.2's report): a prefill pair costs what a
    decode pair does, 2 x heads x (2 x latent + rope), not the expanded 2 x heads x (192 + 128)."""
    from simulator.cost.moe_cost import mla_terms

    v3, v32 = mla_terms(get_model("deepseek-v3"), 8), mla_terms(get_model("deepseek-v3.2"), 8)
    assert v3.prefill_flops_per_pair == 2 * 16 * (192 + 128)
    assert v32.prefill_flops_per_pair == v32.decode_flops_per_pair == 2 * 16 * (2 * 512 + 64)


def test_a_config_missing_an_indexer_field_is_refused_naming_it() -> None:
    cfg = {"architectures": ["DeepseekV32ForCausalLM"], **SMALL}
    del cfg["index_n_heads"]
    with pytest.raises(ValueError, match="index_n_heads"):
        ModelSpec.from_hf_config(cfg)


def test_a_simulation_keeps_every_block_and_finishes() -> None:
    """Prompts past the top-k: the shapes carry the 2,048-key cap, the pool frees nothing
    before a request ends, and every request finishes."""
    res = sim({"model": "deepseek-v3.2", "hardware": "h200-sxm", "dtype": "fp8",
               "cluster": {"tp": 8},
               "workload": {"synthetic": {
                   "num_requests": 30, "arrival": {"process": "burst"},
                   "prompt_len": {"dist": "uniform", "min": 5000, "max": 9000},
                   "output_len": {"dist": "uniform", "min": 20, "max": 100}}}})
    assert res.summary["requests"]["finished"] == 30
    kvm = res.cluster.replicas[0].scheduler.kv_cache_manager
    assert kvm.sliding_window == 0 and kvm.num_slid_out_blocks == 0


# GLM-5 (glm_moe_dsa): DeepSeek-V3.2's architecture; a layer may reuse the previous layer's
# top-k ("shared") instead of running an indexer of its own
GLM_SMALL = {**SMALL, "num_hidden_layers": 8}


@pytest.mark.parametrize("extra, own", [({}, 8),  # GLM-5 / 5.1: every layer its own
                                        ({"index_topk_freq": 4, "index_skip_topk_offset": 3}, 4),
                                        ({"index_topk_pattern": "FFSSFSSS"}, 3)])
def test_glm5_parameters_equal_what_transformers_builds(extra, own) -> None:
    cfg = {**GLM_SMALL, **extra}
    hf_cfg = transformers.AutoConfig.for_model("glm_moe_dsa", **cfg)
    assert hf_cfg.indexer_types.count("full") == own
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    spec = ModelSpec.from_hf_config({"architectures": ["GlmMoeDsaForCausalLM"], **cfg})
    assert spec.num_params == model.num_parameters()
    assert spec.index_layer_share == pytest.approx(own / 8)
    assert spec.is_mla and spec.is_moe and spec.attention_window == 8


def test_shared_indexers_cache_and_score_less() -> None:
    """A layer that reuses another's top-k caches no indexer key and scores no pairs: the KV
    bytes and the long-context decode fall with the share of layers that run their own."""
    full = ModelSpec.from_hf_config({"architectures": ["GlmMoeDsaForCausalLM"], **GLM_SMALL})
    shared = ModelSpec.from_hf_config({"architectures": ["GlmMoeDsaForCausalLM"], **GLM_SMALL,
                                       "index_topk_freq": 4, "index_skip_topk_offset": 3})
    key = full.indexer_key_bytes
    assert full.kv_bytes_per_token("bf16") - shared.kv_bytes_per_token("bf16") == 4 * key
    a = CostModel(full, "h200-sxm", tp=1).step_time(
        BatchShape.from_lists([1] * 16, [200] * 16, window=8))
    b = CostModel(shared, "h200-sxm", tp=1).step_time(
        BatchShape.from_lists([1] * 16, [200] * 16, window=8))
    assert b < a


def test_the_glm5_catalog_entry_is_its_744b_release() -> None:
    """zai-org/GLM-5's config.json (GLM-5.1: the same shapes): 743.9B parameters without the
    MTP layer (GLM's "744B"; its safetensors hold 753.9B with it)."""
    m = get_model("zai-org/GLM-5.1")
    assert m.name == "glm-5" and m.num_params == 743_911_199_232
    assert (m.index_topk, m.index_n_heads, m.index_head_dim, m.index_layer_share) == \
        (2048, 32, 128, 1.0)


@pytest.mark.parametrize("field, value, says", [
    ("indexer_types", ["shared"] + ["full"] * 7, "the first 'full'"),
    ("indexer_types", ["full"] * 7, "must list 8 entries"),
    ("index_topk_pattern", "FFXS", "must be a list of strs"),
    ("index_skip_topk_offset", "3", "must be an integer"),
])
def test_a_bad_glm5_indexer_layout_is_refused_naming_the_field(field, value, says) -> None:
    cfg = {"architectures": ["GlmMoeDsaForCausalLM"], **GLM_SMALL, field: value}
    with pytest.raises(ValueError, match=says):
        ModelSpec.from_hf_config(cfg)
