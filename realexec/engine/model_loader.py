"""Load HF `transformers` causal LMs of the families `SUPPORTED_MODEL_TYPES` lists (dense,
mixtures of experts, MLA and sparse attention, and the Gated DeltaNet and Mamba-2 hybrids) for
the real executor.

A model comes from a local directory (`config.json` + `*.safetensors`), from a config alone
(a `config.json` path, a dict with `model_type`, a `PretrainedConfig`, or a built-in name from
`realexec.engine.configs`) with seeded random weights. The hub is never contacted
(`local_files_only=True`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
from transformers.configuration_utils import remap_legacy_layer_types

from realexec.engine.configs import BUILTIN_CONFIGS, builtin_config
from realexec.engine.device import resolve_device

# model_type (config.json) -> family name shown to users.
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "seed_oss": "Seed-OSS",
    "smollm3": "SmolLM3",
    "granite": "Granite",
    "glm4": "GLM-4 (dense)",
    "hunyuan_v1_dense": "Hunyuan (dense)",
    "ernie4_5": "ERNIE-4.5 (dense)",
    "olmo2": "OLMo 2",
    "olmo3": "OLMo 3",
    "exaone4": "EXAONE 4",
    "gpt2": "GPT-2",
    "gpt_neox": "GPT-NeoX (Pythia)",
    "opt": "OPT",
    "mixtral": "Mixtral",
    "qwen2_moe": "Qwen2-MoE",
    "qwen3_moe": "Qwen3-MoE",
    "deepseek_v3": "DeepSeek-V3",
    "deepseek_v32": "DeepSeek-V3.2",
    "glm_moe_dsa": "GLM-5",
    "glm4_moe": "GLM-4.5",
    "gpt_oss": "gpt-oss",
    "minimax_m2": "MiniMax-M2",
    "olmoe": "OLMoE",
    "flex_olmo": "FlexOlmo",
    "phimoe": "Phi-3.5-MoE",
    "granitemoe": "Granite MoE",
    "granitemoeshared": "Granite MoE (shared expert)",
    "hunyuan_v1_moe": "Hunyuan MoE",
    "ernie4_5_moe": "ERNIE-4.5 MoE",
    "dots1": "dots.llm1",
    "glm4_moe_lite": "GLM-4.7-Flash",
    "exaone_moe": "EXAONE MoE",
    "granitemoehybrid": "Granite 4.0 (Mamba-2 hybrid)",
    "gemma": "Gemma 1",
    "helium": "Helium",
    "arcee": "AFM (Arcee)",
    "glm": "GLM-4-9B",
    "nemotron": "Nemotron-4",
    "starcoder2": "StarCoder2",
    "stablelm": "StableLM",
    "cohere": "Command R",
    "cohere2": "Command A / R7B",
    "phi": "Phi-2",
    "olmo": "OLMo 1",
    "llama4_text": "Llama 4 (its text model)",
    "llama4": "Llama 4 (multimodal; its text model)",  # Scout and Maverick's config.json
    "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3",
    "gemma3": "Gemma 3 (multimodal; its text model)",  # 4B/12B/27B releases: text_config
    "phi3": "Phi-3",
    "qwen3_next": "Qwen3-Next",
    "nemotron_h": "Nemotron-H",
    "qwen3_5_text": "Qwen3.5 (its text model)",
    "qwen3_5_moe_text": "Qwen3.5-MoE (its text model)",
    # the multimodal Qwen3.5 releases: transformers' causal-LM class builds their text model
    "qwen3_5": "Qwen3.5 (multimodal; its text model)",
    "qwen3_5_moe": "Qwen3.5-MoE (multimodal; its text model)",
}
# multimodal model types whose `text_config` holds the text model that runs text prompts
TEXT_MODEL_TYPES = {"gemma3": "gemma3_text", "qwen3_5": "qwen3_5_text",
                    "qwen3_5_moe": "qwen3_5_moe_text", "llama4": "llama4_text"}

# HF attention implementation per family (default "sdpa"). transformers' SDPA path has no
# attention sinks, so `GptOssForCausalLM` refuses it (`_supports_sdpa = False`), nor logit
# soft-capping (Gemma 2); their eager attention is the reference the paged executor matches.
_HF_ATTN: dict[str, str] = {"gpt_oss": "eager", "gemma2": "eager"}

# config.json fields a family's dict must carry: `transformers` fills absent ones with the
# defaults of its largest release (GptOssConfig: 36 layers, 128 experts; MixtralConfig: 8
# experts of 14336), which would run a different model than the file describes.
# `sliding_window` is needed when a gpt-oss layer slides.
_CORE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
# a decoder's grouped-query shape, and with its head size (required where the config class's
# default differs from hidden / heads)
_DENSE = (*_CORE, "num_key_value_heads", "intermediate_size")
_DENSE_HEAD = (*_DENSE, "head_dim")
_DEEPSEEK_V3 = (*_CORE, "intermediate_size", "moe_intermediate_size", "n_routed_experts",
                "num_experts_per_tok", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                "v_head_dim")
_DEEPSEEK_V32 = (*_DEEPSEEK_V3, "q_lora_rank", "index_topk", "index_n_heads", "index_head_dim")
_LINEAR = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
           "linear_value_head_dim", "linear_conv_kernel_dim")
# required fields a config may give once per layer as a list (Hunyuan-A13B's `moe_topk`, which
# transformers' HunYuanMoEV1Config takes either way)
PER_LAYER_FIELDS = frozenset({"moe_topk"})
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "gpt_oss": (*_DENSE_HEAD, "num_local_experts", "num_experts_per_tok"),
    # the mixtures of experts: the fields their MoE (and MLA) layers are built from, as the
    # simulator's model_variants.py requires them
    "mixtral": (*_CORE, "intermediate_size", "num_local_experts", "num_experts_per_tok"),
    # MiniMaxM2Config's defaults are the 229B release's
    "minimax_m2": (*_DENSE_HEAD, "num_local_experts", "num_experts_per_tok"),
    "qwen2_moe": (*_CORE, "intermediate_size", "moe_intermediate_size", "num_experts",
                  "num_experts_per_tok", "shared_expert_intermediate_size"),
    "qwen3_moe": (*_CORE, "intermediate_size", "moe_intermediate_size", "num_experts",
                  "num_experts_per_tok"),
    "deepseek_v3": _DEEPSEEK_V3,
    # and its sparse attention's indexer (DeepseekV32Config's defaults are the 671B release's)
    "deepseek_v32": _DEEPSEEK_V32,
    "glm_moe_dsa": _DEEPSEEK_V32,  # (GlmMoeDsaConfig's defaults are GLM-5's 744B release)
    "glm4_moe": (*_DENSE_HEAD, "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok"),
    # Gemma2Config's and Gemma3TextConfig's defaults are 2B-class shapes with 256-wide heads
    "gemma2": _DENSE_HEAD,
    "gemma3_text": _DENSE_HEAD,
    # Llama4TextConfig's defaults are Scout's (48 layers, 16 experts of 8,192)
    "llama4_text": (*_DENSE_HEAD, "intermediate_size_mlp", "num_local_experts",
                    "num_experts_per_tok"),
    # SeedOssConfig's defaults are the 36B release's; SmolLM3Config's the 3B's
    "seed_oss": _DENSE_HEAD,
    "smollm3": _DENSE,
    # OPTConfig's defaults are the 125m's
    "opt": (*_CORE, "ffn_dim"),
    # GPTNeoXConfig's defaults are GPT-NeoX-20B's
    "gpt_neox": (*_CORE, "intermediate_size"),
    # GraniteConfig's defaults are a Llama-2-7B shape with every multiplier 1
    "granite": _DENSE,
    # Glm4Config's defaults are GLM-4-9B's
    "glm4": _DENSE_HEAD,
    # HunYuanDenseV1Config's defaults are a Llama-2-7B-class shape
    "hunyuan_v1_dense": _DENSE,
    # Ernie4_5Config's defaults are the 0.3B's with 128-wide heads
    "ernie4_5": _DENSE_HEAD,
    # Olmo2Config's and Olmo3Config's defaults are the 7B's, Exaone4Config's a 2.4B-class shape
    "olmo2": _DENSE,
    "olmo3": _DENSE,
    "exaone4": _DENSE,
    # the mixtures of experts moe_families.py reads: each config class's defaults are a
    # release's shapes (OlmoeConfig: OLMoE-1B-7B; PhimoeConfig: Phi-3.5-MoE; Ernie4_5_MoeConfig:
    # 21B-A3B; Dots1Config: dots.llm1; Glm4MoeLiteConfig: GLM-4.7-Flash; ...). transformers
    # cannot build a Hunyuan MoE without head_dim.
    "olmoe": (*_DENSE, "num_experts", "num_experts_per_tok"),
    "flex_olmo": (*_DENSE, "num_experts", "num_experts_per_tok"),
    "phimoe": (*_DENSE, "num_local_experts", "num_experts_per_tok"),
    "granitemoe": (*_DENSE, "num_local_experts", "num_experts_per_tok"),
    "granitemoeshared": (*_DENSE, "num_local_experts", "num_experts_per_tok",
                         "shared_intermediate_size"),
    "hunyuan_v1_moe": (*_DENSE_HEAD, "num_experts", "moe_topk"),
    "ernie4_5_moe": (*_DENSE, "moe_intermediate_size", "moe_num_experts", "moe_k"),
    "dots1": (*_DENSE, "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok"),
    "glm4_moe_lite": (*_DEEPSEEK_V3, "num_key_value_heads", "q_lora_rank"),
    "exaone_moe": (*_DENSE, "moe_intermediate_size", "num_experts", "num_experts_per_tok"),
    # more dense families: each config class's defaults are a release's shapes (GemmaConfig:
    # 7B; HeliumConfig: 2B; ArceeConfig: AFM-4.5B; GlmConfig: GLM-4-9B; NemotronConfig:
    # Nemotron-4-15B; Starcoder2Config: 7B; StableLmConfig: 3B; CohereConfig: Command R;
    # Cohere2Config: Command R7B); Gemma, Helium and GLM-4-9B's head size is not hidden / heads
    "gemma": _DENSE_HEAD,
    "helium": _DENSE_HEAD,
    "arcee": _DENSE,
    "glm": _DENSE_HEAD,
    "nemotron": _DENSE,
    "starcoder2": _DENSE,
    "stablelm": _DENSE,
    "cohere": _DENSE,
    "cohere2": _DENSE,
    # PhiConfig's defaults are Phi-2's, OlmoConfig's OLMo-7B's
    "phi": _DENSE,
    "olmo": _DENSE,
    # Qwen3Config's defaults are an 8B-class shape (32 layers of 32 heads of 128)
    "qwen3": _DENSE_HEAD,
    # Phi3Config's defaults are Phi-3-mini's
    "phi3": (*_CORE, "intermediate_size"),
    # Qwen3NextConfig's defaults are the 80B release's
    "qwen3_next": (*_DENSE_HEAD, "moe_intermediate_size", "num_experts", "num_experts_per_tok",
                   "shared_expert_intermediate_size", *_LINEAR),
    "qwen3_5_text": (*_DENSE_HEAD, *_LINEAR),
    "qwen3_5_moe_text": (*_CORE, "num_key_value_heads", "head_dim", "moe_intermediate_size",
                         "num_experts", "num_experts_per_tok",
                         "shared_expert_intermediate_size", *_LINEAR),
}
# Nemotron-H: NemotronHConfig's defaults are an 8B-class shape with a 4-block pattern, so every
# field its blocks are built from is required; each entry names the field and its older name
_NEMOTRON_H_MIXER = (("num_key_value_heads",), ("head_dim", "attention_head_dim"),
                     ("mamba_num_heads",), ("mamba_head_dim",), ("ssm_state_size",),
                     ("n_groups", "mamba_n_groups"), ("conv_kernel", "mamba_d_conv"))
# the block kinds of `hybrid_override_pattern`'s letters (`layers_block_type` lists them)
_NEMOTRON_H_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_NEMOTRON_H_BLOCK = {"mlp": (("intermediate_size",),),
                     "moe": (("n_routed_experts",), ("num_experts_per_tok",),
                             ("moe_intermediate_size",),
                             ("moe_shared_expert_intermediate_size",))}
# families whose `layer_types` (and `sliding_window`) are checked up front
_WINDOWED_TYPES = ("gpt_oss", "gemma2", "gemma3_text")
_LAYER_TYPES = ("sliding_attention", "full_attention")

_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
}

ModelSpec = str | Path | dict | PretrainedConfig


@dataclass
class LoadedModel:
    """An HF causal LM ready for inference, and where it came from."""

    model: torch.nn.Module
    config: PretrainedConfig
    dtype: torch.dtype
    device: torch.device
    source: str  # directory, config path or built-in name; "config" for a dict/config object
    random_weights: bool

    @property
    def max_model_len(self) -> int:
        """Longest context (tokens) the model's position encoding supports."""
        return max_position_embeddings(self.config)

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """fp32 / bf16 / fp16 (or the torch dtype) -> torch dtype; ValueError for anything else."""
    if isinstance(dtype, torch.dtype):
        if dtype in (torch.float32, torch.bfloat16, torch.float16):
            return dtype
    elif isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise ValueError(f"dtype {dtype!r} is not supported; expected one of fp32, bf16, fp16")


def max_position_embeddings(config: PretrainedConfig) -> int:
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if value:
            return int(value)
    raise ValueError(f"config of model_type {config.model_type!r} names no maximum context length")


def check_supported(config: PretrainedConfig, where: str) -> None:
    """ValueError naming the supported families when `config` is of another architecture."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(f"{v} ({k})" for k, v in SUPPORTED_MODEL_TYPES.items())
        raise ValueError(
            f"{where}: model_type {model_type!r} is not supported; supported architectures: "
            f"{supported}"
        )
    if model_type == "gpt2" and getattr(config, "add_cross_attention", False):
        raise ValueError(f"{where}: GPT-2 with cross-attention is not a causal LM we can run")
    if model_type == "glm_moe_dsa":
        types = list(getattr(config, "indexer_types", None) or ["full"])
        if types[0] != "full":
            raise ValueError(f"{where}: indexer_types must start with 'full' (a 'shared' layer "
                             f"reuses the previous layer's top-k), got {types!r}")
    if model_type == "smollm3" and getattr(config, "use_sliding_window", False):
        raise ValueError(f"{where}: use_sliding_window=true: the executor runs SmolLM3 without "
                         "a window (its releases set false)")
    if model_type in TEXT_MODEL_TYPES:  # a multimodal release: its text model runs, images not
        config = config.get_text_config()
        model_type = config.model_type
    if model_type == "gemma3_text":
        if getattr(config, "attn_logit_softcapping", None) is not None:
            raise ValueError(f"{where}: attn_logit_softcapping="
                             f"{config.attn_logit_softcapping!r}: the executor soft-caps Gemma 2's "
                             "scores only (Gemma 3 releases set null)")
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError(f"{where}: use_bidirectional_attention=true is not a causal LM "
                             "we can run (Gemma 3 releases set false)")


def _read_json(path: Path) -> Any:
    """A config.json's content; ValueError naming the file if it is not JSON text."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a JSON text file ({exc.reason} at byte {exc.start})") from None


def config_from_dict(d: dict[str, Any], where: str) -> PretrainedConfig:
    """The HF config of a config.json mapping `d` (a supported `model_type` and its required
    fields); ValueError naming `where` otherwise."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: a model config is a JSON object, got {type(d).__name__}")
    d = dict(d)
    model_type = d.pop("model_type", None)
    if model_type is None:
        raise ValueError(f"{where}: config has no 'model_type' (expected one of "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)})")
    if model_type not in SUPPORTED_MODEL_TYPES:
        check_supported(PretrainedConfig(model_type=model_type), where)  # raises
    check_required_fields(model_type, d, where)
    if model_type == "nemotron_h" and d.get("head_dim") is None and "attention_head_dim" in d:
        d["head_dim"] = d["attention_head_dim"]  # Nemotron-H's older name, which HF ignores
    return AutoConfig.for_model(model_type, **d)


def check_required_fields(model_type: str, d: dict[str, Any], where: str) -> None:
    """ValueError naming the field when `d` lacks one `REQUIRED_FIELDS[model_type]` lists (or
    gives it a non-positive value), or when `layer_types` is malformed."""
    if model_type in TEXT_MODEL_TYPES:  # the text model's fields sit under text_config
        text = d.get("text_config")
        if not isinstance(text, dict):
            raise ValueError(f"{where}: {SUPPORTED_MODEL_TYPES[model_type]} config is missing "
                             "field 'text_config' (a mapping), which holds its text model's "
                             "shape")
        check_required_fields(TEXT_MODEL_TYPES[model_type], text, f"{where} text_config")
        return
    family = SUPPORTED_MODEL_TYPES[model_type]
    keys = [(k,) for k in REQUIRED_FIELDS.get(model_type, ())]
    if model_type == "nemotron_h":
        keys = _nemotron_h_fields(d, where)
    elif model_type == "granitemoehybrid":
        keys = _granite_hybrid_fields(d, where)
    for names in keys:
        key = next((n for n in names if d.get(n) is not None), names[0])
        value = d.get(key)
        if value is None:
            raise ValueError(f"{where}: {family} config is missing field {key!r} (a positive "
                             "integer), which the executor needs")
        if key in PER_LAYER_FIELDS and isinstance(value, list) and value:
            value = min(value, key=lambda v: v if isinstance(v, int) else -1)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where}: field {key!r} must be a positive integer"
                             + (" (or a list of them, one per layer)"
                                if key in PER_LAYER_FIELDS else "") + f", got {d.get(key)!r}")
    if model_type in ("deepseek_v32", "glm_moe_dsa") and \
            d["index_head_dim"] < d["qk_rope_head_dim"]:
        raise ValueError(f"{where}: field 'index_head_dim' ({d['index_head_dim']}) must be at "
                         f"least 'qk_rope_head_dim' ({d['qk_rope_head_dim']}): the indexer "
                         "rotates that many of its dims")
    if model_type not in _WINDOWED_TYPES:
        return
    types = d.get("layer_types")
    if types is not None:
        bad = [t for t in types if t not in _LAYER_TYPES]
        if bad or len(types) != d["num_hidden_layers"]:
            raise ValueError(
                f"{where}: field 'layer_types' must list one of {', '.join(_LAYER_TYPES)} per "
                f"layer ({d['num_hidden_layers']}), got {types!r}")
    slides = types is None or "sliding_attention" in types  # HF derives them when absent
    window = d.get("sliding_window")
    if slides and window is None:
        raise ValueError(f"{where}: {family} config is missing field 'sliding_window' (tokens, "
                         "a positive integer), which its sliding_attention layers need")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window <= 0):
        raise ValueError(f"{where}: field 'sliding_window' must be a positive integer, "
                         f"got {window!r}")


def _granite_hybrid_fields(d: dict[str, Any], where: str) -> list[tuple[str, ...]]:
    """The fields a Granite 4.0 config needs: its layer kinds (`layer_types`: Mamba-2 or
    attention, at least one of them attention) and `num_local_experts` (0 for the dense
    releases), then the shapes those use. GraniteMoeHybridConfig's defaults are a 32-layer
    all-Mamba model with 8 experts, which would run another model than the file describes."""
    types, n = d.get("layer_types"), d.get("num_hidden_layers")
    kinds = (remap_legacy_layer_types(types) if isinstance(types, list)
             and all(isinstance(t, str) for t in types) else None)
    if kinds is None or len(kinds) != n or not set(kinds) <= {"linear_attention", "full_attention"} \
            or "full_attention" not in kinds:
        raise ValueError(f"{where}: Granite 4.0 config needs 'layer_types': {n} entries of mamba "
                         f"/ attention (linear_attention / full_attention), at least one attention; "
                         f"got {types!r}")
    experts = d.get("num_local_experts")
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 0:
        raise ValueError(f"{where}: Granite 4.0 config needs 'num_local_experts' (0 for a dense "
                         f"release), got {experts!r}")
    keys = [(k,) for k in (*_CORE, "num_key_value_heads", "shared_intermediate_size")]
    if experts:
        keys += [("intermediate_size",), ("num_experts_per_tok",)]
    return keys


def _nemotron_h_fields(d: dict[str, Any], where: str) -> list[tuple[str, ...]]:
    """The fields a Nemotron-H config's blocks need (each with its older name), after its block
    pattern is read (ValueError naming the field when it is missing or malformed)."""
    key = "layers_block_type" if d.get("layers_block_type") is not None else "layer_types"
    blocks = d.get(key)
    if isinstance(blocks, list):  # (older names, such as "mamba", as transformers reads them)
        kinds = set(_NEMOTRON_H_PATTERN.values())
        names = [b for b in blocks if isinstance(b, str)]
        bad = sorted({str(b) for b in blocks if not isinstance(b, str)}
                     | (set(remap_legacy_layer_types(names)) - kinds))
        if bad or not blocks:
            raise ValueError(f"{where}: field {key!r} must list the blocks, each one of "
                             f"{', '.join(sorted(kinds))}; got {bad or blocks!r}")
    else:
        pattern = d.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern or set(pattern) - set(_NEMOTRON_H_PATTERN):
            raise ValueError(f"{where}: Nemotron-H config needs its block pattern: "
                             "'layers_block_type' (a list of linear_attention / full_attention "
                             "/ mlp / moe) or 'hybrid_override_pattern' (a string of M, *, -, E); "
                             f"got {pattern!r}")
        blocks = [_NEMOTRON_H_PATTERN[c] for c in pattern]
    keys = [*((k,) for k in _CORE if k != "num_hidden_layers"), *_NEMOTRON_H_MIXER]
    for kind, fields in _NEMOTRON_H_BLOCK.items():
        if kind in blocks:
            keys.extend(fields)
    return keys


def resolve_config(model: ModelSpec) -> tuple[PretrainedConfig, Path | None, str]:
    """(config, weights directory or None for random weights, source description)."""
    if isinstance(model, PretrainedConfig):
        check_supported(model, "config")
        return model, None, "config"
    if isinstance(model, dict):
        cfg = config_from_dict(model, "config dict")
        check_supported(cfg, "config dict")
        return cfg, None, "config"
    if isinstance(model, str) and model in BUILTIN_CONFIGS:
        return config_from_dict(builtin_config(model), model), None, model
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix != ".json":
            raise ValueError(f"{path}: expected a model directory or a config.json file")
        cfg = config_from_dict(_read_json(path), str(path))
        check_supported(cfg, str(path))
        return cfg, None, str(path)
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise ValueError(f"{path}: model directory has no config.json")
        cfg = config_from_dict(_read_json(cfg_path), str(cfg_path))
        check_supported(cfg, str(cfg_path))
        if not any(path.glob("*.safetensors")):
            raise ValueError(
                f"{path}: no *.safetensors weights; pass {cfg_path} itself to run this "
                "architecture with seeded random weights"
            )
        return cfg, path, str(path)
    raise ValueError(
        f"model {str(model)!r} is neither an existing directory/config.json nor a built-in "
        f"model ({', '.join(sorted(BUILTIN_CONFIGS))})"
    )


def _from_checkpoint(weights_dir: Path, dtype: torch.dtype, impl: str) -> Any:
    """The HF model of a checkpoint folder; ValueError naming the folder if its weights do
    not load or lack any of the model's (transformers would draw those at random and warn:
    every token after would be noise)."""
    try:
        hf, info = AutoModelForCausalLM.from_pretrained(
            weights_dir, local_files_only=True, dtype=dtype, attn_implementation=impl,
            output_loading_info=True)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors and transformers raise many kinds
        raise ValueError(f"{weights_dir}: its weights do not load ({type(exc).__name__}: "
                         f"{exc})") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ValueError(f"{weights_dir}: the checkpoint lacks {len(missing)} of the model's "
                         f"weights (e.g. {', '.join(missing[:3])}); it is not a checkpoint of "
                         f"this config.json's {hf.config.model_type} model")
    return hf


def load_model(
    model: ModelSpec,
    dtype: str | torch.dtype = "fp32",
    device: str | torch.device | None = None,
    seed: int = 0,
    initializer_range: float | None = None,
) -> LoadedModel:
    """Load `model` in eval mode on `device` (auto: cuda, mps, cpu).

    Random weights are drawn after `torch.manual_seed(seed)`, so the same seed gives the same
    model; `initializer_range` (std of the normal init) overrides the config's.
    """
    torch_dtype = parse_dtype(dtype)
    dev = resolve_device(device)
    config, weights_dir, source = resolve_config(model)
    impl = _HF_ATTN.get(config.model_type, "sdpa")
    config._attn_implementation = impl
    if weights_dir is not None:
        hf = _from_checkpoint(weights_dir, torch_dtype, impl).to(dev)
    else:
        if initializer_range is not None:
            config.initializer_range = float(initializer_range)
        torch.manual_seed(seed)
        with torch.device(dev):
            hf = AutoModelForCausalLM.from_config(config, dtype=torch_dtype, attn_implementation=impl)
    hf.eval()
    hf.requires_grad_(False)
    # a multimodal release's text config (vocabulary, context, EOS); the model itself otherwise
    return LoadedModel(hf, hf.config.get_text_config(), torch_dtype, dev, source,
                       weights_dir is None)


def eos_token_id(config: PretrainedConfig) -> int | None:
    """The model's end-of-sequence id (the first if several), or None if absent/outside vocab."""
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, list | tuple):
        eos = eos[0] if eos else None
    if eos is None or not 0 <= int(eos) < config.vocab_size:
        return None
    return int(eos)
