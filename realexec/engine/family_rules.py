"""Which layers of each HF family the paged walk treats how (HF's rules, read from the config and
the family's model_type): sliding windows, rotary or NoPE layers, MoE blocks, sandwich, post-
and parallel norms, HF's own rotary functions, logit scales (`paged_model.PagedCausalLM`)."""

from __future__ import annotations

from transformers import PretrainedConfig


def layer_windows(config: PretrainedConfig) -> list[int | None]:
    """Sliding window (tokens) of each layer, None for full attention (HF's rules).

    Families with `layer_types` (Qwen2, Qwen3, Qwen2-MoE, gpt-oss, Gemma 2 and 3, OLMo 3,
    EXAONE 4 and its MoE, dots.llm1, Command A) slide only their "sliding_attention" layers;
    Mistral, Mixtral, Qwen3-MoE, Phi-3, Phi-3.5-MoE and StarCoder2 slide every layer
    when `sliding_window` is set (Qwen2-MoE/Qwen3-MoE configs clear it unless
    `use_sliding_window`). Llama 4's "chunked_attention" layers keep `attention_chunk_size`
    positions (a query attends within its chunk, `llama4.py`). GPT-2 and Llama have no window.
    """
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None) or None  # Qwen2-MoE writes 0 for "none"
    if config.model_type in ("gpt2", "llama"):
        return [None] * n
    if config.model_type == "llama4_text":  # chunked layers: a query sees its own chunk
        return [config.attention_chunk_size if t == "chunked_attention" else None
                for t in config.layer_types[:n]]
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and config.model_type in ("qwen2", "qwen3", "qwen2_moe",
                                                         "gpt_oss", "gemma2", "gemma3_text",
                                                         "olmo3", "exaone4", "exaone_moe",
                                                         "dots1", "cohere2"):
        return [window if t == "sliding_attention" else None for t in layer_types[:n]]
    if config.model_type in ("mistral", "mixtral", "qwen3_moe", "phi3", "phimoe", "starcoder2"):
        return [window] * n
    return [None] * n


def rotary_layers(config: PretrainedConfig, windows: list[int | None]) -> list[bool]:
    """Whether each layer rotates q and k: not SmolLM3's NoPE layers (`no_rope_layers` 0),
    nor EXAONE 4's (and EXAONE MoE's, Command A's) full-attention layers when it has sliding
    ones, nor
    Granite 4.0's without `position_embedding_type` "rope" (HF's rules)."""
    n = config.num_hidden_layers
    if config.model_type == "smollm3":
        return [bool(r) for r in config.no_rope_layers[:n]]
    if config.model_type == "granitemoehybrid":  # Granite 4.0: NoPE unless it asks for RoPE
        return [getattr(config, "position_embedding_type", None) == "rope"] * n
    if config.model_type in ("exaone4", "exaone_moe", "cohere2") and any(windows):
        return [w is not None for w in windows]
    return [True] * n


# families whose `layer.mlp` is (in some layers) a sparse MoE block: HF's blocks take
# `[batch, seq, hidden]`, so the flat batch is passed as one sequence of T tokens (the
# router and the experts treat every token on its own, so this changes nothing)
MOE_MODEL_TYPES = frozenset({"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "deepseek_v32",
                             "glm_moe_dsa", "glm4_moe", "gpt_oss", "minimax_m2", "qwen3_next",
                             "qwen3_5_text", "qwen3_5_moe_text", "olmoe", "flex_olmo", "phimoe",
                             "granitemoe", "granitemoeshared", "hunyuan_v1_moe",
                             "ernie4_5_moe", "dots1", "glm4_moe_lite", "exaone_moe",
                             "granitemoehybrid"})
# Granite 3, Granite MoE and Granite 4.0: scalar multipliers on the embeddings, the sublayers'
# outputs and the logits
GRANITE_MODEL_TYPES = frozenset({"granite", "granitemoe", "granitemoeshared", "granitemoehybrid"})
# families whose MoE block returns (hidden, router scores) rather than hidden alone
MLP_RETURNS_SCORES = frozenset({"gpt_oss"})
# families with attention sinks (a learned logit per head in the softmax denominator)
SINK_MODEL_TYPES = frozenset({"gpt_oss"})
# Gemma 2 and 3, GLM-4-0414: "sandwich" norms, three per layer besides the input norm: the
# attention output's, the MLP input's and the MLP output's
GEMMA_SANDWICH = ("post_attention_layernorm", "pre_feedforward_layernorm",
                   "post_feedforward_layernorm")
SANDWICH_NORMS = {
    "gemma2": GEMMA_SANDWICH, "gemma3_text": GEMMA_SANDWICH,
    "glm4": ("post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm"),
}
# families rotated by HF's own `apply_rotary_pos_emb` (gpt-oss: half-width cos/sin on the two
# halves; GLM-4-0414 and GLM-4-9B: interleaved pairs of a partial rotary; ERNIE-4.5, Command R
# and A, Helium: interleaved pairs)
HF_ROTARY_MODEL_TYPES = frozenset({"gpt_oss", "glm4", "glm", "ernie4_5", "ernie4_5_moe", "cohere",
                                    "cohere2", "helium"})
# Command R and A, Phi-2 (and StableLM with `use_parallel_residual`, `parallel_block`):
# attention and MLP both read the input norm's output and add to the residual together
PARALLEL_MODEL_TYPES = frozenset({"cohere", "cohere2", "phi"})


def parallel_block(config: PretrainedConfig) -> bool:
    """Whether the family's layers are parallel blocks (one norm read by both sublayers)."""
    return config.model_type in PARALLEL_MODEL_TYPES or (
        config.model_type == "stablelm" and bool(getattr(config, "use_parallel_residual", False)))
# Command R and A: logits x logit_scale
LOGIT_SCALE_MODEL_TYPES = frozenset({"cohere", "cohere2"})
# Gemma 3 and OLMo 3: one rotary per attention type (their local and global layers rotate
# with different bases: `rotary_emb(x, pos, layer_type)`)
ROTARY_PER_TYPE = frozenset({"gemma3_text", "olmo3"})
# OLMo 2 / 3, FlexOlmo, EXAONE 4: norms on each sublayer's output only (no input norms)
POST_NORM_MODEL_TYPES = frozenset({"olmo2", "olmo3", "flex_olmo", "exaone4"})
