"""The 2026 releases in the catalog and their config.json families: MiniMax-M2 (a Mixtral-style
MoE of explicit head size), and multimodal releases priced as their text model (Kimi-K2.5,
Qwen3-VL)."""

from __future__ import annotations

import json

import pytest

from simulator.cost.models import ModelSpec, get_model

# MiniMax-M2.5's config.json fields (MiniMaxAI/MiniMax-M2.5), trimmed to what a server reads
MINIMAX_M2 = {"architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
              "num_hidden_layers": 62, "hidden_size": 3072, "num_attention_heads": 48,
              "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 1536,
              "num_local_experts": 256, "num_experts_per_tok": 8, "use_qk_norm": True,
              "qk_norm_type": "per_layer", "shared_intermediate_size": 0,
              "scoring_func": "sigmoid", "vocab_size": 200064,
              "max_position_embeddings": 196608, "tie_word_embeddings": False,
              "quantization_config": {"quant_method": "fp8", "fmt": "float8_e4m3fn",
                                      "weight_block_size": [128, 128]}}


def test_minimax_m2_reads_as_a_mixture_of_experts_with_its_own_head_size():
    m = ModelSpec.from_hf_config(MINIMAX_M2, name="m2")
    assert (m.num_experts, m.experts_per_token, m.ffn_size) == (256, 8, 1536)
    assert (m.num_heads, m.num_kv_heads, m.head_dim) == (48, 8, 128)  # 48 x 128 != 3,072
    assert m.qk_norm and m.num_shared_experts == 0 and m.num_dense_layers == 0
    # KV per token: 2 x 62 layers x 8 heads x 128 x 2 bytes
    assert m.kv_bytes_per_token("bf16") == 2 * 62 * 8 * 128 * 2
    # the release's FP8 block-scaled weights are its checkpoint quantization, on every matrix
    assert (m.checkpoint_quant_method, m.checkpoint_quant_scope) == ("fp8", "all")
    assert get_model("MiniMaxAI/MiniMax-M2.5").num_params == m.num_params


def test_minimax_m2_catalog_entry_matches_the_model_card():
    """229B parameters, 10B activated per token (the model card's figures; kvpd's active count
    includes the embedding and LM head, 2 x 200,064 x 3,072)."""
    m = get_model("minimax-m2.5")
    assert round(m.num_params / 1e9) == 229
    embed_and_head = 2 * 200_064 * 3072
    assert round((m.num_active_params - embed_and_head) / 1e9) == 10
    m27 = get_model("MiniMaxAI/MiniMax-M2.7")
    assert m27.num_params == m.num_params and m27.max_position_embeddings == 204_800


def test_minimax_m2_without_its_expert_count_is_refused_naming_the_field():
    cfg = {k: v for k, v in MINIMAX_M2.items() if k != "num_local_experts"}
    with pytest.raises(ValueError, match="num_local_experts"):
        ModelSpec.from_hf_config(cfg)


def test_kimi_k25_is_priced_as_its_text_model(tmp_path):
    """Kimi-K2.5's config.json nests a DeepSeek-V3 text model under `text_config` beside a
    vision tower; kvpd reads the text model (Kimi-K2-0905's shapes)."""
    k2 = get_model("kimi-k2-0905")
    text = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
            "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 64,
            "num_key_value_heads": 64, "intermediate_size": 18432, "moe_intermediate_size": 2048,
            "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512,
            "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "vocab_size": 163840, "max_position_embeddings": 262144,
            "tie_word_embeddings": False}
    cfg = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
           "text_config": text, "vision_config": {"hidden_size": 1152}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = get_model(str(tmp_path / "config.json"))
    assert m.is_mla and m.num_experts == 384 and m.max_position_embeddings == 262_144
    assert m.num_params == k2.num_params
    assert m.kv_bytes_per_token("bf16") == k2.kv_bytes_per_token("bf16")
    # without `architectures`, the model_type names the family
    no_arch = {k: v for k, v in cfg.items() if k != "architectures"}
    assert ModelSpec.from_hf_config(no_arch).num_params == k2.num_params
    assert get_model("moonshotai/Kimi-K2.5").num_params == k2.num_params
    assert get_model("nvidia/Kimi-K2.6-NVFP4").name == "kimi-k2.5"


@pytest.mark.parametrize("vl, text", [("qwen3-vl-30b-a3b", "qwen3-30b-a3b-2507"),
                                      ("qwen3-vl-235b-a22b", "qwen3-235b-a22b-2507")])
def test_qwen3_vl_moe_releases_are_their_text_models(vl: str, text: str):
    a, b = get_model(vl), get_model(text)
    assert a.architecture == "Qwen3VLMoeForConditionalGeneration"
    assert (a.num_params, a.num_active_params, a.max_position_embeddings) == (
        b.num_params, b.num_active_params, b.max_position_embeddings)


def test_a_dense_qwen3_vl_config_json_reads_its_text_config():
    cfg = {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
           "text_config": {"model_type": "qwen3_vl_text", "num_hidden_layers": 36,
                           "hidden_size": 4096, "num_attention_heads": 32,
                           "num_key_value_heads": 8, "head_dim": 128,
                           "intermediate_size": 12288, "vocab_size": 151936,
                           "max_position_embeddings": 262144, "tie_word_embeddings": False},
           "vision_config": {"depth": 27}}
    m, q3 = ModelSpec.from_hf_config(cfg, name="vl-8b"), get_model("qwen3-8b")
    assert m.qk_norm and m.num_params == q3.num_params and m.max_position_embeddings == 262_144


def test_glm_52_runs_an_indexer_on_21_of_its_78_layers():
    """GLM-5.2's config.json: index_topk_freq 4 from index_skip_topk_offset 3 (layers 0-2, 6,
    10, ..., 78 - 2 own indexers; the rest reuse the previous layer's top-k)."""
    g5, g52 = get_model("glm-5"), get_model("zai-org/GLM-5.2-FP8")
    assert (g5.num_index_layers, g52.num_index_layers) == (0, 21)  # 0: every layer's own
    assert g52.max_position_embeddings == 1_048_576 and g52.num_params < g5.num_params


@pytest.mark.parametrize("name, billions", [("Qwen/Qwen3-0.6B", 0.6), ("Qwen/Qwen3-1.7B", 1.7)])
def test_small_qwen3_match_their_model_cards(name: str, billions: float):
    """Qwen3-0.6B and 1.7B: the model cards' 0.6B and 1.7B, with tied embeddings."""
    m = get_model(name)
    assert m.tie_word_embeddings and round(m.num_params / 1e9, 1) == billions


@pytest.mark.parametrize("export, entry", [
    ("nvidia/Qwen3-235B-A22B-NVFP4", "qwen3-235b-a22b"),
    ("nvidia/DeepSeek-V3.2-NVFP4", "deepseek-v3.2"),
    ("nvidia/GLM-5.1-NVFP4", "glm-5"),
    ("nvidia/MiniMax-M2.5-NVFP4", "minimax-m2.5"),
    ("Qwen/Qwen3.6-35B-A3B", "qwen3.5-35b-a3b"),
])
def test_nvidia_fp4_exports_and_same_shape_releases_are_aliases(export: str, entry: str):
    assert get_model(export).name == entry
