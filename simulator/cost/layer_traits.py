"""What each decoder family's layers carry besides their matrices, as transformers builds them:
biases, the kind and number of norms, q/k norms, a gated or plain MLP, an LM-head bias, the
head size and embedding tie its config class assumes when a config.json is silent
(`hf_config.hf_config_fields` reads them for every family of Llama's decoder shape)."""

from __future__ import annotations

from typing import Any

from simulator.cost.model_variants import SINK_FAMILIES

# families whose HF config class defaults `attention_bias` (or their one bias switch) to true
# (GptOssConfig, Glm4Config, GlmConfig, SeedOssConfig, GPTNeoXConfig; Starcoder2Config's
# `use_bias`)
BIASED_BY_DEFAULT = ("gpt_oss", "glm4", "glm", "seed_oss", "gpt_neox", "starcoder2")
# the key that switches the q/k/v (and o) biases where it is not `attention_bias`
BIAS_KEY = {"ernie4_5": "use_bias", "ernie4_5_moe": "use_bias", "starcoder2": "use_bias",
            "stablelm": "use_qkv_bias"}
# families whose one `use_bias` switch also puts biases on the MLP (Ernie4_5Config,
# Starcoder2Config)
USE_BIAS_FAMILIES = ("ernie4_5", "ernie4_5_moe", "starcoder2")
# biases on q/k/v only, none on o_proj (GLM-4's, GLM-4-9B's, StableLM's `use_qkv_bias`)
NO_O_BIAS_FAMILIES = ("glm4_moe", "glm4", "glm", "stablelm")
# families whose o_proj bias has a key of its own (SeedOssConfig's `attention_out_bias`)
O_BIAS_KEY = {"seed_oss": "attention_out_bias"}
# MLA's projections take no q/k/v bias whatever `attention_bias` says (kvpd's count)
NO_QKV_BIAS_FAMILIES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm_moe_dsa",
                        "glm4_moe_lite")
# biases on every attention and MLP matrix and the LM head, whatever the config (Phi-2)
ALWAYS_BIASED = ("phi",)
# MLP biases whatever the config (GPT-NeoX's dense_h_to_4h and dense_4h_to_h)
ALWAYS_MLP_BIAS = ("phi", "gpt_neox")
# per-head q/k RMSNorms (Qwen3's kind) and norms across all heads (OLMo 2 / 3's, MiniMax-M2's)
QK_NORM_FAMILIES = ("qwen3", "gemma3", "qwen3_5", "exaone4", "hunyuan_v1_dense", "hunyuan_v1_moe",
                    "dots1", "exaone_moe")
QK_NORM_ACROSS_HEADS = ("minimax_m2", "olmo2", "olmo3", "olmoe", "flex_olmo")
# a q/k norm a config switches on that spans every head (one weight per head and dim: Cohere's
# `use_qk_norm`, StableLM 2's `qk_layernorm`), and the key that switches it
QK_NORM_ACROSS_KEY = {"cohere": "use_qk_norm", "stablelm": "qk_layernorm"}
# norms on each sublayer's output as well as its input (Gemma 2 / 3, GLM-4's dense models)
SANDWICH_FAMILIES = ("gemma2", "gemma3", "glm4")
# LayerNorms (weight and bias) instead of RMSNorms; OLMo 1's have no weights at all
LAYER_NORM_FAMILIES = ("phimoe", "starcoder2", "phi", "stablelm", "nemotron", "gpt_neox")
WEIGHTLESS_NORM_FAMILIES = ("olmo",)
# attention and MLP read one norm's output (Phi-2, Cohere; StableLM with use_parallel_residual)
PARALLEL_BLOCK_FAMILIES = ("phi", "cohere", "cohere2")
# two-matrix MLPs (up, activation, down) instead of gated ones
PLAIN_MLP_FAMILIES = ("starcoder2", "phi", "nemotron", "gpt_neox", "arcee")
# families whose config defaults tie the LM head to the embeddings (transformers' configs)
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "ernie4_5", "ernie4_5_moe", "starcoder2",
                   "cohere", "cohere2")
# the head size HF's config class gives a family whose config.json states none (others:
# hidden_size / num_attention_heads)
HEAD_DIM_DEFAULTS = {"qwen3": 128, "seed_oss": 128, "glm4": 128, "glm": 128, "ernie4_5": 128,
                     "helium": 128, "gemma": 256, "gemma2": 256, "gemma3": 256, "gpt_oss": 64,
                     "minimax_m2": 128}
# as many key/value heads as query heads, whatever `num_key_value_heads` says (GPT-NeoX)
NO_GQA_FAMILIES = ("gpt_neox",)
# families with biases on every expert's matrices and on the router (gpt-oss's MoE)
EXPERT_BIAS_FAMILIES = ("gpt_oss",)


def _flag(cfg: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{where}: field {key!r} must be true or false, got {value!r}")
    return value


def layer_traits(cfg: dict[str, Any], fam: str, where: str) -> dict[str, Any]:
    """`ModelSpec` fields of family `fam`'s layers beyond their shapes (see the module
    docstring); ValueError naming the field for one kvpd cannot price."""
    if fam == "phi" and cfg.get("qk_layernorm"):
        raise ValueError(f"{where}: field 'qk_layernorm' is true; kvpd prices Phi-2's layers as "
                         "released, without q/k LayerNorms")
    default = fam in BIASED_BY_DEFAULT
    attention_bias = fam in ALWAYS_BIASED or _flag(cfg, BIAS_KEY.get(fam, "attention_bias"),
                                                   default, where)
    if fam in USE_BIAS_FAMILIES:
        mlp_bias = _flag(cfg, "use_bias", default, where)
    else:
        mlp_bias = fam in ALWAYS_MLP_BIAS or _flag(cfg, "mlp_bias", False, where)
    across = fam in QK_NORM_ACROSS_HEADS or (
        fam in QK_NORM_ACROSS_KEY and _flag(cfg, QK_NORM_ACROSS_KEY[fam], False, where))
    parallel = fam in PARALLEL_BLOCK_FAMILIES or (
        fam == "stablelm" and _flag(cfg, "use_parallel_residual", False, where))
    return dict(
        qkv_bias=fam in ("qwen2", "qwen2_moe") or (attention_bias
                                                  and fam not in NO_QKV_BIAS_FAMILIES),
        o_bias=(_flag(cfg, O_BIAS_KEY[fam], False, where) if fam in O_BIAS_KEY
                else attention_bias and fam not in NO_O_BIAS_FAMILIES),
        mlp_bias=mlp_bias,
        gated_mlp=fam not in PLAIN_MLP_FAMILIES,
        norm=("layer" if fam in LAYER_NORM_FAMILIES
              else "none" if fam in WEIGHTLESS_NORM_FAMILIES else "rms"),
        parallel_block=parallel,
        lm_head_bias=fam in ALWAYS_BIASED or (fam == "phimoe"
                                              and _flag(cfg, "lm_head_bias", False, where)),
        qk_norm=(fam in QK_NORM_FAMILIES or across
                 or (fam not in QK_NORM_ACROSS_KEY and bool(cfg.get("use_qk_norm", False)))),
        sandwich_norms=fam in SANDWICH_FAMILIES,
        qk_norm_across_heads=across,  # HF: q_norm over heads x head_dim
        qk_norm_weightless=fam == "llama4",  # HF: Llama4TextWeightlessRMSNorm
        attention_sinks=fam in SINK_FAMILIES, expert_bias=fam in EXPERT_BIAS_FAMILIES)
