"""HF config fields of mixtures of experts, multi-head latent attention (MLA) and sliding
windows, read into `ModelSpec` fields (`hf_config.hf_config_fields` calls them).

Families and the config.json keys each needs (the HF `transformers` names):
- Mixtral: `num_local_experts`, `num_experts_per_tok`; `sliding_window` (null = none).
- Qwen2-MoE: `num_experts`, `num_experts_per_tok`, `moe_intermediate_size`,
  `shared_expert_intermediate_size` (one shared expert with a sigmoid gate),
  `decoder_sparse_step`, `mlp_only_layers` (those layers are dense of `intermediate_size`).
- Qwen3-MoE: as Qwen2-MoE without the shared expert, plus per-head q/k RMSNorms.
- DeepSeek-V2 / V3: `n_routed_experts`, `num_experts_per_tok`, `moe_intermediate_size`,
  `n_shared_experts` (x `moe_intermediate_size`), `first_k_dense_replace` dense layers of
  `intermediate_size`, and MLA: `kv_lora_rank`, `q_lora_rank` (null = plain q_proj),
  `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`.
- DeepSeek-V3.2 (DeepseekV32ForCausalLM): DeepSeek-V3's fields plus its sparse attention's
  lightning indexer: `index_topk` (keys each query attends to), `index_n_heads`,
  `index_head_dim`.
- GLM-5 (GlmMoeDsaForCausalLM, `glm_moe_dsa`): DeepSeek-V3.2's fields (sigmoid router, one
  expert group); a layer may reuse the previous layer's top-k instead of running its own
  indexer (`indexer_types` "full" / "shared", else derived as HF does from
  `index_topk_pattern` or `index_topk_freq` and `index_skip_topk_offset`; GLM-5 and 5.1 run
  every layer's).
- GLM-4.5 / 4.6 (Glm4MoeForCausalLM): DeepSeek-V3's MoE fields (`n_routed_experts`,
  `n_shared_experts`, `moe_intermediate_size`, `first_k_dense_replace`, `intermediate_size`)
  with grouped-query attention of an explicit `head_dim` (GLM-4.6: 96 heads of 128 over a
  5,120 hidden size), q/k/v biases (`attention_bias`, none on o_proj) and `use_qk_norm`.
- MiniMax-M2 (MiniMaxM2ForCausalLM: M2.5, M2.7): as Mixtral (`num_local_experts`,
  `num_experts_per_tok`, `intermediate_size` per expert, every layer MoE, no shared expert),
  grouped-query attention of an explicit `head_dim` (48 heads of 128 over a 3,072 hidden
  size) and a q/k RMSNorm (`use_qk_norm`).
- gpt-oss: as Mixtral (`num_local_experts`, `num_experts_per_tok`, `intermediate_size` per
  expert); `sliding_window` on the layers `layer_types` marks "sliding_attention". Its
  attention sinks (one learned logit per head, in the architecture, not in config.json) cost
  nothing measurable themselves; they set `attention_sinks`, which decides vLLM's attention
  kernel on pre-Hopper GPUs (simulator/engines/presets.py).
- Llama 4 (the `text_config` of Llama4ForConditionalGeneration): `num_local_experts`,
  `num_experts_per_tok`, `intermediate_size` per routed expert and for the one shared
  expert of every MoE layer, `intermediate_size_mlp` for the dense layers, MoE layers every
  `interleave_moe_layer_step` (or the listed `moe_layers`). Its chunked local attention
  ("chunked_attention" layers of `attention_chunk_size`) is priced and cached as a sliding
  window of that size: exact up to one chunk of context, an upper bound beyond (a query
  sees at most a chunk; a window always a full one).
- Mistral / Qwen2: `sliding_window` (Qwen2 only with `use_sliding_window`), and
  `layer_types` ("sliding_attention" / "full_attention") where the config lists them.
Where the dense layers sit is kept (`dense_layer_ids`), so a pipeline stage of an interleaved
model (Llama 4 Maverick, Qwen-MoE with `decoder_sparse_step`) gets its own share of each kind.
- Qwen3-Next (`qwen3_next`), Qwen3.5 and Qwen3.5-MoE (`qwen3_5`, `qwen3_5_moe`, their
  `text_config`): Gated DeltaNet linear attention on the layers `layer_types` marks
  "linear_attention" (else every layer but each `full_attention_interval`-th, default 4, as
  transformers derives it), of `linear_num_key_heads` x `linear_key_head_dim` query/key heads,
  `linear_num_value_heads` x `linear_value_head_dim` value heads and a causal convolution of
  `linear_conv_kernel_dim` taps; the recurrent state is kept in `mamba_ssm_dtype` where the
  config names it (Qwen3.5: float32), else the model's dtype. The full-attention layers gate
  their output (`attn_output_gate`, default true: q_proj emits a gate per head dim) and
  norm q and k per head. The MoE variants have one gated shared expert
  (`shared_expert_intermediate_size`); Qwen3.5-MoE's every layer is MoE.
A field an MoE or MLA family needs and the config lacks is refused, naming the field.
"""

from __future__ import annotations

from typing import Any

MOE_FAMILIES = {"mixtral", "gpt_oss", "minimax_m2", "llama4", "qwen2_moe", "qwen3_moe", "deepseek_v2",
                "deepseek_v3", "glm4_moe", "deepseek_v32", "glm_moe_dsa", "qwen3_next",
                "qwen3_5_moe"}
MLA_FAMILIES = {"deepseek_v2", "deepseek_v3", "deepseek_v32", "glm_moe_dsa", "glm4_moe_lite"}
# DeepSeek Sparse Attention: a lightning indexer picks the keys each query attends to
DSA_FAMILIES = {"deepseek_v32", "glm_moe_dsa"}
SINK_FAMILIES = {"gpt_oss"}  # architectures with per-head attention sinks
# Gated DeltaNet linear attention beside gated full attention (Qwen3-Next, Qwen3.5)
LINEAR_ATTENTION_FAMILIES = {"qwen3_next", "qwen3_5", "qwen3_5_moe"}
# Qwen MoE families with one sigmoid-gated shared expert per MoE layer
QWEN_SHARED_EXPERT_FAMILIES = {"qwen2_moe", "qwen3_next", "qwen3_5_moe"}


def required_int(cfg: dict[str, Any], key: str, where: str, fam: str) -> int:
    value = cfg.get(key)
    if value is None:
        raise ValueError(f"{where}: {fam} config is missing field {key!r} (a positive integer), "
                         "which its mixture-of-experts, latent- or linear-attention layers need")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where}: field {key!r} must be a positive integer, got {value!r}")
    return value


def list_field(cfg: dict[str, Any], key: str, where: str, item: type = int) -> list[Any]:
    """A list-valued field of `item`s (layer indices or flags, layer-type names); [] where
    absent or null."""
    value = cfg.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(
            isinstance(v, item) and not (item is int and isinstance(v, bool)) for v in value):
        raise ValueError(f"{where}: field {key!r} must be a list of {item.__name__}s, "
                         f"got {value!r}")
    return value


def optional_int(cfg: dict[str, Any], key: str, where: str, default: int = 0) -> int:
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: field {key!r} must be a non-negative integer, got {value!r}")
    return value


def moe_fields(cfg: dict[str, Any], fam: str, where: str) -> dict[str, Any]:
    """ModelSpec fields of the experts of family `fam` (empty for a dense family)."""
    if fam not in MOE_FAMILIES:
        return {}
    L = cfg["num_hidden_layers"]  # (validated by hf_config_fields)
    if fam in ("mixtral", "gpt_oss", "minimax_m2"):
        return {"num_experts": required_int(cfg, "num_local_experts", where, fam),
                "experts_per_token": required_int(cfg, "num_experts_per_tok", where, fam),
                "ffn_size": required_int(cfg, "intermediate_size", where, fam)}
    if fam == "llama4":
        expert = required_int(cfg, "intermediate_size", where, fam)
        step = optional_int(cfg, "interleave_moe_layer_step", where, 1) or 1
        moe = list_field(cfg, "moe_layers", where)
        moe = set(moe) if moe else set(range(step - 1, L, step))
        return {"num_experts": required_int(cfg, "num_local_experts", where, fam),
                "experts_per_token": required_int(cfg, "num_experts_per_tok", where, fam),
                "ffn_size": expert, "dense_ffn_size": required_int(cfg, "intermediate_size_mlp", where, fam),
                "num_shared_experts": 1, "shared_expert_ffn_size": expert,
                "dense_layer_ids": (dense := tuple(i for i in range(L) if i not in moe)),
                "num_dense_layers": len(dense)}
    out: dict[str, Any] = {
        "experts_per_token": required_int(cfg, "num_experts_per_tok", where, fam),
        "ffn_size": required_int(cfg, "moe_intermediate_size", where, fam),
    }
    if fam.startswith("qwen"):
        out["num_experts"] = required_int(cfg, "num_experts", where, fam)
        step = optional_int(cfg, "decoder_sparse_step", where, 1) or 1
        dense_only = set(list_field(cfg, "mlp_only_layers", where))
        out["dense_layer_ids"] = tuple(i for i in range(L) if i in dense_only or (i + 1) % step)
        out["num_dense_layers"] = len(out["dense_layer_ids"])
        if out["num_dense_layers"] or cfg.get("intermediate_size") is not None:
            out["dense_ffn_size"] = required_int(cfg, "intermediate_size", where, fam)
        if fam in QWEN_SHARED_EXPERT_FAMILIES:
            out["shared_expert_ffn_size"] = required_int(cfg, "shared_expert_intermediate_size", where, fam)
            out["num_shared_experts"] = 1
            out["shared_expert_gate"] = True
        if fam != "qwen2_moe":
            out["qk_norm"] = True
    else:  # DeepSeek's keys: deepseek_v2 / v3 / v32, glm4_moe, glm_moe_dsa
        out["dense_ffn_size"] = required_int(cfg, "intermediate_size", where, fam)
        out["num_experts"] = required_int(cfg, "n_routed_experts", where, fam)
        if fam == "glm4_moe":  # GQA heads wider than hidden / heads: the config says
            out["head_dim"] = required_int(cfg, "head_dim", where, fam)
        shared = optional_int(cfg, "n_shared_experts", where)
        out["num_shared_experts"] = shared
        out["shared_expert_ffn_size"] = shared * out["ffn_size"]
        freq = optional_int(cfg, "moe_layer_freq", where, 1) or 1
        first = optional_int(cfg, "first_k_dense_replace", where)
        out["dense_layer_ids"] = tuple(i for i in range(L) if i < first or i % freq)
        out["num_dense_layers"] = len(out["dense_layer_ids"])
    if out["experts_per_token"] > out["num_experts"]:
        raise ValueError(f"{where}: num_experts_per_tok={out['experts_per_token']} exceeds the "
                         f"{out['num_experts']} experts")
    return out


def mla_fields(cfg: dict[str, Any], fam: str, where: str) -> dict[str, Any]:
    """ModelSpec fields of multi-head latent attention (empty for other families)."""
    if fam not in MLA_FAMILIES:
        return {}
    nope = required_int(cfg, "qk_nope_head_dim", where, fam)
    rope = required_int(cfg, "qk_rope_head_dim", where, fam)
    return {"kv_lora_rank": required_int(cfg, "kv_lora_rank", where, fam),
            "q_lora_rank": optional_int(cfg, "q_lora_rank", where),
            "qk_nope_head_dim": nope, "qk_rope_head_dim": rope,
            "v_head_dim": required_int(cfg, "v_head_dim", where, fam),
            "head_dim": nope + rope}


def dsa_fields(cfg: dict[str, Any], fam: str, where: str) -> dict[str, Any]:
    """ModelSpec fields of DeepSeek Sparse Attention's indexer (empty for other families)."""
    if fam not in DSA_FAMILIES:
        return {}
    out = {"index_topk": required_int(cfg, "index_topk", where, fam),
           "index_n_heads": required_int(cfg, "index_n_heads", where, fam),
           "index_head_dim": required_int(cfg, "index_head_dim", where, fam)}
    types = indexer_types(cfg, where) if fam == "glm_moe_dsa" else []
    if "shared" in types:
        out["num_index_layers"] = types.count("full")
    return out


def indexer_types(cfg: dict[str, Any], where: str) -> list[str]:
    """GLM-5's per-layer indexer mode, "full" (its own indexer) or "shared" (the previous
    layer's top-k), as transformers' `GlmMoeDsaConfig` derives it: `indexer_types`, else
    `index_topk_pattern` (a string of F / S or a list), else every `index_topk_freq`-th layer
    from `index_skip_topk_offset` - 1 on (default 1 and 2: every layer runs its own)."""
    L = cfg["num_hidden_layers"]  # (validated by hf_config_fields)
    types = list_field(cfg, "indexer_types", where, str)
    if not types:
        pattern = cfg.get("index_topk_pattern")
        if isinstance(pattern, str) and set(pattern) <= {"F", "S"}:
            types = [{"F": "full", "S": "shared"}[c] for c in pattern]
        elif pattern is not None:
            types = list_field(cfg, "index_topk_pattern", where, str)
        else:
            freq = max(optional_int(cfg, "index_topk_freq", where, 1), 1)
            offset = cfg.get("index_skip_topk_offset", 2)
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise ValueError(f"{where}: field 'index_skip_topk_offset' must be an integer, "
                                 f"got {offset!r}")
            types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared"
                     for i in range(L)]
    if len(types) != L or not set(types) <= {"full", "shared"} or types[0] != "full":
        got = ("".join("F" if t == "full" else "S" for t in types) + f" ({len(types)} layers)"
               if set(types) <= {"full", "shared"} else repr(types))
        raise ValueError(f"{where}: the indexer modes ('indexer_types', or from "
                         f"'index_topk_pattern') must list {L} entries of 'full' / 'shared', the "
                         f"first 'full' (a shared layer reuses the one before), got {got}")
    return types


# the window HF's config class gives a family whose config.json does not state one
WINDOW_DEFAULTS = {"olmo3": 4096, "exaone4": 4096, "exaone_moe": 4096, "dots1": 4096,
                   "cohere2": 4096}


def window_fields(cfg: dict[str, Any], fam: str, where: str) -> dict[str, Any]:
    """`sliding_window` (tokens) and how many layers use it, by HF's rules per family."""
    if fam in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not cfg.get("use_sliding_window",
                                                                          False):
        return {}
    if fam not in ("mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gpt_oss",
                   "llama4", "gemma2", "gemma3", "phi3", "olmo3", "exaone4", "exaone_moe",
                   "phimoe", "dots1", "starcoder2", "cohere2"):
        return {}
    window = cfg.get("attention_chunk_size" if fam == "llama4" else "sliding_window",
                     WINDOW_DEFAULTS.get(fam))
    if not window:
        return {}
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        key = "attention_chunk_size" if fam == "llama4" else "sliding_window"
        raise ValueError(f"{where}: field {key!r} must be a positive integer or null, "
                         f"got {window!r}")
    context = cfg.get("max_position_embeddings")
    if isinstance(context, int) and not isinstance(context, bool) and window >= context:
        return {}  # no prompt reaches it (Phi-4-mini: 262,144 over 131,072 positions)
    L = cfg["num_hidden_layers"]  # (validated by hf_config_fields)
    types = cfg.get("layer_types")
    if types is not None:
        types = list_field(cfg, "layer_types", where, str)
        local = "chunked_attention" if fam == "llama4" else "sliding_attention"
        bad = sorted({t for t in types if t not in (local, "full_attention")})
        if bad or len(types) != L:
            raise ValueError(f"{where}: field 'layer_types' must list {L} entries of "
                             f"{local!r} / 'full_attention', got {types!r}")
        sliding = sum(t == local for t in types)
    elif fam == "llama4":  # no layer_types: every no_rope_layers 0 entry is global
        nope = list_field(cfg, "no_rope_layers", where)
        sliding = sum(1 for x in nope if x) if nope else L - L // 4
    elif fam == "olmo3":  # HF: every fourth layer global
        sliding = sum(1 for i in range(L) if (i + 1) % 4)
    elif fam in ("exaone4", "exaone_moe", "cohere2"):  # HF: every pattern-th layer global
        pattern = optional_int(cfg, "sliding_window_pattern", where, 4)
        sliding = sum(1 for i in range(L) if (i + 1) % pattern) if pattern else 0
    elif fam == "gemma2":  # HF: sliding and global alternate, sliding first
        sliding = sum(1 for i in range(L) if (i + 1) % 2)
    elif fam == "gemma3":  # HF: every sliding_window_pattern-th layer is global (default 6)
        pattern = optional_int(cfg, "sliding_window_pattern", where, 6)
        if pattern == 0:
            raise ValueError(f"{where}: field 'sliding_window_pattern' must be a positive "
                             "integer, got 0")
        sliding = sum(1 for i in range(L) if (i + 1) % pattern)
    elif fam in ("qwen2", "qwen3", "qwen2_moe", "dots1"):  # HF: from max_window_layers on
        mwl = optional_int(cfg, "max_window_layers", where, 62 if fam == "dots1" else L)
        sliding = sum(1 for i in range(L) if i >= mwl) if fam != "qwen2_moe" else \
            sum(1 for i in range(L) if (i + 1) % 2 and i < mwl)
    else:
        sliding = L
    return {"sliding_window": window, "num_sliding_layers": sliding} if sliding else {}


def linear_attention_fields(cfg: dict[str, Any], fam: str, where: str) -> dict[str, Any]:
    """ModelSpec fields of Gated DeltaNet linear attention (empty for other families): how
    many layers use it, its head counts and sizes, the convolution taps, the state's dtype,
    and the full-attention layers' output gate."""
    if fam not in LINEAR_ATTENTION_FAMILIES:
        return {}
    L = cfg["num_hidden_layers"]  # (validated by hf_config_fields)
    types = list_field(cfg, "layer_types", where, str)
    if types:
        bad = sorted({t for t in types if t not in ("linear_attention", "full_attention")})
        if bad or len(types) != L:
            raise ValueError(f"{where}: field 'layer_types' must list {L} entries of "
                             f"'linear_attention' / 'full_attention', got {types!r}")
        linear = types.count("linear_attention")
    else:
        interval = optional_int(cfg, "full_attention_interval", where, 4)
        if interval == 0:
            raise ValueError(f"{where}: field 'full_attention_interval' must be a positive "
                             "integer, got 0")
        linear = sum(1 for i in range(L) if (i + 1) % interval)
    if linear == L:
        raise ValueError(f"{where}: every one of the {L} layers is 'linear_attention'; kvpd "
                         "needs at least one full-attention layer to hold the KV cache")
    state = cfg.get("mamba_ssm_dtype")
    if state is not None and state not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"{where}: field 'mamba_ssm_dtype' must be 'float32', 'bfloat16' or "
                         f"'float16', got {state!r}")
    gate = cfg.get("attn_output_gate", True)
    if not isinstance(gate, bool):
        raise ValueError(f"{where}: field 'attn_output_gate' must be true or false, got {gate!r}")
    return {"num_linear_layers": linear,
            "linear_key_heads": required_int(cfg, "linear_num_key_heads", where, fam),
            "linear_value_heads": required_int(cfg, "linear_num_value_heads", where, fam),
            "linear_key_head_dim": required_int(cfg, "linear_key_head_dim", where, fam),
            "linear_value_head_dim": required_int(cfg, "linear_value_head_dim", where, fam),
            "linear_conv_kernel": required_int(cfg, "linear_conv_kernel_dim", where, fam),
            "linear_state_dtype": {"float32": "fp32", "bfloat16": "bf16",
                                   "float16": "fp16"}.get(state or "", ""),
            "attn_output_gate": gate}
