"""Mixtures of experts a planner brings as a config.json (OLMoE, FlexOlmo, Phi-3.5-MoE, Granite
MoE, Granite 4.0's Mamba-2 hybrids, Hunyuan-A13B, ERNIE-4.5 MoE, dots.llm1, GLM-4.7-Flash, EXAONE
MoE): the simulator counts
the parameters transformers builds, with the experts, shared experts and dense layers where
transformers puts them, and slides the layers HF's config slides."""

from __future__ import annotations

import pytest

from simulator.cost.models import ModelSpec
from tests.hf_meta import hf_on_meta as _hf

TINY = {"hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "vocab_size": 256,
        "max_position_embeddings": 16384, "tie_word_embeddings": False, "pad_token_id": 0}
_MIXTRAL = {"num_local_experts": 4, "num_experts_per_tok": 2}
_DEEPSEEK = {"n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
             "moe_intermediate_size": 32}
_MLA = {"kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
        "v_head_dim": 16, "head_dim": None}
_GRANITE_MAMBA = {"shared_intermediate_size": 48, "mamba_n_heads": 8, "mamba_d_state": 16,
                  "mamba_n_groups": 2, "mamba_d_conv": 4, "mamba_expand": 2,
                  "layer_types": ["mamba", "mamba", "attention"] * 2}
FAMILIES = {
    "olmoe": {"num_experts": 4, "num_experts_per_tok": 2},
    "flex_olmo": {"num_experts": 4, "num_experts_per_tok": 2},
    "phimoe": {**_MIXTRAL, "attention_bias": True, "lm_head_bias": True},
    "phimoe-window": {**_MIXTRAL, "sliding_window": 512},
    "granitemoe": _MIXTRAL,
    "granitemoeshared": {**_MIXTRAL, "shared_intermediate_size": 48},
    "granitemoeshared-unshared": _MIXTRAL,
    "hunyuan_v1_moe": {"num_experts": 4, "moe_topk": 2},
    "hunyuan_v1_moe-per-layer": {"num_experts": 4, "moe_topk": [2] * 6},
    "ernie4_5_moe": {"moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 32},
    "ernie4_5_moe-interleaved": {"moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 32,
                                 "moe_num_shared_experts": 0, "moe_layer_start_index": 0,
                                 "moe_layer_end_index": 4, "moe_layer_interval": 2},
    "ernie4_5_moe-tied-by-default": {"moe_num_experts": 4, "moe_k": 2,
                                     "moe_intermediate_size": 32, "tie_word_embeddings": None},
    "dots1": _DEEPSEEK,
    "dots1-first-dense": {**_DEEPSEEK, "first_k_dense_replace": 2},
    "dots1-window": {**_DEEPSEEK, "sliding_window": 512, "max_window_layers": 4},
    "glm4_moe_lite": {**_DEEPSEEK, **_MLA},
    "glm4_moe_lite-listed": {**_DEEPSEEK, **_MLA,
                             "mlp_layer_types": ["dense", "sparse", "dense"] + ["sparse"] * 3},
    "exaone_moe": {"num_experts": 8, "num_experts_per_tok": 2, "num_shared_experts": 1,
                   "moe_intermediate_size": 32, "sliding_window": 512},
    # Granite 4.0: Mamba-2 and attention layers, each with experts and a shared MLP, or (the
    # dense releases) the shared MLP alone; legacy and current layer-type names
    "granitemoehybrid": {**_MIXTRAL, **_GRANITE_MAMBA},
    "granitemoehybrid-dense": {**_GRANITE_MAMBA, "num_local_experts": 0,
                               "layer_types": ["linear_attention", "full_attention"] * 3},
    "granitemoehybrid-attention-only": {**_MIXTRAL, "shared_intermediate_size": 48,
                                        "layer_types": ["attention"] * 6,
                                        "position_embedding_type": "rope"},
    "exaone_moe-pattern": {"num_experts": 8, "num_experts_per_tok": 2, "num_shared_experts": 1,
                           "moe_intermediate_size": 32, "sliding_window": 512,
                           "sliding_window_pattern": 2, "first_k_dense_replace": 2},
}


def _config(case: str, drop: tuple[str, ...] = ()) -> tuple[str, dict]:
    cfg = {k: v for k, v in {**TINY, **FAMILIES[case]}.items()
           if v is not None and k not in drop}
    return case.split("-")[0], cfg


def _hf_mlp_layers(hf) -> tuple[int, int]:
    """(MoE layers, dense layers) of a transformers model, from its modules."""
    moe = dense = 0
    for layer in hf.model.layers:
        block = (getattr(layer, "block_sparse_moe", None) or getattr(layer, "mlp", None)
                 or layer.shared_mlp)  # (Granite 4.0's dense releases: the shared MLP alone)
        if hasattr(block, "experts"):
            moe += 1
        else:
            dense += 1
    return moe, dense


@pytest.mark.parametrize("case", FAMILIES)
def test_counts_experts_and_windows_equal_transformers(case):
    model_type, cfg = _config(case)
    hf_cfg, hf = _hf(model_type, cfg)
    spec = ModelSpec.from_hf_config({**cfg, "model_type": model_type})
    assert spec.num_params == sum(p.numel() for p in hf.parameters())
    dense = spec.num_dense_layers if spec.is_moe else spec.num_layers
    assert (spec.num_moe_layers, dense) == _hf_mlp_layers(hf)
    types = getattr(hf_cfg, "layer_types", None) or []
    assert spec.num_linear_layers == sum(t == "linear_attention" for t in types)
    window = getattr(hf_cfg, "sliding_window", None)
    if model_type == "phimoe":  # every layer slides when a window is set
        types = ["sliding_attention"] * cfg["num_hidden_layers"] if window else []
    sliding = sum(t == "sliding_attention" for t in types) if window else 0
    assert spec.num_sliding_layers == sliding
    assert spec.sliding_window == (window if sliding else 0)


# (transformers cannot build a Hunyuan MoE whose config states no head_dim)
@pytest.mark.parametrize("case", ["olmoe", "phimoe", "granitemoe", "ernie4_5_moe", "dots1",
                                  "exaone_moe"])
def test_a_config_without_head_dim_gets_the_config_class_head_size(case):
    model_type, cfg = _config(case, drop=("head_dim",))
    _, hf = _hf(model_type, cfg)
    spec = ModelSpec.from_hf_config({**cfg, "model_type": model_type})
    assert spec.num_params == sum(p.numel() for p in hf.parameters())


def test_the_mla_family_caches_the_latent():
    model_type, cfg = _config("glm4_moe_lite")
    spec = ModelSpec.from_hf_config({**cfg, "model_type": model_type})
    assert spec.is_mla
    assert spec.kv_bytes_per_token("bf16") == cfg["num_hidden_layers"] * (32 + 8) * 2


@pytest.mark.parametrize("case,field,message", [
    ("olmoe", "num_experts", "olmoe config is missing field 'num_experts'"),
    ("ernie4_5_moe", "moe_k", "ernie4_5_moe config is missing field 'moe_k'"),
    ("dots1", "moe_intermediate_size", "dots1 config is missing field 'moe_intermediate_size'"),
    ("hunyuan_v1_moe", "moe_topk", "hunyuan_v1_moe config is missing field 'moe_topk'"),
])
def test_a_missing_expert_field_is_refused_naming_it(case, field, message):
    model_type, cfg = _config(case, drop=(field,))
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_hf_config({**cfg, "model_type": model_type})


def test_per_layer_expert_counts_read_as_one_or_are_refused():
    """Hunyuan-A13B's own config.json lists `num_experts` and `moe_topk` per layer."""
    model_type, cfg = _config("hunyuan_v1_moe")
    listed = ModelSpec.from_hf_config({**cfg, "num_experts": [4] * 6, "moe_topk": [2] * 6,
                                       "model_type": model_type})
    assert listed == ModelSpec.from_hf_config({**cfg, "model_type": model_type})
    with pytest.raises(ValueError, match="field 'moe_topk' lists .*one positive integer"):
        ModelSpec.from_hf_config({**cfg, "moe_topk": [2, 2, 2, 1, 1, 1],
                                  "model_type": model_type})


def test_bad_mlp_layer_types_are_refused_naming_the_field():
    model_type, cfg = _config("glm4_moe_lite")
    cfg["mlp_layer_types"] = ["dense", "moe"] + ["sparse"] * 4
    with pytest.raises(ValueError, match="field 'mlp_layer_types' must list 6 entries"):
        ModelSpec.from_hf_config({**cfg, "model_type": model_type})


def test_a_biased_ernie_moe_is_refused_with_the_reason():
    model_type, cfg = _config("ernie4_5_moe")
    with pytest.raises(ValueError, match="field 'use_bias' is true"):
        ModelSpec.from_hf_config({**cfg, "use_bias": True, "model_type": model_type})


@pytest.mark.parametrize("change,message", [
    ({"layer_types": ["mamba"] * 6}, "every one of the 6 layers is Mamba-2"),
    ({"layer_types": ["mamba", "moe"] * 3}, "field 'layer_types' must list 6 entries"),
    ({"mamba_proj_bias": True}, "field 'mamba_proj_bias' is True"),
    ({"mamba_d_head": 7}, r"mamba_n_heads \(8\) x mamba_d_head \(7\) must equal"),
])
def test_granite_hybrid_configs_kvpd_cannot_price_are_refused(change, message):
    model_type, cfg = _config("granitemoehybrid")
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_hf_config({**cfg, **change, "model_type": model_type})
