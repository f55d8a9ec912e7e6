"""Run an HF causal LM's own weights over a flat token batch with a pluggable attention.

We walk the HF modules ourselves (embeddings, norms, rotary, projections, MLP, lm_head are
the model's own submodules, called as HF calls them) and replace only the attention core, so
logits match HF's forward while K/V live in our paged cache. Tokens are flat
(`[num_tokens, hidden]`, no batch dimension): requests of different lengths share the
linear layers without padding (ORCA's selective batching).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from realexec.engine.attention import AttentionBackend, sdpa_backends
from realexec.engine.family_rules import (
    GRANITE_MODEL_TYPES,
    HF_ROTARY_MODEL_TYPES,
    LOGIT_SCALE_MODEL_TYPES,
    MLP_RETURNS_SCORES,
    MOE_MODEL_TYPES,
    POST_NORM_MODEL_TYPES,
    ROTARY_PER_TYPE,
    SANDWICH_NORMS,
    SINK_MODEL_TYPES,
    layer_windows,
    parallel_block,
    rotary_layers,
)
from realexec.engine.linear_attention import LinearStates, Segment, linear_layers
from realexec.engine.llama4 import complex_rotary, forward_llama4
from realexec.engine.mla import (
    MLA_MODEL_TYPES,
    indexer_rotate,
    mla_attention,
    mla_cache_dim,
    mla_rotate,
)
from realexec.engine.model_loader import SUPPORTED_MODEL_TYPES, check_supported
from realexec.engine.sparse_index import SparseIndexState, index_key_dim

# families with a walk of their own (the rest share `_forward_llama`'s module names)
OWN_WALK_FAMILIES = ("gpt2", "opt", "gpt_neox")
# rows below which CPU GEMMs are padded (see compute_logits)
_CPU_MIN_GEMM_ROWS = 4


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first `cos.shape[-1]` dims of each head (all of them, or a partial rotary
    such as GLM-4.5's `partial_rotary_factor` 0.5) and pass the rest through, as HF does."""
    d = cos.shape[-1]
    if d == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rot = x[..., :d]
    return torch.cat((rot * cos + _rotate_half(rot) * sin, x[..., d:]), dim=-1)


def _own_walk_modules(hf_model: nn.Module) -> tuple[nn.Module, nn.ModuleList, nn.Module, str]:
    """(base model, decoder layers, final norm, each layer's attention attribute) of a family
    with a walk of its own: GPT-2, OPT (its final LayerNorm, absent in 350m, which norms after
    each sublayer, then the projection back to the embedding width: 350m 1,024 -> 512) and
    GPT-NeoX."""
    family = hf_model.config.model_type
    if family == "gpt2":
        base = hf_model.transformer
        return base, base.h, base.ln_f, "attn"
    if family == "opt":  # learned positions, LayerNorms, a ReLU MLP (fc1, fc2)
        base = hf_model.model.decoder
        final = nn.Sequential(*(m for m in (base.final_layer_norm, base.project_out)
                                if m is not None))
        return base, base.layers, final, "self_attn"
    base = hf_model.gpt_neox
    return base, base.layers, base.final_layer_norm, "attention"


class PagedCausalLM:
    """A flat-batch forward over an HF Llama / Mistral / Qwen2 / Qwen3 / Seed-OSS / SmolLM3
    (NoPE layers) / Granite 3 (scalar multipliers) / OLMo 2 and 3 and EXAONE 4 (norms after
    each sublayer) / GLM-4-0414 (four norms, interleaved partial rotary) / Hunyuan dense (q/k
    norms after the rotary) / ERNIE-4.5 dense (interleaved rotary) / Phi-3 (fused projections) / Gemma 2 and 3 (mixed windows,
    sandwich norms) / GPT-2 / OPT causal LM, or the MoE Mixtral /
    Qwen2-MoE / Qwen3-MoE / DeepSeek-V3 (MLA) / DeepSeek-V3.2 and GLM-5 (MLA with sparse
    attention) / GLM-4.5 (partial rotary) / gpt-oss (sinks, mixed windows) / MiniMax-M2 (q/k
    norms across heads, partial rotary) / Llama 4 (chunked and NoPE layers, `llama4.py`) /
    OLMoE and FlexOlmo (q/k norms across heads, `clip_qkv`) / Phi-3.5-MoE (LayerNorms, biases) /
    Granite MoE (multipliers, a shared MLP) / Hunyuan MoE / ERNIE-4.5 MoE / dots.llm1 /
    GLM-4.7-Flash (MLA) / EXAONE MoE (sliding layers) / Gemma 1 / Helium / AFM (squared-ReLU
    MLP) / GLM-4-9B / Nemotron-4 (LayerNorm1p, partial rotary) / StarCoder2 (biases, a window) /
    StableLM (parallel residual, per-head q/k LayerNorms) / Command R and A (parallel blocks,
    interleaved rotary, logit scale) / Phi-2 (a parallel block, partial rotary) / OLMo 1
    (weightless LayerNorms, `clip_qkv`) / GPT-NeoX and Pythia (per-head fused QKV, partial
    rotary, a parallel residual over two norms), or the hybrids Qwen3-Next / Qwen3.5
    (Gated DeltaNet), Granite 4.0 (Mamba-2 and NoPE attention, MoE and a shared MLP)
    and Nemotron-H (Mamba-2, NoPE attention, MLP and MoE blocks)."""

    def __init__(self, hf_model: nn.Module) -> None:
        check_supported(hf_model.config, "model")
        config = hf_model.config.get_text_config()  # a multimodal Gemma 3: its text model
        self.hf = hf_model
        self.config = config
        self.family = config.model_type
        self.windows = layer_windows(config)
        own_walk = self.family in OWN_WALK_FAMILIES
        if own_walk:  # (no grouped-query heads, no MLA)
            base, layers, self.final_norm, attn_attr = _own_walk_modules(hf_model)
            self.layers = list(layers)
            self.num_heads = config.num_attention_heads
            self.head_dim = config.hidden_size // self.num_heads
            self.num_kv_heads = self.num_heads
            self.scales = [getattr(layer, attn_attr).scaling for layer in self.layers]
            self.mla = False
        # Qwen3-Next: Gated DeltaNet layers (a state per request, no KV) among the others;
        # Nemotron-H: Mamba-2 blocks likewise
        self.linear = linear_layers(config)
        self.has_linear = any(self.linear)
        # whether each layer caches KV: its softmax-attention layers (Nemotron-H's MLP and MoE
        # blocks are layers of their own, with neither KV nor a state)
        self.kv_layers = ([t == "full_attention" for t in config.layer_types]
                          if self.family == "nemotron_h" else [not lin for lin in self.linear])
        if not own_walk:
            base = getattr(hf_model.model, "language_model", hf_model.model)
            self.layers = list(base.layers)
            self.final_norm = (base.norm_f if self.family == "nemotron_h"
                               else base.final_layernorm if self.family == "phi" else base.norm)
            self.num_heads = config.num_attention_heads
            self.mla = self.family in MLA_MODEL_TYPES
            # each layer's attention module (Nemotron-H's is its block's mixer), None without
            attr = "mixer" if self.family == "nemotron_h" else "self_attn"
            attns = [getattr(layer, attr) if kv else None
                     for layer, kv in zip(self.layers, self.kv_layers)]
            first_attn = next(a for a in attns if a is not None)
            if self.mla:  # queries/keys of nope + rope dims; the cache holds the latent
                self.head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
            else:
                self.head_dim = first_attn.head_dim
            self.num_kv_heads = config.num_key_value_heads
            self.scales = [a.scaling if a is not None else None for a in attns]
        else:
            first_attn = getattr(self.layers[0], attn_attr)
        # the KV pool's layer of each softmax-attention layer (linear ones cache no KV)
        self.kv_index = [sum(self.kv_layers[:i]) for i in range(len(self.kv_layers))]
        self.num_kv_layers = sum(self.kv_layers)
        self.moe = self.family in MOE_MODEL_TYPES
        # fixed per model, so looked up once rather than per layer and step
        # Qwen3-Next, Qwen3.5: q_proj also emits a gate per head dim, sigmoid(gate) x the
        # attention output (HF's gated attention: twice the query features)
        q_proj = getattr(first_attn, "q_proj", None)
        self.output_gate = (not self.mla and q_proj is not None and isinstance(q_proj, nn.Linear)
                            and q_proj.out_features == 2 * self.num_heads * self.head_dim)
        q_norm = getattr(first_attn, "q_norm", None)
        # MiniMax-M2: one RMSNorm over all heads' features (a flat weight of heads x head_dim),
        # applied before the split into heads; Qwen3(-MoE), Gemma 3: one per head, after it
        # (Command R's weight per head and dim is `[heads, head_dim]`: per head)
        self.qk_norm_whole = (q_norm is not None and not self.mla and q_norm.weight.dim() == 1
                              and q_norm.weight.numel() == self.num_heads * self.head_dim)
        self.qk_norm = q_norm is not None and not self.qk_norm_whole
        self.qk_norm_after_rotary = hasattr(first_attn, "query_layernorm")  # Hunyuan
        # StableLM 2: one LayerNorm per head (`qk_layernorm`), before the rotary
        self.qk_layernorm = hasattr(first_attn, "q_layernorm")
        self.parallel = parallel_block(config)
        self.logit_scale = (float(config.logit_scale) if self.family in LOGIT_SCALE_MODEL_TYPES
                            else None)
        # OLMoE: q, k and v clamped to +-clip_qkv after the norms (null in the releases)
        self.clip_qkv = getattr(config, "clip_qkv", None)
        self.fused_qkv = hasattr(first_attn, "qkv_proj")  # Phi-3: one QKV projection
        # the attention's output projection (Phi-2 names it `dense`)
        self.o_attr = "o_proj" if hasattr(first_attn, "o_proj") else "dense"
        self.mla_rotate = mla_rotate(first_attn) if self.mla else None
        # DeepSeek-V3.2, GLM-5: each MLA layer attends to the keys its indexer selects
        self.index_rotate = indexer_rotate(first_attn) if hasattr(first_attn, "indexer") else None
        self.sinks = self.family in SINK_MODEL_TYPES
        self.hf_rotate = (sys.modules[type(first_attn).__module__].apply_rotary_pos_emb
                          if self.family in HF_ROTARY_MODEL_TYPES else None)
        if self.family == "llama4_text":  # complex-pair rotary (`llama4.py`)
            self.hf_rotate = complex_rotary(first_attn)
        self.mlp_scores = self.family in MLP_RETURNS_SCORES
        self.sandwich = self.family in SANDWICH_NORMS
        # each layer's (attention output, MLP input, MLP output) norms of the sandwich
        self.sandwich_norms = ([tuple(getattr(layer, n) for n in SANDWICH_NORMS[self.family])
                                for layer in self.layers] if self.sandwich else [])
        self.post_norm = self.family in POST_NORM_MODEL_TYPES
        # Granite 3: scalar multipliers on the embeddings and each sublayer's output, and a
        # divisor on the logits (its attention_multiplier is the layers' own `scaling`), read
        # from the config once
        self.granite = self.family in GRANITE_MODEL_TYPES
        if self.granite:
            self.embedding_multiplier = float(config.embedding_multiplier)
            self.residual_multiplier = float(config.residual_multiplier)
            self.logits_scaling = float(config.logits_scaling)
        # Granite MoE and 4.0: a routed block and a shared MLP in place of `mlp`, where each
        # is (4.0's dense releases: the shared MLP alone), looked up once per layer
        self.granite_blocks = ({layer: (getattr(layer, "block_sparse_moe", None),
                                        getattr(layer, "shared_mlp", None))
                                for layer in self.layers}
                               if self.granite and not hasattr(self.layers[0], "mlp") else None)
        # per-layer rotary kind (Gemma 3: its layer type; one shared rotary otherwise)
        self.rope_kinds: list[str | None] = (list(config.layer_types[:self.num_layers])
                                             if self.family in ROTARY_PER_TYPE
                                             else [None] * self.num_layers)
        self._rope_kind_set = tuple(dict.fromkeys(self.rope_kinds))  # each kind once
        self.rotary = rotary_layers(config, self.windows)
        # each linear layer's mixer module: Granite 4.0's Mamba-2, Qwen3-Next's Gated DeltaNet
        self.linear_attr = "mamba" if self.family == "granitemoehybrid" else "linear_attn"
        # Granite 4.0 without RoPE builds no rotary module: no layer rotates
        self.has_rotary_emb = getattr(base, "rotary_emb", None) is not None
        self.final_softcap = getattr(config, "final_logit_softcapping", None)
        # Gemma 2: attention scores capped at cap x tanh(score / cap) (`softcap.py`)
        self.attn_softcap = getattr(config, "attn_logit_softcapping", None)
        self.base = base
        self.lm_head = hf_model.lm_head
        assert self.family in SUPPORTED_MODEL_TYPES

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def kv_cache_shape(self) -> tuple[int, int, int]:
        """(planes, heads, dim) of one token's cache entry per layer: (2, kv_heads, head_dim)
        for K and V, (1, 1, kv_lora_rank + qk_rope_head_dim) for an MLA latent (plus
        index_head_dim for DeepSeek-V3.2's indexer key)."""
        if self.mla:
            return 1, 1, mla_cache_dim(self.config)
        return 2, self.num_kv_heads, self.head_dim

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
        linear: tuple[LinearStates, list[Segment]] | None = None,
    ) -> torch.Tensor:
        """Final hidden states `[T, hidden]` (before the last norm) for flat `input_ids` `[T]`;
        `linear`: the requests' linear-attention states and their slices of the batch (a
        model with such layers)."""
        if linear is None and self.has_linear:
            raise ValueError("a model with linear-attention layers needs their states")
        with sdpa_backends(self.device):
            if self.family == "gpt2":
                return self._forward_gpt2(input_ids, positions, attn)
            if self.family == "opt":
                return self._forward_opt(input_ids, positions, attn)
            if self.family == "gpt_neox":
                return self._forward_gpt_neox(input_ids, positions, attn)
            if self.family == "nemotron_h":
                return self._forward_nemotron_h(input_ids, attn, linear)
            if self.family == "llama4_text":
                return forward_llama4(self, input_ids, positions, attn)
            return self._forward_llama(input_ids, positions, attn, linear)

    def _rotaries(self, h: torch.Tensor, pos: torch.Tensor) -> dict[str | None, tuple]:
        """(cos, sin) per rotary kind: `[T, rope_dim]` for MLA and the families HF's own
        function rotates (gpt-oss: `[T, head_dim / 2]`; GLM-4), `[T, 1, d]` otherwise."""
        out: dict[str, tuple] = {}
        if not self.has_rotary_emb:  # no layer rotates (Granite 4.0 NoPE)
            return {kind: (None, None) for kind in self._rope_kind_set}
        for kind in self._rope_kind_set:
            cos, sin = (self.base.rotary_emb(h, pos[None, :]) if kind is None
                        else self.base.rotary_emb(h, pos[None, :], kind))
            if self.mla or self.hf_rotate is not None:
                out[kind] = cos[0], sin[0]
            else:
                out[kind] = cos[0, :, None, :], sin[0, :, None, :]
        return out

    def _forward_llama(self, ids: torch.Tensor, pos: torch.Tensor, attn: AttentionBackend,
                       linear: tuple[LinearStates, list[Segment]] | None = None):
        h = self.base.embed_tokens(ids)  # (Gemma's module scales by sqrt(hidden) itself)
        if self.granite:  # Granite: embeddings x embedding_multiplier
            h = h * self.embedding_multiplier
        rotaries = self._rotaries(h, pos)
        t = ids.shape[0]
        sparse = (SparseIndexState(self.index_rotate, index_key_dim(self.config))
                  if self.index_rotate else None)
        for i, layer in enumerate(self.layers):
            x = h if self.post_norm else layer.input_layernorm(h)
            if self.linear[i]:  # Gated DeltaNet, Mamba-2: each request over its own state
                o = linear[0].run(getattr(layer, self.linear_attr), x, linear[1])
                h = self._add_sublayers(layer, h, o)
                continue
            cos, sin = rotaries[self.rope_kinds[i]]
            sa = layer.self_attn
            if self.mla:
                o = mla_attention(sa, i, x, cos, sin, attn, self.mla_rotate, sparse)
                h = self._add_sublayers(layer, h, o)
                continue
            if self.fused_qkv:  # Phi-3: [q | k | v] along the output features
                qd, kd = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
                q, k, v = sa.qkv_proj(x).split((qd, kd, kd), dim=-1)
                q = q.reshape(t, self.num_heads, self.head_dim)
                k = k.reshape(t, self.num_kv_heads, self.head_dim)
                v = v.reshape(t, self.num_kv_heads, self.head_dim)
            elif self.output_gate:  # per head: [query | gate] (HF's chunk of q_proj's output)
                q, gate = sa.q_proj(x).view(t, self.num_heads, 2 * self.head_dim).chunk(2, -1)
                k = sa.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
                v = sa.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
            elif self.qk_norm_whole:  # MiniMax-M2: q/k normed across all heads, then split
                q = sa.q_norm(sa.q_proj(x)).view(t, self.num_heads, self.head_dim)
                k = sa.k_norm(sa.k_proj(x)).view(t, self.num_kv_heads, self.head_dim)
                v = sa.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
            else:
                q = sa.q_proj(x).view(t, self.num_heads, self.head_dim)
                k = sa.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
                v = sa.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
            if self.clip_qkv is not None:
                c = self.clip_qkv
                q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
            if self.qk_norm:  # Qwen3-MoE, Gemma 3: RMSNorm over each head before the rotary
                q, k = sa.q_norm(q), sa.k_norm(k)
            elif self.qk_layernorm:  # StableLM 2 (its modules split [T, heads, d] by head)
                q, k = sa.q_layernorm(q), sa.k_layernorm(k)
            if not self.rotary[i]:  # NoPE layers (SmolLM3's, EXAONE 4's and Command A's full)
                pass
            elif self.hf_rotate is not None:  # gpt-oss, GLM-4: HF's own (cos/sin [T, 1, d])
                q, k = self.hf_rotate(q, k, cos, sin, unsqueeze_dim=1)
            else:
                q, k = _rotary(q, cos, sin), _rotary(k, cos, sin)
            if self.qk_norm_after_rotary:  # Hunyuan: per-head RMSNorms on the rotated q, k
                q, k = sa.query_layernorm(q), sa.key_layernorm(k)
            o = attn.attend(self.kv_index[i], q, k, v, self.scales[i], self.windows[i],
                            sinks=sa.sinks if self.sinks else None, softcap=self.attn_softcap)
            o = o.reshape(t, self.num_heads * self.head_dim)
            if self.output_gate:
                o = o * torch.sigmoid(gate.reshape(t, -1))
            o = getattr(sa, self.o_attr)(o)
            if self.parallel:  # Command R / A, StableLM: both sublayers read the same norm
                h = h + o + self._mlp(layer, x)
                continue
            if self.post_norm:  # OLMo 2/3, EXAONE 4: norm each sublayer's output alone
                h = h + layer.post_attention_layernorm(o)
                h = h + layer.post_feedforward_layernorm(self._mlp(layer, h))
                continue
            if self.sandwich:  # Gemma 2/3, GLM-4: norm each sublayer's output before the add
                post_attn, pre_mlp, post_mlp = self.sandwich_norms[i]
                h = h + post_attn(o)
                h = h + post_mlp(self._mlp(layer, pre_mlp(h)))
                continue
            h = self._add_sublayers(layer, h, o)
        return h

    def _add_sublayers(self, layer: nn.Module, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The residual after a pre-norm layer: the mixer's output `o`, then the MLP on the
        post-attention norm of the sum (Granite: each sublayer's output x residual_multiplier)."""
        if self.granite:
            o = o * self.residual_multiplier
        h = h + o
        m = self._mlp(layer, layer.post_attention_layernorm(h))
        return h + (m * self.residual_multiplier if self.granite else m)

    def _mlp(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The layer's MLP or MoE block on the flat batch `x` `[T, hidden]` (HF's MoE blocks
        take `[batch, seq, hidden]`: the batch goes in as one sequence)."""
        if self.granite_blocks is not None:  # Granite MoE and 4.0: the routed block and the
            block, shared = self.granite_blocks[layer]  # shared MLP
            out = block(x[None])[0] if block is not None else None
            if shared is not None:
                out = shared(x) if out is None else out + shared(x)
            return out
        if not self.moe:
            return layer.mlp(x)
        if self.mlp_scores:  # gpt-oss: (hidden [1, T, H], router scores)
            return layer.mlp(x[None])[0][0]
        return layer.mlp(x[None])[0]

    def _forward_nemotron_h(self, ids: torch.Tensor, attn: AttentionBackend,
                            linear: tuple[LinearStates, list[Segment]] | None):
        """Nemotron-H's blocks, each norm -> one mixer -> residual add: Mamba-2 (each request
        over its own state), softmax attention without positions (NoPE), MLP or MoE."""
        h = self.base.embeddings(ids)
        t = ids.shape[0]
        for i, layer in enumerate(self.layers):
            x = layer.norm(h)
            if self.linear[i]:
                h = h + linear[0].run(layer.mixer, x, linear[1])
            elif self.kv_layers[i]:
                sa = layer.mixer
                q = sa.q_proj(x).view(t, self.num_heads, self.head_dim)
                k = sa.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
                v = sa.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
                o = attn.attend(self.kv_index[i], q, k, v, self.scales[i], None)
                h = h + sa.o_proj(o.reshape(t, self.num_heads * self.head_dim))
            else:  # an MLP or MoE block (HF's take [..., hidden])
                h = h + layer.mixer(x)
        return h

    def _forward_gpt2(self, ids: torch.Tensor, pos: torch.Tensor, attn: AttentionBackend):
        h = self.base.wte(ids) + self.base.wpe(pos)
        t = ids.shape[0]
        d = self.num_heads * self.head_dim
        for i, blk in enumerate(self.layers):
            qkv = blk.attn.c_attn(blk.ln_1(h))
            q, k, v = qkv.split(d, dim=-1)
            shape = (t, self.num_heads, self.head_dim)
            o = attn.attend(i, q.view(shape), k.view(shape), v.view(shape), self.scales[i], None)
            h = blk.attn.c_proj(o.reshape(t, d)) + h
            h = h + blk.mlp(blk.ln_2(h))
        return h

    def _forward_gpt_neox(self, ids: torch.Tensor, pos: torch.Tensor, attn: AttentionBackend):
        """GPT-NeoX's layers (Pythia): one projection gives each head its [q | k | v], the
        rotary turns the first `partial_rotary_factor` of each head; with
        `use_parallel_residual` the attention and the MLP read their own LayerNorms of the
        same input and add to it together, else one after the other."""
        h = self.base.embed_in(ids)
        cos, sin = self._rotaries(h, pos)[None]
        t = ids.shape[0]
        parallel = bool(self.config.use_parallel_residual)
        for i, layer in enumerate(self.layers):
            sa = layer.attention
            qkv = sa.query_key_value(layer.input_layernorm(h))
            q, k, v = qkv.view(t, self.num_heads, 3 * self.head_dim).chunk(3, dim=-1)
            q, k = _rotary(q, cos, sin), _rotary(k, cos, sin)
            o = attn.attend(i, q, k, v.contiguous(), self.scales[i], None)
            o = sa.dense(o.reshape(t, self.num_heads * self.head_dim))
            if parallel:
                h = h + o + layer.mlp(layer.post_attention_layernorm(h))
            else:
                h = h + o
                h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h

    def _forward_opt(self, ids: torch.Tensor, pos: torch.Tensor, attn: AttentionBackend):
        """OPT's decoder: positions looked up 2 rows on (HF's offset); 350m norms after each
        sublayer (`do_layer_norm_before` false) and embeds on a narrower width."""
        h = self.base.embed_tokens(ids)
        if self.base.project_in is not None:
            h = self.base.project_in(h)
        positions = self.base.embed_positions
        h = h + F.embedding(pos + positions.offset, positions.weight)
        t = ids.shape[0]
        shape = (t, self.num_heads, self.head_dim)
        for i, layer in enumerate(self.layers):
            sa, before = layer.self_attn, layer.do_layer_norm_before
            x = layer.self_attn_layer_norm(h) if before else h
            q, k, v = sa.q_proj(x).view(shape), sa.k_proj(x).view(shape), sa.v_proj(x).view(shape)
            o = attn.attend(i, q, k, v, self.scales[i], None)
            h = h + sa.out_proj(o.reshape(t, -1))
            if not before:
                h = layer.self_attn_layer_norm(h)
            x = layer.final_layer_norm(h) if before else h
            h = h + layer.fc2(layer.activation_fn(layer.fc1(x)))
            if not before:
                h = layer.final_layer_norm(h)
        return h

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits `[n, vocab]` of the rows `indices` of `hidden` (all rows if None)."""
        if indices is not None:
            hidden = hidden.index_select(0, indices)
        n = hidden.shape[0]
        if hidden.device.type == "cpu" and 1 < n < _CPU_MIN_GEMM_ROWS:
            # CPU BLAS runs 2-3-row GEMMs as repeated matrix-vector passes: measured on this
            # 2-core x86 (fp32, 32000-vocab LM head) 13 / 20 ms for 2 / 3 rows but 10 ms for 4;
            # padding to 4 rows takes the faster GEMM kernel. Real rows are unaffected.
            pad = hidden.new_zeros(_CPU_MIN_GEMM_ROWS - n, hidden.shape[1])
            logits = self.lm_head(self.final_norm(torch.cat([hidden, pad])))[:n]
        else:
            logits = self.lm_head(self.final_norm(hidden))
        if self.granite:  # Granite's head divides by logits_scaling
            logits = logits / self.logits_scaling
        if self.logit_scale is not None:  # Command R / A: x logit_scale
            logits = logits * self.logit_scale
        if self.final_softcap:  # cap x tanh(logits / cap), as HF's CausalLM heads do
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits.float()
