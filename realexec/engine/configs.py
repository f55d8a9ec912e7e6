"""Built-in model shapes (configs only; weights are seeded random), selectable by name.

Timing does not depend on weight values, so a config with random weights is enough to
measure a model's speed; the large `initializer_range` keeps logits far apart so that
greedy decoding is not decided by float noise (see `model_loader.build_model`).
"""

from __future__ import annotations

import copy
from typing import Any

# ~51.7M parameters, Llama-shaped: 6 layers x (attention 0.79M + MLP 2.36M) + embeddings and an
# untied lm_head of 32000 x 512 each (the Llama-2 vocabulary size, see
# /work/shared/reference/hardware-and-models.md section 2). GQA with 2 query heads per KV head.
LLAMA_50M: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 1536,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "initializer_range": 0.1,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# Llama-3-8B shape (config.json of meta-llama/Meta-Llama-3-8B; table in
# /work/shared/reference/hardware-and-models.md section 2).
LLAMA_3_8B: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}

_TINY_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "initializer_range": 0.5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
# families without grouped-query heads (GPT-NeoX reads no num_key_value_heads)
_TINY_NO_GQA = {k: v for k, v in _TINY_COMMON.items() if k != "num_key_value_heads"}

# Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5): 4 layers, linear attention of 2 key / 4 value
# heads of 8 dims and a 4-tap convolution, 16-dim softmax heads with a partial rotary
_TINY_LINEAR: dict[str, Any] = {
    **_TINY_COMMON, "num_hidden_layers": 4, "head_dim": 16, "partial_rotary_factor": 0.25,
    "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
    "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4}
_TINY_LINEAR_MOE: dict[str, Any] = {"num_experts": 4, "num_experts_per_tok": 2,
                                    "moe_intermediate_size": 32,
                                    "shared_expert_intermediate_size": 32}

# Nemotron-H hybrids: the tiny shapes with Mamba-2 blocks ("M"), attention ("*"), MLP ("-") and
# MoE ("E") blocks (`layers_block_type`, the list `hybrid_override_pattern` spells)
_TINY_NEMOTRON_H: dict[str, Any] = {
    **{k: v for k, v in _TINY_COMMON.items() if k != "num_hidden_layers"},
    "head_dim": 16, "pad_token_id": 0,
    "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp", "linear_attention",
                          "full_attention", "moe"],
    "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16,
    "conv_kernel": 4, "chunk_size": 8, "mamba_ssm_cache_dtype": "float32",
    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32}

# Tiny models of each supported family, for tests and quick tries (a few hundred thousand
# parameters; a large initializer_range so greedy argmaxes are never near-ties).
TINY: dict[str, dict[str, Any]] = {
    "tiny-llama": {"model_type": "llama", **_TINY_COMMON},
    "tiny-mistral": {"model_type": "mistral", **_TINY_COMMON, "sliding_window": None},
    "tiny-qwen2": {"model_type": "qwen2", **_TINY_COMMON},
    # Qwen3 (dense): Qwen2's layout with per-head q/k RMSNorm and no q/k/v bias; 24-dim heads
    # wider than hidden / heads (16), as the releases' 128 are (Qwen3-32B: 64 x 128 over 5,120)
    "tiny-qwen3": {"model_type": "qwen3", **_TINY_COMMON, "head_dim": 24},
    # Seed-OSS: Llama's layout with q/k/v biases and an o_proj bias (attention_out_bias)
    "tiny-seed-oss": {"model_type": "seed_oss", **_TINY_COMMON, "head_dim": 16,
                      "attention_bias": True, "attention_out_bias": True},
    # SmolLM3: every 4th layer without rotary (NoPE); 4 layers so one is
    "tiny-smollm3": {"model_type": "smollm3", **_TINY_COMMON, "num_hidden_layers": 4,
                     "no_rope_layer_interval": 4, "pad_token_id": 0},
    # OPT: learned positions, LayerNorms, a ReLU MLP; tiny-opt-350m as the 350m release is
    # (norms after each sublayer, no final norm, embeddings on a narrower width: 32 -> 64)
    "tiny-opt": {"model_type": "opt", **_TINY_COMMON, "ffn_dim": 128, "pad_token_id": 0},
    "tiny-opt-350m": {"model_type": "opt", **_TINY_COMMON, "ffn_dim": 128, "pad_token_id": 0,
                      "do_layer_norm_before": False, "word_embed_proj_dim": 32},
    # Granite 3: Llama's layers with scalar multipliers (values of the 8B release's kind)
    "tiny-granite": {"model_type": "granite", **_TINY_COMMON, "embedding_multiplier": 12.0,
                     "attention_multiplier": 0.0078125, "residual_multiplier": 0.22,
                     "logits_scaling": 8.0},
    # GLM-4-0414 (dense): q/k/v biases, four norms a layer, a rotary on half of each head in
    # interleaved pairs
    "tiny-glm4": {"model_type": "glm4", **_TINY_COMMON, "head_dim": 16, "pad_token_id": 0},
    # Hunyuan (dense): per-head q/k RMSNorms after the rotary; a dynamic-NTK rotary (alpha 1000,
    # as the 7B release's)
    "tiny-hunyuan": {"model_type": "hunyuan_v1_dense", **_TINY_COMMON, "head_dim": 16,
                     "pad_token_id": 0,
                     "rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0,
                                         "rope_theta": 10000.0}},
    # ERNIE-4.5 (dense): biases on every matrix (`use_bias`), a rotary on interleaved pairs
    "tiny-ernie4.5": {"model_type": "ernie4_5", **_TINY_COMMON, "head_dim": 16, "use_bias": True,
                      "pad_token_id": 0},
    # OLMo 2: norms after each sublayer, q/k norms across the heads; OLMo 3 adds 3 sliding
    # layers (10 tokens) to 1 full, each kind with its own rotary
    "tiny-olmo2": {"model_type": "olmo2", **_TINY_COMMON, "pad_token_id": 0},
    "tiny-olmo3": {"model_type": "olmo3", **_TINY_COMMON, "num_hidden_layers": 4,
                   "sliding_window": 10, "pad_token_id": 0},
    # EXAONE 4: norms after each sublayer, per-head q/k norms, 3 sliding layers (10 tokens) to
    # 1 full, which has no rotary
    "tiny-exaone4": {"model_type": "exaone4", **_TINY_COMMON, "num_hidden_layers": 4,
                     "sliding_window": 10, "sliding_window_pattern": 4, "pad_token_id": 0},
    # a sliding window (10 tokens) shorter than most test prompts and not a multiple of the
    # test block size (4), so windows end mid-block
    "tiny-mistral-sw": {"model_type": "mistral", **_TINY_COMMON, "sliding_window": 10},
    # mixtures of experts: 4 experts, top-2 (Mixtral's 8 / top-2 scaled down)
    "tiny-mixtral": {"model_type": "mixtral", **_TINY_COMMON, "num_local_experts": 4,
                     "num_experts_per_tok": 2, "sliding_window": None},
    # Qwen2-MoE: routed experts plus a gated shared expert
    "tiny-qwen2-moe": {"model_type": "qwen2_moe", **_TINY_COMMON, "num_experts": 4,
                       "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                       "shared_expert_intermediate_size": 64},
    # Qwen3-MoE: per-head q/k RMSNorm; layer 0 dense (`mlp_only_layers`), layer 1 sparse
    "tiny-qwen3-moe": {"model_type": "qwen3_moe", **_TINY_COMMON, "head_dim": 16,
                       "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                       "mlp_only_layers": [0], "norm_topk_prob": True},
    # Llama 4 (its text model): 4 layers, MoE every other one (4 experts, top-1, and a shared
    # expert; dense MLPs of `intermediate_size_mlp` between), rotary layers chunked by 8 tokens
    # with L2-normed q/k, every 4th layer NoPE with temperature-tuned queries (floor_scale 8
    # so the scales move within test prompts)
    "tiny-llama4": {"model_type": "llama4_text", **_TINY_COMMON, "num_hidden_layers": 4,
                    "head_dim": 16, "intermediate_size_mlp": 128, "num_local_experts": 4,
                    "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
                    "attention_chunk_size": 8, "no_rope_layer_interval": 4, "use_qk_norm": True,
                    "attn_temperature_tuning": True, "floor_scale": 8, "attn_scale": 0.1,
                    "rope_scaling": None},
    # DeepSeek-V3: MLA (latent rank 16 + rope 8 cached per token, q LoRA rank 32), layer 0 dense
    # (`first_k_dense_replace`), layer 1 MoE with 4 routed experts in 2 groups, top-2 from
    # 1 group, plus a shared expert. MLA expands K/V to every head: kv heads = heads.
    "tiny-deepseek-v3": {"model_type": "deepseek_v3", **_TINY_COMMON, "num_key_value_heads": 4,
                         "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2,
                         "topk_group": 1, "moe_intermediate_size": 32, "n_shared_experts": 1,
                         "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 32,
                         "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16},
    # DeepSeek-V3.2: tiny-deepseek-v3 with sparse attention: each query attends to the 8 keys
    # its indexer (16 heads of 16 dims, a rotary over 8) scores best, so prompts longer than 8
    # tokens attend sparsely. 16 indexer heads make an exact tie in the selection (every head's
    # ReLU at zero) rare.
    "tiny-deepseek-v32": {"model_type": "deepseek_v32", **_TINY_COMMON,
                          "num_key_value_heads": 4, "n_routed_experts": 4,
                          "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
                          "moe_intermediate_size": 32, "n_shared_experts": 1,
                          "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 32,
                          "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
                          "index_topk": 8, "index_n_heads": 16, "index_head_dim": 16},
    # GLM-5 (GlmMoeDsaForCausalLM): tiny-deepseek-v32's shapes over 4 layers, the indexer
    # rotated interleaved, and layers 1 and 3 reusing the previous layer's top-k (GLM-5.2's
    # "shared" indexers; GLM-5 and 5.1 run every layer's own)
    "tiny-glm5": {"model_type": "glm_moe_dsa", **_TINY_COMMON, "num_hidden_layers": 4,
                  "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
                  "n_group": 1, "topk_group": 1, "moe_intermediate_size": 32,
                  "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 16,
                  "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
                  "v_head_dim": 16, "index_topk": 8, "index_n_heads": 16, "index_head_dim": 16,
                  "indexer_types": ["full", "shared", "full", "shared"]},
    # GLM-4.5 (Glm4MoeForCausalLM): q/k/v biases, per-head q/k RMSNorm, a rotary over half of
    # each head (partial_rotary_factor 0.5), layer 0 dense (`first_k_dense_replace`), layer 1
    # MoE with 4 routed experts top-2 (sigmoid router with a score-correction bias) and a
    # shared expert
    "tiny-glm4-moe": {"model_type": "glm4_moe", **_TINY_COMMON, "head_dim": 16,
                      "attention_bias": True, "use_qk_norm": True,
                      "partial_rotary_factor": 0.5, "n_routed_experts": 4,
                      "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                      "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1,
                      "topk_group": 1, "norm_topk_prob": True},
    # MiniMax-M2: 4 experts top-2 (sigmoid router with a score-correction bias), every layer
    # MoE, 4 heads of 32 (wider than hidden / heads, as the release's 48 of 128 over 3,072),
    # q and k each RMS-normed across all heads before the split, a rotary over half of each
    # head (the release's `rotary_dim`)
    "tiny-minimax-m2": {"model_type": "minimax_m2", **_TINY_COMMON, "head_dim": 32,
                        "num_key_value_heads": 2, "num_local_experts": 4,
                        "num_experts_per_tok": 2, "rotary_dim": 16, "use_qk_norm": True,
                        "qk_norm_type": "per_layer", "scoring_func": "sigmoid",
                        "use_routing_bias": True},
    # OLMoE: 4 experts top-2 on every layer, q and k each RMS-normed across all heads, then q, k
    # and v clamped to +-3 (`clip_qkv`, which OLMo's first releases set)
    "tiny-olmoe": {"model_type": "olmoe", **_TINY_COMMON, "num_experts": 4,
                   "num_experts_per_tok": 2, "clip_qkv": 3.0, "pad_token_id": 0},
    # FlexOlmo: OLMo 2's norms after each sublayer with OLMoE's experts and q/k norms
    "tiny-flex-olmo": {"model_type": "flex_olmo", **_TINY_COMMON, "num_experts": 4,
                       "num_experts_per_tok": 2, "pad_token_id": 0},
    # Phi-3.5-MoE: LayerNorms, q/k/v/o biases and an LM-head bias, 4 experts top-2 routed by
    # sparsemixer, every layer sliding over 10 tokens
    "tiny-phimoe": {"model_type": "phimoe", **_TINY_COMMON, "num_local_experts": 4,
                    "num_experts_per_tok": 2, "attention_bias": True, "lm_head_bias": True,
                    "sliding_window": 10},
    # Granite MoE: Granite 3's multipliers, 4 experts top-2; the shared variant adds an
    # always-on MLP of 48
    "tiny-granitemoe": {"model_type": "granitemoe", **_TINY_COMMON, "num_local_experts": 4,
                        "num_experts_per_tok": 2, "embedding_multiplier": 2.0,
                        "residual_multiplier": 0.5, "attention_multiplier": 0.2,
                        "logits_scaling": 4.0, "pad_token_id": 0},
    "tiny-granitemoe-shared": {"model_type": "granitemoeshared", **_TINY_COMMON,
                               "num_local_experts": 4, "num_experts_per_tok": 2,
                               "shared_intermediate_size": 48, "embedding_multiplier": 2.0,
                               "residual_multiplier": 0.5, "attention_multiplier": 0.2,
                               "logits_scaling": 4.0, "pad_token_id": 0},
    # Hunyuan MoE (Hunyuan-A13B): per-head q/k norms after the rotary, 4 experts top-2 and the
    # shared MLP
    "tiny-hunyuan-moe": {"model_type": "hunyuan_v1_moe", **_TINY_COMMON, "head_dim": 16,
                         "num_experts": 4, "moe_topk": 2, "pad_token_id": 0},
    # ERNIE-4.5 MoE: interleaved rotary, layer 0 dense, then 4 experts top-2 (a router score
    # correction) and 2 shared experts; tied embeddings, as the releases
    "tiny-ernie4.5-moe": {"model_type": "ernie4_5_moe", **_TINY_COMMON, "num_hidden_layers": 3,
                          "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 32,
                          "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
                          "tie_word_embeddings": True, "pad_token_id": 0},
    # dots.llm1: per-head q/k norms, layer 0 dense, then 4 experts top-2 (sigmoid router with a
    # score correction) and a shared expert
    "tiny-dots1": {"model_type": "dots1", **_TINY_COMMON, "head_dim": 16, "n_routed_experts": 4,
                   "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
                   "first_k_dense_replace": 1, "pad_token_id": 0},
    # GLM-4.7-Flash: tiny-deepseek-v3's MLA (interleaved rotary) and MoE, one expert group
    "tiny-glm4-moe-lite": {"model_type": "glm4_moe_lite", **_TINY_COMMON,
                           "num_key_value_heads": 4, "n_routed_experts": 4,
                           "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                           "n_shared_experts": 1, "kv_lora_rank": 16, "q_lora_rank": 32,
                           "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
                           "mlp_layer_types": ["dense", "sparse"], "pad_token_id": 0},
    # EXAONE MoE: EXAONE 4's per-head q/k norms and sliding layers (3 sliding over 10 tokens, 1
    # full without rotary) with input norms, layer 0 dense, 4 experts top-2 and a shared one
    "tiny-exaone-moe": {"model_type": "exaone_moe", **_TINY_COMMON, "num_hidden_layers": 4,
                        "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                        "num_shared_experts": 1, "moe_intermediate_size": 32,
                        "first_k_dense_replace": 1, "sliding_window": 10,
                        "sliding_window_pattern": 4, "pad_token_id": 0},
    # Granite 4.0: 4 layers, Mamba-2 (4 heads of 16, 2 groups of state 8, 4 taps) then NoPE
    # attention, twice; each with 4 experts top-2 beside a shared MLP of 48; Granite's
    # multipliers. The dense variant keeps the shared MLP alone and rotates its attention.
    "tiny-granite4-h": {"model_type": "granitemoehybrid", **_TINY_COMMON, "num_hidden_layers": 4,
                        "layer_types": ["mamba", "attention"] * 2, "num_local_experts": 4,
                        "num_experts_per_tok": 2, "shared_intermediate_size": 48,
                        "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_n_groups": 2,
                        "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 1,
                        "mamba_chunk_size": 8, "embedding_multiplier": 2.0,
                        "residual_multiplier": 0.5, "attention_multiplier": 0.2,
                        "logits_scaling": 4.0, "pad_token_id": 0},
    "tiny-granite4-h-dense": {"model_type": "granitemoehybrid", **_TINY_COMMON,
                              "num_hidden_layers": 4,
                              "layer_types": ["mamba", "attention"] * 2, "num_local_experts": 0,
                              "shared_intermediate_size": 96, "mamba_n_heads": 4,
                              "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_d_state": 8,
                              "mamba_d_conv": 4, "mamba_expand": 1, "mamba_chunk_size": 8,
                              "position_embedding_type": "rope", "pad_token_id": 0},
    # dense families of Llama's walk: Gemma 1 (GeGLU, (1 + w) RMSNorms, embeddings scaled by
    # sqrt(hidden), 32-wide heads over a 64-wide hidden size), Helium, AFM (squared-ReLU plain
    # MLP), GLM-4-9B (q/k/v biases, interleaved partial rotary), Nemotron-4 (LayerNorm1p,
    # squared-ReLU plain MLP, a rotary over half of each head)
    "tiny-gemma": {"model_type": "gemma", **_TINY_COMMON, "head_dim": 32, "pad_token_id": 0},
    "tiny-helium": {"model_type": "helium", **_TINY_COMMON, "head_dim": 16, "pad_token_id": 0},
    "tiny-arcee": {"model_type": "arcee", **_TINY_COMMON, "pad_token_id": 0},
    "tiny-glm": {"model_type": "glm", **_TINY_COMMON, "head_dim": 16, "pad_token_id": 0},
    "tiny-nemotron": {"model_type": "nemotron", **_TINY_COMMON, "partial_rotary_factor": 0.5,
                      "pad_token_id": 0},
    # StarCoder2: LayerNorms, biases on every matrix, a plain MLP, every layer sliding over 10
    # tokens
    "tiny-starcoder2": {"model_type": "starcoder2", **_TINY_COMMON, "sliding_window": 10,
                        "pad_token_id": 0},
    # StableLM 2: LayerNorms, q/k/v biases, a rotary over a quarter of each head, per-head q/k
    # LayerNorms and the parallel residual (12B's)
    "tiny-stablelm": {"model_type": "stablelm", **_TINY_COMMON, "use_qkv_bias": True,
                      "qk_layernorm": True, "use_parallel_residual": True,
                      "partial_rotary_factor": 0.25, "pad_token_id": 0},
    # Command R (+): parallel blocks under one weight-only LayerNorm, interleaved rotary, q/k
    # norms per head (R+'s), tied embeddings, logits x 0.25; Command A / R7B: 3 sliding layers
    # (10 tokens, rotated) to 1 full (no rotary)
    "tiny-cohere": {"model_type": "cohere", **_TINY_COMMON, "use_qk_norm": True,
                    "logit_scale": 0.25, "tie_word_embeddings": True, "pad_token_id": 0},
    "tiny-cohere2": {"model_type": "cohere2", **_TINY_COMMON, "num_hidden_layers": 4,
                     "sliding_window": 10, "sliding_window_pattern": 4, "logit_scale": 0.25,
                     "tie_word_embeddings": True, "pad_token_id": 0},
    # Phi-2: one LayerNorm per parallel block, biases on every matrix and the LM head, a rotary
    # over 40% of each head; OLMo 1: LayerNorms without weights, q/k/v clamped to +-3
    "tiny-phi": {"model_type": "phi", **_TINY_COMMON, "partial_rotary_factor": 0.4,
                 "pad_token_id": 0},
    "tiny-olmo": {"model_type": "olmo", **_TINY_COMMON, "clip_qkv": 3.0, "pad_token_id": 0},
    # GPT-NeoX / Pythia: a rotary over a quarter of each head (Pythia's rotary_pct), a parallel
    # residual (the release default); the -sequential variant adds the sublayers in turn
    "tiny-gpt-neox": {"model_type": "gpt_neox", **_TINY_NO_GQA, "rotary_pct": 0.25},
    "tiny-gpt-neox-sequential": {"model_type": "gpt_neox", **_TINY_NO_GQA, "rotary_pct": 0.25,
                                 "use_parallel_residual": False},
    # gpt-oss: attention sinks, q/k/v/o biases, 4 layers alternating sliding (a 10-token window,
    # shorter than most test prompts and not a multiple of the test block size) and full
    # attention, 4 experts top-2 with router bias and clamped SwiGLU, YaRN rope (gpt-oss's
    # rope_scaling with factor and original length scaled down to the tiny context)
    "tiny-gpt-oss": {"model_type": "gpt_oss", **_TINY_COMMON, "num_hidden_layers": 4,
                     "head_dim": 16, "intermediate_size": 32, "num_local_experts": 4,
                     "num_experts_per_tok": 2, "sliding_window": 10,
                     "layer_types": ["sliding_attention", "full_attention"] * 2,
                     "swiglu_limit": 7.0, "rope_theta": 150000.0,
                     "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                                      "beta_slow": 1.0, "truncate": False,
                                      "original_max_position_embeddings": 128},
                     # 4 layers at 0.5 grow activations to where fp32 noise (eager vs. SDPA
                     # summation order) reaches ~1e-3 in the logits; 0.3 keeps it ~1e-5
                     "initializer_range": 0.3},
    # Qwen3-Next: Gated DeltaNet on layers 0, 1 and 3 (a state per request, no KV), output-
    # gated softmax attention with a partial rotary (a quarter of each 16-dim head) on layer 2;
    # MoE of 4 experts (top 2) plus a gated shared expert, layer 1 a dense MLP
    "tiny-qwen3-next": {"model_type": "qwen3_next", **_TINY_LINEAR, **_TINY_LINEAR_MOE,
                        "mlp_only_layers": [1], "norm_topk_prob": True},
    # Qwen3.5 (its text model): tiny-qwen3-next's layout with split linear projections and a
    # multimodal rotary over text positions; dense, and the MoE release's shape (every layer
    # MoE, linear and full layers alternating)
    # Nemotron-H (Nemotron-3 Nano's layout): blocks of one kind each, in the release's
    # pattern language "ME*-M*E": Mamba-2 (4 heads of 16, 2 B/C groups of state 16, a 4-tap
    # convolution, 8-token scan chunks so prompts span several), NoPE softmax attention
    # (16-dim heads, GQA), a squared-ReLU MLP, and MoE of 4 non-gated experts (top 2, sigmoid
    # router) plus a shared expert; the Mamba block before the second attention has no MLP
    # after it, as in the releases
    "tiny-nemotron-h": {"model_type": "nemotron_h", **_TINY_NEMOTRON_H},
    # Nemotron-3 Super's LatentMoE: the routed experts run on a 32-wide latent of the 64 hidden
    "tiny-nemotron-h-latent": {"model_type": "nemotron_h", **_TINY_NEMOTRON_H,
                               "moe_latent_size": 32},
    "tiny-qwen3.5": {"model_type": "qwen3_5_text", **_TINY_LINEAR},
    "tiny-qwen3.5-moe": {"model_type": "qwen3_5_moe_text", **_TINY_LINEAR, **_TINY_LINEAR_MOE,
                         "layer_types": ["linear_attention", "full_attention"] * 2},
    # the multimodal Qwen3.5-MoE release: tiny-qwen3.5-moe's text model beside a one-block
    # vision tower (transformers' causal-LM class builds the text model alone)
    "tiny-qwen3.5-mm": {"model_type": "qwen3_5_moe", "initializer_range": 0.5,
                        "tie_word_embeddings": False,
                        "text_config": {**_TINY_LINEAR, **_TINY_LINEAR_MOE,
                                        "layer_types": ["linear_attention", "full_attention"] * 2},
                        "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64,
                                          "num_heads": 2, "out_hidden_size": 64}},
    # Gemma 3 (text): 4 layers, 3 sliding (a 10-token window, as tiny-gpt-oss's) then 1 full, as
    # the releases' 5 local : 1 global; per-head q/k RMSNorm, sandwich norms, 16-wide heads
    # scaled by query_pre_attn_scalar 16, tied embeddings scaled by sqrt(hidden), GeGLU MLP,
    # local and global rotaries of different bases (HF's defaults, 10k and 1M)
    "tiny-gemma3": {"model_type": "gemma3_text", **_TINY_COMMON, "num_hidden_layers": 4,
                    "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 10,
                    "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
                    "tie_word_embeddings": True, "pad_token_id": 0},
    # Gemma 2: sliding and full layers alternating (sliding first; a 10-token window), sandwich
    # norms, attention scores soft-capped at 50 and the final logits at 30 (the releases'),
    # tied embeddings scaled by sqrt(hidden), one rotary
    "tiny-gemma2": {"model_type": "gemma2", **_TINY_COMMON, "num_hidden_layers": 4,
                    "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 10,
                    "layer_types": ["sliding_attention", "full_attention"] * 2,
                    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                    "tie_word_embeddings": True, "pad_token_id": 0},
    # the multimodal Gemma 3 release (4B-27B): tiny-gemma3's text model beside a one-layer
    # SigLIP tower and projector that text prompts never reach
    "tiny-gemma3-mm": {"model_type": "gemma3", "initializer_range": 0.5, "bos_token_id": 1,
                       "eos_token_id": 2, "pad_token_id": 0, "mm_tokens_per_image": 4,
                       "boi_token_index": 253, "eoi_token_index": 254, "image_token_index": 255,
                       "text_config": {
                           **{k: v for k, v in _TINY_COMMON.items()
                              if k not in ("bos_token_id", "eos_token_id")},
                           "num_hidden_layers": 4, "head_dim": 16, "query_pre_attn_scalar": 16,
                           "sliding_window": 10,
                           "layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
                       "vision_config": {"hidden_size": 32, "intermediate_size": 64,
                                         "num_hidden_layers": 1, "num_attention_heads": 2,
                                         "image_size": 28, "patch_size": 14}},
    # Phi-3 / Phi-4-mini: fused qkv_proj and gate_up_proj, a rotary over 3/4 of each head
    # (Phi-4-mini's partial_rotary_factor), a 10-token window on every layer (Phi-3-mini-4k
    # slides all of its layers), GQA
    "tiny-phi3": {"model_type": "phi3", **_TINY_COMMON, "partial_rotary_factor": 0.75,
                  "sliding_window": 10, "pad_token_id": 0},
    "tiny-gpt2": {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "vocab_size": 256,
        "n_positions": 512,
        "initializer_range": 0.5,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}

BUILTIN_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-50m": LLAMA_50M,
    "llama-3-8b": LLAMA_3_8B,
    **TINY,
}
DEFAULT_MODEL = "llama-50m"


def builtin_config(name: str) -> dict[str, Any]:
    """A deep copy of the built-in config `name` (its nested mappings too: a caller may edit
    them); ValueError listing the names if unknown."""
    try:
        return copy.deepcopy(BUILTIN_CONFIGS[name])
    except KeyError:
        raise ValueError(
            f"unknown built-in model {name!r}; built-in: {', '.join(sorted(BUILTIN_CONFIGS))} "
            "(or pass a model directory, a config.json path or a config dict)"
        ) from None
