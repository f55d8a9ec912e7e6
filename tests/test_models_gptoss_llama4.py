"""gpt-oss (MoE + alternating 128-token sliding windows) and Llama 4 (MoE with a shared
expert, interleaved dense layers, chunked local attention) from their HF configs, checked
against the parameter counts their model cards publish."""

from __future__ import annotations

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.models import ModelSpec, get_model


def test_gpt_oss_parameter_counts_match_the_model_card() -> None:
    """OpenAI gpt-oss model card (2025-08): 120b 116.83B total, 5.13B active with the
    unembedding; 20b 20.91B total, 3.61B active."""
    for name, total, active in (("gpt-oss-120b", 116.83e9, 5.13e9), ("gpt-oss-20b", 20.91e9, 3.61e9)):
        m = get_model(name)
        unembed = m.vocab_size * m.hidden_size
        assert m.num_params == pytest.approx(total, rel=0.002)
        assert m.num_active_params - m.embedding_params + unembed == pytest.approx(active, rel=0.01)
        assert (m.sliding_window, m.num_sliding_layers) == (128, m.num_layers // 2)


def test_llama4_text_config_experts_shared_expert_and_chunked_layers() -> None:
    """Meta's Llama 4 cards: Scout 17B active / 109B total (16 experts), Maverick 17B active /
    400B total (128 experts, MoE every other layer); the text model has ~1B fewer than the
    totals, which include the vision encoder."""
    scout, maverick = get_model("llama-4-scout"), get_model("llama-4-maverick")
    assert maverick.num_params == pytest.approx(400e9, rel=0.01)
    assert 105e9 < scout.num_params < 109e9
    for m in (scout, maverick):
        assert m.num_active_params == pytest.approx(17.2e9, rel=0.02)
        assert (m.num_shared_experts, m.shared_expert_ffn_size, m.experts_per_token) == (1, 8192, 1)
        assert (m.sliding_window, m.num_sliding_layers) == (8192, 36)
    assert (scout.num_dense_layers, maverick.num_dense_layers) == (0, 24)
    assert maverick.dense_ffn_size == 16384


def test_llama4_reads_the_multimodal_wrapper_and_names_a_missing_field() -> None:
    cfg = {"architectures": ["Llama4ForConditionalGeneration"],
           "text_config": {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                           "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 128,
                           "intermediate_size_mlp": 512, "num_local_experts": 4,
                           "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
                           "vocab_size": 1000, "attention_chunk_size": 64}}
    m = ModelSpec.from_hf_config(cfg)
    assert (m.num_experts, m.num_dense_layers, m.num_sliding_layers) == (4, 2, 3)
    del cfg["text_config"]["intermediate_size_mlp"]
    with pytest.raises(ValueError, match="llama4 config is missing field 'intermediate_size_mlp'"):
        ModelSpec.from_hf_config(cfg)


def test_new_models_price_and_plan_memory() -> None:
    """Decode steps get dearer with the batch (more experts touched) and an MXFP4 gpt-oss-120b
    fits one 80 GB part with KV room, as OpenAI states."""
    cm = CostModel("gpt-oss-120b", "h100-sxm", dtype="fp4", quantization="mxfp4")
    t = [cm.step_time(BatchShape.from_lists([1] * b, [1024] * b)) for b in (1, 4, 16, 64)]
    assert t == sorted(t) and t[-1] > 2 * t[0]
    from simulator.cost.memory_plan import plan_memory
    plan = plan_memory("gpt-oss-120b", "h100-sxm", dtype="fp4", quantization="mxfp4")
    assert plan.weight_bytes_per_gpu < 70e9 and plan.num_gpu_blocks > 0
    cm4 = CostModel("llama-4-maverick", "h200-sxm", tp=8, dtype="fp8")
    assert cm4.step_time(BatchShape.from_lists([4096], [0])) > 0


def test_interleaved_dense_layers_split_evenly_over_pipeline_stages():
    """Maverick's dense layers sit between its MoE ones (every other layer): each of two
    pipeline stages gets half of each kind, not all the dense ones first."""
    from simulator.cost.moe_cost import stage_layer_split

    maverick = get_model("llama-4-maverick")
    assert maverick.dense_layer_ids[:3] == (0, 2, 4)
    assert [stage_layer_split(maverick, (24, 24), s) for s in (0, 1)] == [(12, 12), (12, 12)]
    deepseek = get_model("deepseek-v3")  # its first three layers are the dense ones
    assert [stage_layer_split(deepseek, (30, 31), s) for s in (0, 1)] == [(3, 27), (0, 31)]
    pp2 = CostModel(maverick, "h200-sxm", tp=4, pp=2, dtype="fp8")
    t = [pp2._stages[s]["raw"]["moe_layers"] for s in (0, 1)]
    assert t == [12, 12]
