"""Hugging Face `config.json` -> `ModelSpec` field values, for the Llama, Mistral, Qwen2, Qwen3
(dense), Phi-3/Phi-4, Gemma 1, 2 and 3, Mixtral, GPT-2 and OPT families, StarCoder2, Phi-2,
StableLM, Cohere's Command R and A, Nemotron-4, GPT-NeoX, OLMo 1, AFM, Helium, GLM-4-9B, the
dense Granite 3,
SmolLM3, Seed-OSS, GLM-4-0414, OLMo 2 and 3, EXAONE 4, Hunyuan and ERNIE-4.5 models (Llama's
layers with their own biases, q/k norms, post-sublayer norms and sliding layers), the mixtures
of experts and
attention variants whose extra fields `model_variants.py` reads (Qwen2/3-MoE, DeepSeek-V2/V3
with MLA and V3.2 with sparse attention, GLM-4.5/4.6, GLM-5, gpt-oss, MiniMax-M2, Llama 4, and
Qwen3-Next and Qwen3.5 with Gated DeltaNet linear attention), the text models of the
multimodal releases built on them (Kimi-K2.5, Qwen3-VL), the mixtures of experts whose keys
`moe_families.py` reads (OLMoE, FlexOlmo, Phi-3.5-MoE, Granite MoE, Hunyuan-A13B, ERNIE-4.5 MoE,
dots.llm1, GLM-4.7-Flash, EXAONE MoE), and Nemotron-H's Mamba-2 hybrids (`hybrid_blocks.py`).
Errors name the config and the field."""

from __future__ import annotations

from typing import Any

from simulator.cost.hybrid_blocks import GRANITE_HYBRID, granite_hybrid_fields, nemotron_h_fields
from simulator.cost.layer_traits import (
    HEAD_DIM_DEFAULTS,
    NO_GQA_FAMILIES,
    TIED_BY_DEFAULT,
    layer_traits,
)
from simulator.cost.model_variants import (
    dsa_fields,
    linear_attention_fields,
    mla_fields,
    moe_fields,
    window_fields,
)
from simulator.cost.moe_families import more_moe_fields

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "GPT2LMHeadModel": "gpt2",
    "OPTForCausalLM": "opt",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa",  # GLM-5: DeepSeek-V3.2's architecture
    "Glm4MoeForCausalLM": "glm4_moe",
    "GptOssForCausalLM": "gpt_oss",
    "MiniMaxM2ForCausalLM": "minimax_m2",
    "Llama4ForConditionalGeneration": "llama4",  # the text model (text_config) only
    "Llama4ForCausalLM": "llama4",
    "Phi3ForCausalLM": "phi3",  # Phi-3 and Phi-4 (fused projections: the same weights)
    # dense models of Llama's shape: IBM Granite 3 (its scalar multipliers are no weights),
    # SmolLM3 (NoPE layers cost as rotary ones)
    "GraniteForCausalLM": "llama",
    "SmolLM3ForCausalLM": "llama",
    "SeedOssForCausalLM": "seed_oss",  # q/k/v biases, o_proj's apart (attention_out_bias)
    "Glm4ForCausalLM": "glm4",  # GLM-4-0414 dense: q/k/v biases, post-sublayer norms
    "Olmo2ForCausalLM": "olmo2",  # q/k norms across the heads, norms after each sublayer
    "Olmo3ForCausalLM": "olmo3",  # OLMo 2's layers, 3 sliding to 1 full
    "Exaone4ForCausalLM": "exaone4",  # per-head q/k norms, sliding and full layers
    "HunYuanDenseV1ForCausalLM": "hunyuan_v1_dense",  # per-head q/k norms
    "Ernie4_5ForCausalLM": "ernie4_5",  # biases on every matrix or none (`use_bias`)
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # the text model (text_config) only
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",  # the text model (text_config) only
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",  # the text model (text_config) only
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
    # multimodal releases whose text model is an architecture above (text_config only)
    "KimiK25ForConditionalGeneration": "deepseek_v3",  # Kimi-K2.5 / K2.6: DeepSeek-V3's
    "Qwen3VLForConditionalGeneration": "qwen3",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_moe",
    # Mamba-2 / attention / MLP or MoE blocks (Nemotron-H, Nemotron-Nano-2, Nemotron-3)
    "NemotronHForCausalLM": "nemotron_h",
    # IBM Granite 4.0: Mamba-2 and attention layers, each with an MoE and a shared MLP (or that
    # MLP alone), Granite 3's multipliers (hybrid_blocks.py)
    "GraniteMoeHybridForCausalLM": "granitemoehybrid",
    # mixtures of experts whose keys moe_families.py reads
    "OlmoeForCausalLM": "olmoe",  # OLMoE: q/k norms across the heads
    "FlexOlmoForCausalLM": "flex_olmo",  # OLMo 2's layers with OLMoE's experts
    "PhimoeForCausalLM": "phimoe",  # Phi-3.5-MoE: LayerNorms, biases, an LM-head bias
    "GraniteMoeForCausalLM": "granitemoe",
    "GraniteMoeSharedForCausalLM": "granitemoeshared",  # and one shared MLP
    "HunYuanMoEV1ForCausalLM": "hunyuan_v1_moe",  # Hunyuan-A13B: per-head q/k norms
    "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",  # ERNIE-4.5-21B-A3B, 300B-A47B
    "Dots1ForCausalLM": "dots1",  # dots.llm1: DeepSeek's MoE, per-head q/k norms
    "Glm4MoeLiteForCausalLM": "glm4_moe_lite",  # GLM-4.7-Flash: DeepSeek's MoE and MLA
    "ExaoneMoeForCausalLM": "exaone_moe",  # EXAONE 4's attention, DeepSeek's MoE
    # more dense decoders (their norms, biases and MLPs in layer_traits.py)
    "GemmaForCausalLM": "gemma",  # Gemma 1: GeGLU, 256-wide heads, tied embeddings
    "Starcoder2ForCausalLM": "starcoder2",  # LayerNorms, biases, a plain MLP, a sliding window
    "PhiForCausalLM": "phi",  # Phi-1 / 2: one LayerNorm per layer, biases, a plain MLP
    "StableLmForCausalLM": "stablelm",  # StableLM 2 / 3B: LayerNorms, optional parallel block
    "CohereForCausalLM": "cohere",  # Command R / R+: one norm per layer
    "Cohere2ForCausalLM": "cohere2",  # Command R7B / A: one norm per layer, 3 sliding to 1
    "NemotronForCausalLM": "nemotron",  # Nemotron-4 / Minitron: LayerNorms, squared-ReLU MLP
    "GPTNeoXForCausalLM": "gpt_neox",  # Pythia, GPT-NeoX-20B: LayerNorms, biases, plain MLP
    "OlmoForCausalLM": "olmo",  # OLMo 1: LayerNorms without weights
    "ArceeForCausalLM": "arcee",  # AFM-4.5B: squared-ReLU plain MLP
    "HeliumForCausalLM": "helium",  # Kyutai Helium: 128-wide heads
    "GlmForCausalLM": "glm",  # GLM-4-9B: q/k/v biases, 128-wide heads
}
# families whose multimodal config.json nests the text model's fields under `text_config`
TEXT_CONFIG_FAMILIES = ("llama4", "gemma3", "qwen3_5", "qwen3_5_moe", "deepseek_v3", "qwen3",
                        "qwen3_moe")
# model_type values (no `architectures`) of a family named otherwise
MODEL_TYPE_FAMILIES = {"gemma3_text": "gemma3", "llama4_text": "llama4", "qwen3_5_text": "qwen3_5",
                       "qwen3_5_moe_text": "qwen3_5_moe", "kimi_k25": "deepseek_v3",
                       "kimi_k2": "deepseek_v3", "qwen3_vl": "qwen3", "qwen3_vl_text": "qwen3",
                       "qwen3_vl_moe": "qwen3_moe", "qwen3_vl_moe_text": "qwen3_moe",
                       "granite": "llama", "smollm3": "llama"}


def _family(cfg: dict[str, Any], where: str) -> tuple[str, str]:
    archs = cfg.get("architectures")
    if archs:
        if isinstance(archs, str):
            archs = [archs]
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise ValueError(f"{where}: field 'architectures' must be a list of class names "
                             f"(e.g. [\"LlamaForCausalLM\"]), got {archs!r}")
        for arch in archs:
            if arch in SUPPORTED_ARCHITECTURES:
                return arch, SUPPORTED_ARCHITECTURES[arch]
        raise ValueError(
            f"{where}: unsupported architectures {list(archs)}; supported: "
            + ", ".join(SUPPORTED_ARCHITECTURES))
    model_type = cfg.get("model_type")
    model_type = MODEL_TYPE_FAMILIES.get(model_type, model_type)
    for arch, fam in SUPPORTED_ARCHITECTURES.items():
        if model_type == fam:
            return arch, fam
    raise ValueError(
        f"{where}: no 'architectures' and unsupported model_type {model_type!r}; supported "
        "architectures: " + ", ".join(SUPPORTED_ARCHITECTURES))


def _head_dim(d: int, heads: int, where: str, d_key: str, heads_key: str) -> int:
    """The default head size, d // heads (HF's), refused where it would be 0."""
    if d < heads:
        raise ValueError(f"{where}: {d_key}={d} is smaller than {heads_key}={heads}, so the "
                         f"head size ({d_key} // {heads_key}) would be 0")
    return d // heads


def _int(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"{where}: missing field {key!r} (a positive integer)")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where}: field {key!r} must be a positive integer, got {value!r}")
    return value


# config.json quant_method -> kvpd quantization method (others: priced as stored unquantized)
CHECKPOINT_METHODS = {"mxfp4": "mxfp4", "fp8": "fp8", "awq": "awq", "gptq": "gptq"}


def _compressed_tensors(q: dict[str, Any]) -> tuple[str, int] | None:
    """(kvpd method, group size) of a `compressed-tensors` checkpoint whose one scheme kvpd
    prices: 4-bit integer weights with 16-bit activations (W4A16, which vLLM runs on its Marlin
    kernels, as GPTQ: `gptq` with the scheme's group size, -1 per channel), or FP8 weights
    (`fp8`). None for any other scheme or more than one."""
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        return None
    scheme = next(iter(groups.values()))
    weights = scheme.get("weights") if isinstance(scheme, dict) else None
    if not isinstance(weights, dict):
        return None
    kind, bits = weights.get("type"), weights.get("num_bits")
    if kind == "float" and bits == 8:
        return "fp8", 0
    if kind != "int" or bits != 4 or scheme.get("input_activations") is not None:
        return None
    strategy, group = weights.get("strategy"), weights.get("group_size")
    if strategy == "group" and isinstance(group, int) and group > 0:
        return "gptq", group
    return ("gptq", -1) if strategy == "channel" else None


# NVIDIA ModelOpt's `quant_algo` -> kvpd quantization method (its exports' config.json
# quantization_config, quant_method "modelopt", or hf_quant_config.json's "quantization")
MODELOPT_ALGOS = {"nvfp4": "nvfp4", "fp8": "fp8"}
# the attention projections a left-out module name can name (Llama's, MLA's, fused ones)
QKV_NAMES = ("q_proj", "k_proj", "v_proj", "qkv_proj", "q_a_proj", "q_b_proj", "kv_a_proj",
             "kv_b_proj")


def _skipped_scope(skipped: list[str], is_moe: bool, has_dense_mlp: bool) -> str:
    """The quantization scope a checkpoint's left-out module names give (a precision.SCOPES
    name): nothing of the attention left out, `all`; the q/k/v projections but not the output
    one, `mlp_and_o_proj`; the whole attention (`self_attn*`), `mlp` for a dense model and for
    an MoE whose dense MLPs and shared experts stay in; the attention and those (or an MoE with
    none), `experts`."""
    attn = [m for m in skipped if "attn" in m or "attention" in m]
    if not attn:
        return "all"
    if all(any(n in m for n in QKV_NAMES) for m in attn):  # named projections, no o_proj
        return "mlp_and_o_proj"
    if not is_moe:
        return "mlp"
    dense_out = any("shared_expert" in m or ("mlp" in m and "_proj" in m and ".experts" not in m)
                    for m in skipped)
    return "experts" if dense_out or not has_dense_mlp else "mlp"


def _modelopt(q: dict[str, Any]) -> tuple[str, list[str]] | None:
    """(kvpd method, left-out module names) of a ModelOpt export's quantization config (flat,
    as config.json carries it, or under `quantization`, as hf_quant_config.json does); None
    for an algorithm kvpd does not price (W4A8 AWQ, mixed precision)."""
    inner = q.get("quantization") if isinstance(q.get("quantization"), dict) else q
    method = MODELOPT_ALGOS.get(str(inner.get("quant_algo", "")).strip().lower())
    if method is None:
        return None
    return method, [str(m) for m in inner.get("exclude_modules") or inner.get("ignore") or ()]


def checkpoint_quantization(cfg: dict[str, Any], is_moe: bool,
                            has_dense_mlp: bool = False) -> dict[str, Any]:
    """`checkpoint_quant_method` / `_scope` / `_group_size` from config.json's
    `quantization_config`: the method when kvpd models it, and the scope its left-out modules
    give (`_skipped_scope`: `modules_to_not_convert`, as gpt-oss's MXFP4 release names them;
    compressed-tensors' `ignore`, as Kimi-K2.5's INT4 release; ModelOpt's `exclude_modules`,
    as NVIDIA's NVFP4 exports). `has_dense_mlp`: the MoE has shared experts or dense layers."""
    q = cfg.get("quantization_config")
    if not isinstance(q, dict):
        return {}
    quant_method = str(q.get("quant_method", "")).strip().lower()
    group = 0
    if quant_method == "compressed-tensors":
        found = _compressed_tensors(q)
        if found is None:
            return {}
        method, group = found
        skipped = [str(m) for m in q.get("ignore") or ()]
    elif quant_method == "modelopt" or (not quant_method and "quantization" in q):
        found_mo = _modelopt(q)
        if found_mo is None:
            return {}
        method, skipped = found_mo
    else:
        method = CHECKPOINT_METHODS.get(quant_method)
        if method is None:
            return {}
        skipped = [str(m) for m in q.get("modules_to_not_convert") or ()]
    return {"checkpoint_quant_method": method,
            "checkpoint_quant_scope": _skipped_scope(skipped, is_moe, has_dense_mlp),
            "checkpoint_quant_group_size": group}


def hf_config_fields(cfg: dict[str, Any], name: str | None, where: str) -> dict[str, Any]:
    """`ModelSpec` field values of a Hugging Face config.json mapping; ValueError naming
    `where` and the field for a missing or bad one."""
    if not isinstance(cfg, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    arch, fam = _family(cfg, where)
    name = name or str(cfg.get("_name_or_path") or fam)
    if fam in TEXT_CONFIG_FAMILIES and isinstance(cfg.get("text_config"), dict):  # multimodal
        # (a release's quantization_config sits beside text_config, and covers the text model)
        quant = cfg.get("quantization_config")
        cfg = {**cfg["text_config"], "architectures": [arch]}
        if quant is not None and "quantization_config" not in cfg:
            cfg["quantization_config"] = quant
    if fam == "gpt2":
        d = _int(cfg, "n_embd", where)
        heads = _int(cfg, "n_head", where)
        n_pos = _int(cfg, "n_positions", where, 1024)
        spec = dict(
            name=name, architecture=arch, num_layers=_int(cfg, "n_layer", where),
            hidden_size=d, num_heads=heads, num_kv_heads=heads,
            head_dim=_head_dim(d, heads, where, "n_embd", "n_head"),
            ffn_size=_int(cfg, "n_inner", where, 4 * d), vocab_size=_int(cfg, "vocab_size", where),
            max_position_embeddings=n_pos, tie_word_embeddings=True, gated_mlp=False,
            qkv_bias=True, o_bias=True, mlp_bias=True, norm="layer", num_learned_positions=n_pos)
    elif fam == "opt":
        d = _int(cfg, "hidden_size", where)
        heads = _int(cfg, "num_attention_heads", where)
        max_pos = _int(cfg, "max_position_embeddings", where)
        bias = bool(cfg.get("enable_bias", True))
        proj = _int(cfg, "word_embed_proj_dim", where, d)
        spec = dict(
            name=name, architecture=arch, num_layers=_int(cfg, "num_hidden_layers", where),
            hidden_size=d, num_heads=heads, num_kv_heads=heads,
            head_dim=_head_dim(d, heads, where, "hidden_size", "num_attention_heads"),
            ffn_size=_int(cfg, "ffn_dim", where), vocab_size=_int(cfg, "vocab_size", where),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)), gated_mlp=False,
            qkv_bias=bias, o_bias=bias, mlp_bias=bias, norm="layer",
            num_learned_positions=max_pos + 2,  # OPTLearnedPositionalEmbedding offset of 2
            embed_proj_dim=proj if proj != d else 0,
            final_norm=bool(cfg.get("do_layer_norm_before", True)))
    elif fam == "nemotron_h":  # blocks paired into layers (hybrid_blocks.py)
        hybrid = nemotron_h_fields(cfg, where)
        spec = dict(
            name=name, architecture=arch, hidden_size=_int(cfg, "hidden_size", where),
            vocab_size=_int(cfg, "vocab_size", where),
            max_position_embeddings=_int(cfg, "max_position_embeddings", where, 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", False)),
            o_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)), norm="rms", **hybrid)
    else:  # llama, mistral, qwen2, qwen3 and the MoE / MLA families
        d = _int(cfg, "hidden_size", where)
        heads = _int(cfg, "num_attention_heads", where)
        layers = _int(cfg, "num_hidden_layers", where)  # (the variant fields index layers by it)
        variant = {**moe_fields(cfg, fam, where), **more_moe_fields(cfg, fam, where),
                   **mla_fields(cfg, fam, where),
                   **dsa_fields(cfg, fam, where), **window_fields(cfg, fam, where),
                   **linear_attention_fields(cfg, fam, where),
                   **(granite_hybrid_fields(cfg, where) if fam == GRANITE_HYBRID else {})}
        traits = layer_traits(cfg, fam, where)
        traits["qk_norm"] = traits["qk_norm"] or bool(variant.pop("qk_norm", False))
        spec = dict(
            name=name, architecture=arch, num_layers=layers, hidden_size=d, num_heads=heads,
            num_kv_heads=(heads if fam in NO_GQA_FAMILIES
                          else _int(cfg, "num_key_value_heads", where, heads)),
            head_dim=variant.pop("head_dim", None) or (
                _int(cfg, "head_dim", where) if cfg.get("head_dim") is not None
                else HEAD_DIM_DEFAULTS.get(fam)
                or _head_dim(d, heads, where, "hidden_size", "num_attention_heads")),
            ffn_size=variant.pop("ffn_size", None) or _int(cfg, "intermediate_size", where),
            vocab_size=_int(cfg, "vocab_size", where),
            max_position_embeddings=_int(cfg, "max_position_embeddings", where, 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", fam in TIED_BY_DEFAULT)),
            **traits, **variant)
    spec.update(checkpoint_quantization(
        cfg, spec.get("num_experts", 1) > 1,
        bool(spec.get("shared_expert_ffn_size") or spec.get("num_dense_layers"))))
    if spec["num_heads"] % spec["num_kv_heads"]:
        raise ValueError(f"{where}: num_key_value_heads={spec['num_kv_heads']} must divide "
                         f"num_attention_heads={spec['num_heads']}")
    if spec.get("experts_per_token", 0) > spec.get("num_experts", 0):
        raise ValueError(f"{where}: num_experts_per_tok={spec['experts_per_token']} exceeds "
                         f"num_local_experts={spec['num_experts']}")
    return spec
