"""Dense families a planner brings as a config.json (Granite, SmolLM3, Seed-OSS, GLM-4, OLMo 1,
2 and 3, EXAONE 4, Hunyuan, ERNIE-4.5, Gemma 1, StarCoder2, Phi-2, StableLM, Command R and A,
Nemotron-4, GPT-NeoX, AFM, Helium, GLM-4-9B): the simulator counts the parameters transformers builds
for them and slides the layers HF's config slides, with HF's defaults for what a config omits."""

from __future__ import annotations

import pytest

from simulator.cost.models import ModelSpec
from tests.hf_meta import hf_on_meta as _hf

TINY = {"hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 256,
        "max_position_embeddings": 16384, "tie_word_embeddings": False, "pad_token_id": 0}
FAMILIES = {
    "granite": {}, "smollm3": {}, "seed_oss": {},
    "seed_oss-out-bias": {"attention_out_bias": True},
    "glm4": {}, "olmo2": {}, "olmo3": {}, "olmo3-window": {"sliding_window": 512},
    "exaone4": {}, "exaone4-pattern": {"sliding_window_pattern": 2, "sliding_window": 512},
    "hunyuan_v1_dense": {}, "ernie4_5": {}, "ernie4_5-biased": {"use_bias": True},
    "ernie4_5-tied-by-default": {"tie_word_embeddings": None},
    "gemma": {}, "gemma-tied-by-default": {"tie_word_embeddings": None},
    "starcoder2": {}, "starcoder2-unbiased": {"use_bias": False},
    "starcoder2-window": {"sliding_window": 512},
    "starcoder2-tied-by-default": {"tie_word_embeddings": None},
    "phi": {}, "stablelm": {}, "stablelm-parallel": {"use_parallel_residual": True},
    "stablelm-qkv-bias-qk-norm": {"use_qkv_bias": True, "qk_layernorm": True},
    "cohere": {}, "cohere-qk-norm": {"use_qk_norm": True, "attention_bias": True},
    "cohere-tied-by-default": {"tie_word_embeddings": None},
    "cohere2": {}, "cohere2-pattern": {"sliding_window": 512, "sliding_window_pattern": 2},
    "nemotron": {}, "nemotron-biased": {"attention_bias": True, "mlp_bias": True},
    "gpt_neox": {}, "gpt_neox-unbiased": {"attention_bias": False},
    "olmo": {}, "arcee": {}, "helium": {}, "glm": {},
}
# families whose config class gives a head size other than hidden / heads when none is stated
# (Helium's default of 128 is not among them: transformers builds its o_proj on the hidden
# size, so only a config whose heads x head size is the hidden size builds)
HEAD_DIM_DEFAULTS = {"qwen3": {}, "seed_oss": {}, "glm4": {}, "ernie4_5": {}, "gemma": {},
                     "glm": {}, "gemma2": {},
                     "gemma3_text": {},
                     "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2},
                     "minimax_m2": {"num_local_experts": 4, "num_experts_per_tok": 2}}


@pytest.mark.parametrize("case", FAMILIES)
def test_counts_and_windows_equal_transformers(case):
    model_type = case.split("-")[0]
    cfg = {k: v for k, v in {**TINY, **FAMILIES[case]}.items() if v is not None}
    hf_cfg, hf = _hf(model_type, cfg)
    spec = ModelSpec.from_hf_config({**cfg, "model_type": model_type})
    assert spec.num_params == sum(p.numel() for p in hf.parameters())
    types = getattr(hf_cfg, "layer_types", None) or []
    window = getattr(hf_cfg, "sliding_window", None)
    if model_type == "starcoder2":  # HF's mask slides every layer when a window is set
        types = ["sliding_attention"] * cfg["num_hidden_layers"]
    sliding = sum(t == "sliding_attention" for t in types) if window else 0
    assert spec.num_sliding_layers == sliding
    assert spec.sliding_window == (window if sliding else 0)


@pytest.mark.parametrize("model_type", HEAD_DIM_DEFAULTS)
def test_a_config_without_head_dim_gets_the_config_class_default(model_type):
    cfg = {k: v for k, v in {**TINY, **HEAD_DIM_DEFAULTS[model_type]}.items() if k != "head_dim"}
    hf_cfg, hf = _hf(model_type, cfg)
    spec = ModelSpec.from_hf_config({**cfg, "model_type": model_type})
    assert spec.head_dim == hf_cfg.head_dim != TINY["hidden_size"] // TINY["num_attention_heads"]
    assert spec.num_params == sum(p.numel() for p in hf.parameters())


def test_a_string_window_pattern_is_refused_naming_the_field():
    """EXAONE 4's docs spell the pattern "LLLG", which transformers' config cannot use."""
    with pytest.raises(ValueError, match="field 'sliding_window_pattern' must be a non-negative "
                                         "integer, got 'LLLG'"):
        ModelSpec.from_hf_config({**TINY, "model_type": "exaone4",
                                  "sliding_window": 4096, "sliding_window_pattern": "LLLG"})
