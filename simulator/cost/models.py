"""Model shapes (`ModelSpec`) and the model catalog (`simulator/catalog/models.yaml`); a
Hugging Face `config.json` is read by `hf_config.py`, dtype sizes live in `dtypes.py`.

Derived sizes count every parameter of the HF implementation (biases, norms, learned
position embeddings), so `num_params` equals `model.num_parameters()` of `transformers`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any

from simulator.cost.catalog_file import read_catalog
from simulator.cost.catalog_match import normalize_name, unknown_name_error
from simulator.cost.dtypes import dtype_bytes, matrix_weight_bytes, normalize_dtype
from simulator.cost.hf_config import hf_config_fields

# `ModelSpec.norm` -> weights of one norm per hidden unit
NORM_WEIGHTS = {"rms": 1, "layer": 2, "none": 0}
# `ModelSpec.linear_kind` -> (name, what it is)
LINEAR_MIXERS = {"": ("Gated DeltaNet", "linear attention"), "mamba2": ("Mamba-2", "state-space")}


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer (sizes in elements, counts in layers/heads)."""

    name: str
    architecture: str  # HF class name, e.g. "LlamaForCausalLM"
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int  # per expert for MoE
    vocab_size: int
    num_experts: int = 1  # 1 for dense models
    experts_per_token: int = 1
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    gated_mlp: bool = True  # SwiGLU (gate, up, down) vs two-matrix MLP (GPT-2, OPT)
    qkv_bias: bool = False
    o_bias: bool = False  # bias on the attention output projection
    mlp_bias: bool = False  # biases on the MLP matrices (GPT-2, OPT)
    qk_norm: bool = False  # RMSNorm on each query and key head (Qwen3): 2 x head_dim weights
    qk_norm_across_heads: bool = False  # MiniMax-M2: one RMSNorm over all q heads, one over k
    qk_norm_weightless: bool = False  # Llama 4: an L2 norm per head with no weights
    sandwich_norms: bool = False  # Gemma 2/3: RMSNorms on the attention and MLP outputs too
    norm: str = "rms"  # "rms" (weight), "layer" (weight + bias) or "none" (OLMo 1: no weights)
    # attention and MLP read one norm's output and add to the residual together (Phi-2, Cohere,
    # StableLM 2 with use_parallel_residual): one norm per layer, not two
    parallel_block: bool = False
    num_learned_positions: int = 0  # rows of a learned position table (GPT-2, OPT)
    embed_proj_dim: int = 0  # OPT word_embed_proj_dim when it differs from hidden_size
    final_norm: bool = True  # a norm before the LM head (OPT-350m, normed per sublayer, has none)
    hf_id: str = ""
    # ---- mixtures of experts beyond Mixtral (model_variants.moe_fields) ----
    num_shared_experts: int = 0  # always-on experts of each MoE layer
    shared_expert_ffn_size: int = 0  # their total intermediate size
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert
    num_dense_layers: int = 0  # layers with a dense MLP instead of experts (DeepSeek's first k)
    dense_layer_ids: tuple[int, ...] = ()  # where those layers sit (empty: the first ones)
    dense_ffn_size: int = 0  # intermediate size of those dense MLPs
    # ---- multi-head latent attention (DeepSeek-V2/V3; 0 = ordinary attention) ----
    kv_lora_rank: int = 0  # latent KV size cached per token and layer
    q_lora_rank: int = 0  # 0: a plain q_proj
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0  # rotary key dims, cached per token next to the latent
    v_head_dim: int = 0
    # ---- DeepSeek Sparse Attention (DeepSeek-V3.2; 0 = every query attends to all keys) ----
    index_topk: int = 0  # keys each query attends to, picked by the lightning indexer
    index_n_heads: int = 0  # the indexer's query heads
    index_head_dim: int = 0  # its query and key width (keys cached in FP8)
    num_index_layers: int = 0  # layers running their own indexer (0: all; GLM-5.2's others reuse
    #                            the previous layer's top-k: no indexer weights, keys or scores)
    # ---- sliding-window attention (0 = none) ----
    attention_sinks: bool = False  # a learned sink logit per head (gpt-oss): vLLM's kernel choice
    expert_bias: bool = False  # gpt-oss: biases on every expert's matrices and on the router
    router_bias: bool = False  # ERNIE-4.5 MoE: a score correction per expert, a parameter
    lm_head_bias: bool = False  # Phi-3.5-MoE: a bias on the LM head's logits
    sliding_window: int = 0  # tokens a sliding layer attends to (keys pos-window+1 .. pos)
    num_sliding_layers: int = 0  # layers that use it (the rest attend to the full context)
    # ---- Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5; 0 = none) ----
    num_linear_layers: int = 0  # layers of linear attention: a fixed-size state, no KV cache
    linear_key_heads: int = 0  # query/key heads of those layers
    linear_value_heads: int = 0  # value heads (each keeps a key_dim x value_dim state)
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0  # taps of the causal convolution over q, k, v
    linear_state_dtype: str = ""  # the recurrent state's dtype ("": the model's dtype)
    # the linear layers' kind: "" Gated DeltaNet (rates a, b per value head), "mamba2"
    # (Nemotron-H's Mamba-2 mixer: a time step per head, a conv bias, a skip D per head)
    linear_kind: str = ""
    # ---- layers without an MLP (Nemotron-H: a block is one mixer or one MLP) ----
    mlp_free_layer_ids: tuple[int, ...] = ()  # layers (attention / linear) with no MLP after
    # ---- LatentMoE (Nemotron-3 Super, Ultra; 0 = experts on the hidden size) ----
    moe_latent_size: int = 0  # routed experts run on this width, projected down and up
    attn_output_gate: bool = False  # full attention gates its output (q_proj emits the gate)
    # ---- how the checkpoint is stored (config.json quantization_config; "" = not quantized) ----
    checkpoint_quant_method: str = ""  # a kvpd method (fp8, mxfp4, ...) the release uses
    checkpoint_quant_scope: str = ""  # a precision.SCOPES name (what the quantization covers)
    checkpoint_quant_group_size: int = 0  # weights per scale group of a weight-only method

    # ---- per-layer parameter counts (elements) ----
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: the cache holds `kv_lora_rank + qk_rope_head_dim`."""
        return self.kv_lora_rank > 0

    @property
    def is_sparse_attention(self) -> bool:
        """DeepSeek Sparse Attention: each query attends to the `index_topk` keys an indexer
        scores highest among all of them."""
        return self.index_topk > 0

    @property
    def attention_window(self) -> int:
        """Keys a capped query attends to at most (tokens; 0: no cap): the sliding window of
        the sliding layers, or sparse attention's top-k (every layer)."""
        return self.sliding_window if self.num_sliding_layers else self.index_topk

    @property
    def index_layer_share(self) -> float:
        """Fraction of layers that run their own sparse-attention indexer (0 without one)."""
        if not self.is_sparse_attention:
            return 0.0
        return self.num_index_layers / self.num_layers if self.num_index_layers else 1.0

    @property
    def mean_indexer_params(self) -> float:
        """Indexer matrix weights per layer, averaged over the layers (those reusing another
        layer's top-k have none)."""
        return self.indexer_matrix_params * self.index_layer_share

    @property
    def mean_indexer_key_bytes(self) -> float:
        """Indexer key bytes one token caches per layer, averaged over the layers."""
        return self.indexer_key_bytes * self.index_layer_share

    @cached_property
    def indexer_matrix_params(self) -> int:
        """The sparse-attention indexer's matrices of one layer that runs one: its query
        projection from the q LoRA rank, its key projection and its per-head weights."""
        if not self.is_sparse_attention:
            return 0
        n, dk, d = self.index_n_heads, self.index_head_dim, self.hidden_size
        return (self.q_lora_rank or d) * n * dk + d * dk + d * n

    @property
    def has_linear_attention(self) -> bool:
        """Some layers run Gated DeltaNet linear attention (a recurrent state, no KV cache)."""
        return self.num_linear_layers > 0

    @property
    def num_full_attention_layers(self) -> int:
        """Layers of softmax attention: the ones that cache K and V per token."""
        return self.num_layers - self.num_linear_layers

    @property
    def num_mlp_free_layers(self) -> int:
        """Layers with attention (or a linear mixer) and no MLP (Nemotron-H's blocks)."""
        return len(self.mlp_free_layer_ids)

    @property
    def num_mlp_layers(self) -> int:
        """Layers with an MLP (dense or experts)."""
        return self.num_layers - self.num_mlp_free_layers

    @property
    def linear_mixer_name(self) -> str:
        """The linear layers' name: "Gated DeltaNet" or "Mamba-2"."""
        return LINEAR_MIXERS[self.linear_kind][0]

    @property
    def linear_mixer(self) -> str:
        """What the linear layers are, in words: "Gated DeltaNet linear attention" or
        "Mamba-2 state-space"."""
        return " ".join(LINEAR_MIXERS[self.linear_kind])

    @property
    def linear_heads(self) -> str:
        """The linear layers' heads, in words (Mamba-2: heads and B/C groups; Gated DeltaNet:
        key and value heads)."""
        if self.linear_kind == "mamba2":
            return (f"{self.linear_value_heads} heads of {self.linear_value_head_dim}, "
                    f"{self.linear_key_heads} groups of state {self.linear_key_head_dim}")
        return (f"{self.linear_key_heads} key / {self.linear_value_heads} value heads of "
                f"{self.linear_key_head_dim} x {self.linear_value_head_dim}")

    @property
    def linear_rate_outputs(self) -> int:
        """Per-token rate outputs of a linear layer's input projection: Gated DeltaNet's decay
        and write rates (a, b: two per value head), Mamba-2's time step (one per head)."""
        return self.linear_value_heads * (1 if self.linear_kind == "mamba2" else 2)

    @property
    def expert_width(self) -> int:
        """The width the routed experts read and write: LatentMoE's latent, else hidden."""
        return self.moe_latent_size or self.hidden_size

    @property
    def latent_proj_params(self) -> int:
        """LatentMoE's down and up projections between hidden and latent, per MoE layer."""
        return 2 * self.hidden_size * self.moe_latent_size

    @property
    def linear_conv_dim(self) -> int:
        """Channels of a linear-attention layer's causal convolution: its q, k and v."""
        return (2 * self.linear_key_heads * self.linear_key_head_dim
                + self.linear_value_heads * self.linear_value_head_dim)

    @cached_property
    def linear_attn_matrix_params(self) -> int:
        """Matrices of one linear-attention layer: the input projection to q, k, v (Mamba-2:
        x, B, C), the output gate z and the per-head rates (`linear_rate_outputs`), and the
        output projection."""
        d = self.hidden_size
        v = self.linear_value_heads * self.linear_value_head_dim
        return d * (self.linear_conv_dim + v + self.linear_rate_outputs) + v * d

    @property
    def linear_layer_small_params(self) -> int:
        """Never-quantized weights of one linear-attention layer: the depthwise convolution,
        the per-head decay (A_log) and time-step bias, and the gated RMSNorm (Gated DeltaNet:
        over one head's values; Mamba-2: over all of them, with a conv bias and a skip D per
        head)."""
        if self.linear_kind == "mamba2":
            return (self.linear_conv_dim * (self.linear_conv_kernel + 1)
                    + 3 * self.linear_value_heads
                    + self.linear_value_heads * self.linear_value_head_dim)
        return (self.linear_conv_dim * self.linear_conv_kernel + 2 * self.linear_value_heads
                + self.linear_value_head_dim)

    def linear_state_bytes(self, dtype: str = "bf16") -> float:
        """Bytes of one request's recurrent state over all linear-attention layers for weights
        in `dtype`: each value head's key_dim x value_dim matrix (in `linear_state_dtype`, else
        the activations' dtype: fp32 for fp32 weights, else bf16) and the last kernel - 1
        convolution inputs (in the activations' dtype)."""
        if not self.has_linear_attention:
            return 0.0
        dtype = "fp32" if dtype == "fp32" else "bf16"
        state_dtype = self.linear_state_dtype or dtype
        ssm = (self.linear_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
               * dtype_bytes(state_dtype))
        conv = (self.linear_conv_kernel - 1) * self.linear_conv_dim * dtype_bytes(dtype)
        return self.num_linear_layers * (ssm + conv)

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is routed experts (0 for a dense model)."""
        return self.num_mlp_layers - self.num_dense_layers if self.is_moe else 0

    @cached_property
    def attn_matrix_params(self) -> int:
        """Q, K, V and output projection weights of one layer (MLA: q (LoRA), the KV down
        projection to latent + rope key, the latent's up projection to K_nope and V, o; sparse
        attention's indexer, averaged over the layers where some share one)."""
        d, hd = self.hidden_size, self.head_dim
        if self.is_mla:
            h, qr = self.num_heads, self.q_lora_rank
            q = d * qr + qr * h * hd if qr else d * h * hd
            kv = d * (self.kv_lora_rank + self.qk_rope_head_dim) \
                + self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + h * self.v_head_dim * d + round(self.mean_indexer_params)
        if self.has_linear_attention:  # the layers' mean (their total: attention_matrix_params)
            return round(self.attention_matrix_params / self.num_layers)
        return self.full_attn_matrix_params

    @cached_property
    def full_attn_matrix_params(self) -> int:
        """Q (and its output gate), K, V and O weights of one softmax-attention layer."""
        d, hd, h = self.hidden_size, self.head_dim, self.num_heads
        q = h * hd * (2 if self.attn_output_gate else 1)
        return d * (q + 2 * self.num_kv_heads * hd) + h * hd * d

    @cached_property
    def attention_matrix_params(self) -> int:
        """Attention matrix weights of all layers (softmax and linear attention ones)."""
        if not self.has_linear_attention:
            return self.num_layers * self.attn_matrix_params
        return (self.num_full_attention_layers * self.full_attn_matrix_params
                + self.num_linear_layers * self.linear_attn_matrix_params)

    @cached_property
    def shared_expert_params(self) -> int:
        """Shared-expert MLP weights of one MoE layer."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.shared_expert_ffn_size

    @cached_property
    def dense_mlp_params(self) -> int:
        """MLP weights of one dense layer of an MoE model (`num_dense_layers` of them)."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.dense_ffn_size

    def _mlp_params(self, routed: int) -> int:
        """MLP weights over all layers with `routed` routed experts per MoE layer (and
        LatentMoE's projections)."""
        if not self.is_moe:
            return self.num_mlp_layers * self.expert_matrix_params
        return (self.num_moe_layers * (routed * self.expert_matrix_params
                                       + self.shared_expert_params + self.latent_proj_params)
                + self.num_dense_layers * self.dense_mlp_params)

    @cached_property
    def mlp_matrix_params(self) -> int:
        """MLP weights of all layers: every routed and shared expert, and the dense MLPs."""
        return self._mlp_params(self.num_experts)

    @cached_property
    def active_mlp_params(self) -> int:
        """MLP weights one token touches over all layers (k routed + shared experts)."""
        return self._mlp_params(self.experts_per_token)

    @cached_property
    def variant_small_params(self) -> int:
        """Norms and gates of the MoE / MLA / q-k-norm variants, all layers (never quantized):
        routers (and Qwen2-MoE's shared-expert gate) on the MoE layers only (DeepSeek-V3's
        per-expert score bias is a buffer, not a parameter, in HF; ERNIE-4.5's a parameter),
        MLA's latent (and q LoRA) RMSNorms, Qwen3's per-head q/k norms (MiniMax-M2's across
        the heads), gpt-oss's sink logits and expert and router biases."""
        d, n = self.hidden_size, 0
        if self.is_moe:
            per = d * self.num_experts + (d if self.shared_expert_gate else 0)
            if self.expert_bias:  # the router's and each expert's (gate/up and down) biases
                per += self.num_experts * (1 + self.mlp_bias_params)
            elif self.router_bias:
                per += self.num_experts
            n += self.num_moe_layers * per
        if self.is_mla:
            n += self.num_layers * (self.kv_lora_rank + self.q_lora_rank)
        if self.is_sparse_attention:  # the indexer's key LayerNorm (weight and bias)
            n += (self.num_index_layers or self.num_layers) * 2 * self.index_head_dim
        if self.qk_norm and not self.qk_norm_weightless:
            width = self.num_heads + self.num_kv_heads if self.qk_norm_across_heads else 2
            n += self.num_full_attention_layers * width * self.head_dim
        if self.attention_sinks:
            n += self.num_full_attention_layers * self.num_heads
        n += self.num_linear_layers * self.linear_layer_small_params
        return n

    @property
    def norm_params(self) -> int:
        """Weights of one norm over the hidden size: RMSNorm's scale, LayerNorm's scale and
        bias, none for a non-parametric LayerNorm."""
        return self.hidden_size * NORM_WEIGHTS[self.norm]

    @property
    def norms_per_layer(self) -> int:
        """Norms of one layer: one before each sublayer, one shared by both in a parallel
        block, and one after each as well with sandwich norms."""
        return 1 if self.parallel_block else 4 if self.sandwich_norms else 2

    @property
    def mlp_bias_params(self) -> int:
        """Biases of one MLP's (or one expert's) matrices: gate/up, then down."""
        return (2 if self.gated_mlp else 1) * self.ffn_size + self.hidden_size

    @cached_property
    def expert_matrix_params(self) -> int:
        """MLP weights of one expert (the whole MLP for a dense model; LatentMoE's experts on
        the latent width)."""
        return (3 if self.gated_mlp else 2) * self.expert_width * self.ffn_size

    @cached_property
    def layer_small_params(self) -> int:
        """Biases, norms and the MoE router of one layer (never quantized)."""
        d, hd = self.hidden_size, self.head_dim
        n = 0
        if self.qkv_bias:
            n += (self.num_heads + 2 * self.num_kv_heads) * hd
        if self.o_bias:
            n += d
        if self.mlp_bias:
            n += self.num_experts * self.mlp_bias_params
        n += self.norms_per_layer * self.norm_params
        if self.is_moe:  # the router, averaged over the layers (see variant_small_params)
            n += self.variant_small_params // self.num_layers
        return n

    @cached_property
    def embedding_params(self) -> int:
        """Token (+ learned position, + OPT projection) embeddings, final norm, LM head."""
        d = self.hidden_size
        p = self.embed_proj_dim or d
        n = self.vocab_size * p + self.num_learned_positions * d
        if p != d:
            n += 2 * p * d  # OPT project_in / project_out
        if not self.tie_word_embeddings:
            n += self.vocab_size * p
        if self.lm_head_bias:
            n += self.vocab_size
        return n + (self.norm_params if self.final_norm else 0)

    @cached_property
    def small_params(self) -> int:
        """Biases, norms, routers and gates of all layers (never quantized)."""
        if not (self.is_moe or self.is_mla or self.qk_norm or self.has_linear_attention
                or self.num_mlp_free_layers or self.attention_sinks):
            return self.num_layers * self.layer_small_params
        base = self._dense_twin().layer_small_params
        return (self.num_layers * base + self.variant_small_params
                - self.num_mlp_free_layers * self.mlp_small_params)

    @property
    def mlp_small_params(self) -> int:
        """The never-quantized weights a layer's MLP brings: its RMSNorm (or LayerNorm) and
        biases (a layer without an MLP has neither)."""
        n = 0 if self.parallel_block else self.norm_params
        if self.mlp_bias:
            n += self.mlp_bias_params
        return n

    def _dense_twin(self) -> ModelSpec:
        """This shape without experts (for the per-layer biases and norms alone)."""
        fields = {k: getattr(self, k) for k in ModelSpec.__dataclass_fields__}
        fields.update(num_experts=1, experts_per_token=1)
        return ModelSpec(**fields)

    @cached_property
    def num_params(self) -> int:
        return (self.attention_matrix_params + self.mlp_matrix_params
                + self.small_params + self.embedding_params)

    @cached_property
    def num_active_params(self) -> int:
        """Parameters one token touches (MoE: `experts_per_token` routed + shared experts)."""
        idle = (self.num_moe_layers * (self.num_experts - self.experts_per_token)
                * self.mlp_bias_params if self.expert_bias else 0)
        return (self.attention_matrix_params + self.active_mlp_params
                + self.small_params - idle + self.embedding_params)

    def quantizable_params(self) -> int:
        """Weights of the attention and MLP matrices, the part fp8/int4 checkpoints quantize
        (embeddings, LM head, norms and biases stay in 16 bits, as in vLLM's AWQ/GPTQ/FP8)."""
        return self.attention_matrix_params + self.mlp_matrix_params

    def weight_bytes(self, dtype: str = "bf16", matrix_bytes: float | None = None) -> float:
        """Bytes of all weights stored in `dtype` (quantized dtypes: matrices only);
        `matrix_bytes` overrides the bytes per matrix weight (a `Precision`'s, with its
        quantization groups)."""
        dt = normalize_dtype(dtype)
        quant = self.quantizable_params()
        rest = self.num_params - quant
        mb = matrix_weight_bytes(dt) if matrix_bytes is None else matrix_bytes
        return quant * mb + rest * (4.0 if dt == "fp32" else 2.0)

    def kv_bytes_per_token(self, dtype: str = "bf16") -> float:
        """KV-cache bytes of one token, all layers: 2 x layers x kv_heads x head_dim x bytes
        (softmax-attention layers only: linear attention keeps a state, `linear_state_bytes`),
        or for MLA layers x (kv_lora_rank + qk_rope_head_dim) x bytes (the latent alone),
        plus sparse attention's indexer keys (`indexer_key_bytes`, whatever `dtype`)."""
        if self.is_mla:
            return self.num_layers * self.mla_kv_bytes(dtype)
        return (2 * self.num_full_attention_layers * self.num_kv_heads * self.head_dim
                * dtype_bytes(dtype))

    def mla_kv_bytes(self, dtype: str = "bf16") -> float:
        """Bytes one token caches in one MLA layer: its latent and rotary key in `dtype`, plus a
        sparse-attention indexer key (`indexer_key_bytes`; averaged over the layers where some
        reuse another's top-k and cache none)."""
        return ((self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes(dtype)
                + self.mean_indexer_key_bytes)

    @property
    def indexer_key_bytes(self) -> int:
        """Bytes of one token's sparse-attention indexer key in one layer: FP8 with one fp32
        scale per 128 values, as vLLM caches DeepSeek-V3.2's (0 without sparse attention)."""
        dk = self.index_head_dim
        return dk + 4 * -(-dk // 128) if dk else 0

    @cached_property
    def flops_per_token(self) -> int:
        """Forward FLOPs of one token with no context: 2 x active matrix weights incl. LM head
        (attention scores add `attention_flops_per_token(context)`)."""
        d = self.hidden_size
        p = self.embed_proj_dim or d
        matrices = self.attention_matrix_params + self.active_mlp_params
        if self.is_moe:
            matrices += self.num_moe_layers * d * self.num_experts  # the router
        matrices += self.vocab_size * p + (2 * p * d if p != d else 0)
        return 2 * matrices

    def attention_flops_per_token(self, context: int) -> int:
        """Score and value FLOPs of one query token attending to `context` keys (sliding
        layers see at most `sliding_window` of them, sparse attention `index_topk` plus its
        indexer's scores over all; MLA: q.k over nope + rope dims, p.v over `v_head_dim`)."""
        per_key = 2 * self.num_heads * (self.head_dim + (self.v_head_dim if self.is_mla
                                                         else self.head_dim))
        if self.is_sparse_attention:  # the top-k keys, and the indexer's scores over all
            return self.num_layers * (per_key * min(context, self.index_topk)
                                      + 2 * self.index_n_heads * self.index_head_dim * context
                                      * self.index_layer_share)
        full = self.num_full_attention_layers - self.num_sliding_layers
        return per_key * (full * context
                          + self.num_sliding_layers * min(context, self.sliding_window))

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str | None = None) -> ModelSpec:
        """Parse a Hugging Face config.json dict (the families `hf_config.py` names)."""
        return _parse_hf_config(cfg, name, "config")


def _parse_hf_config(cfg: dict[str, Any], name: str | None, where: str) -> ModelSpec:
    return ModelSpec(**hf_config_fields(cfg, name, where))


# ----------------------------------------------------------------------------- catalog


@cache
def _catalog() -> dict[str, dict[str, Any]]:
    return {normalize_name(k): v for k, v in read_catalog("models.yaml").items()}


@cache
def _aliases() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, entry in _catalog().items():
        out[normalize_name(entry["hf_id"])] = name
        for alias in entry.get("aliases") or ():
            out[normalize_name(alias)] = name
    return out


def list_models() -> list[str]:
    """Catalog model names, in catalog order."""
    return list(_catalog())


@cache
def _catalog_model(key: str) -> ModelSpec:
    entry = _catalog()[key]
    spec = _parse_hf_config(entry["config"], key, f"models.yaml:{key}")
    return _with_hf_id(spec, entry["hf_id"])


def _with_hf_id(spec: ModelSpec, hf_id: str) -> ModelSpec:
    fields = {k: getattr(spec, k) for k in ModelSpec.__dataclass_fields__}
    fields["hf_id"] = hf_id
    return ModelSpec(**fields)


def load_hf_config(path: str) -> ModelSpec:
    """A ModelSpec from a config.json file, or a directory holding one."""
    return _parse_hf_config(*_read_config_file(path))


def _read_config_file(path: str) -> tuple[dict[str, Any], str, str]:
    """(config dict, model name, the file read) of a config.json file or a directory holding
    one; errors name the file."""
    if os.path.isdir(path):
        folder, path = path, os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{folder}: a model folder holds a config.json; this one "
                                    "has none")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a JSON text file ({exc.reason} at byte {exc.start})") from None
    # a checkpoint's config.json is named by its folder (HF's layout); any other file by its stem
    base = os.path.basename(path)
    if base == "config.json" and isinstance(cfg, dict) and "quantization_config" not in cfg:
        cfg = _with_modelopt_config(cfg, os.path.join(os.path.dirname(path),
                                                      "hf_quant_config.json"))
    name = (os.path.basename(os.path.dirname(os.path.abspath(path))) if base == "config.json"
            else os.path.splitext(base)[0]) or path
    return cfg, name, path


def _with_modelopt_config(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    """`cfg` with the ModelOpt export's `hf_quant_config.json` at `path` as its
    quantization_config (quant_method modelopt), as vLLM reads such a checkpoint; `cfg` when
    there is none. A file that is not a JSON object is refused naming it."""
    if not os.path.isfile(path):
        return cfg
    try:
        with open(path, encoding="utf-8") as f:
            quant = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(quant, dict):
        raise ValueError(f"{path}: expected a JSON object (ModelOpt's hf_quant_config), got "
                         f"{type(quant).__name__}")
    return {**cfg, "quantization_config": {"quant_method": "modelopt", **quant}}


def merged_config(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` laid over it, nested mappings key by key (vLLM's
    `--hf-overrides`: `{"text_config": {"sliding_window": 4096}}` changes that key only)."""
    out = dict(base)
    for k, v in overrides.items():
        out[k] = (merged_config(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict)
                  else v)
    return out


def _config_of(x: str | dict[str, Any]) -> tuple[dict[str, Any], str | None, str, str | None]:
    """(HF config dict, name, where, hf_id) behind a catalog name / alias, a config path or
    a config dict."""
    if isinstance(x, dict):
        return x, None, "config", None
    key = normalize_name(x)
    key = key if key in _catalog() else _aliases().get(key)
    if key is not None:
        entry = _catalog()[key]
        return entry["config"], key, f"models.yaml:{key}", entry["hf_id"]
    if not os.path.exists(x):
        get_model(x)  # raises: an unknown name or a missing file, said as without overrides
    cfg, name, path = _read_config_file(x)
    return cfg, name, path, None


def get_model(name_or_path_or_dict: str | dict[str, Any],
              hf_overrides: dict[str, Any] | None = None) -> ModelSpec:
    """A catalog model (name, alias or HF id), a config.json path/directory, or a config dict;
    `hf_overrides`: HF config keys laid over its config first (vLLM's `--hf-overrides`, SGLang's
    `--json-model-override-args`), e.g. GLM-5's `index_topk_pattern` or a shorter context."""
    x = name_or_path_or_dict
    if hf_overrides:
        if not isinstance(hf_overrides, dict):
            raise ValueError(f"hf_overrides must be a mapping of HF config keys to values, got "
                             f"{type(hf_overrides).__name__}")
        if isinstance(x, ModelSpec):
            raise ValueError("hf_overrides need the model's HF config: give a catalog name, a "
                             "config.json path or a config dict, not a ModelSpec")
        cfg, name, where, hf_id = _config_of(x)
        spec = _parse_hf_config(merged_config(cfg, hf_overrides), name,
                                f"{where} with hf_overrides")
        return _with_hf_id(spec, hf_id) if hf_id else spec
    if isinstance(x, ModelSpec):
        return x
    if isinstance(x, dict):
        return ModelSpec.from_hf_config(x)
    if not isinstance(x, str):
        raise ValueError(f"model must be a name, a path or a mapping, got {type(x).__name__}")
    key = normalize_name(x)
    if key in _catalog():
        return _catalog_model(key)
    if key in _aliases():
        return _catalog_model(_aliases()[key])
    if os.path.exists(x):
        return load_hf_config(x)
    looks_like_path = x.endswith(".json") or x.startswith((".", "/", "~")) or x.count("/") > 1
    if looks_like_path:  # HF ids are exactly one "org/name": this was meant as a file
        raise FileNotFoundError(f"no such file or directory: {x} (a model is a catalog name, an HF "
                                "config.json path or a folder holding one)")
    raise unknown_name_error("model", x, [*_catalog(), *_aliases()], listed=_catalog())
