"""Llama 4's text model over the paged cache (transformers' `Llama4ForCausalLM`).

Each layer is Llama's, with four differences, each done as HF's `Llama4TextAttention` does:

- rotary layers rotate q and k as complex pairs (HF's `apply_rotary_emb`, interleaved
  features) and then L2-normalise them per head (`use_qk_norm`, a weightless RMSNorm);
- the other layers (NoPE, `no_rope_layers` 0) attend over the whole context and, with
  `attn_temperature_tuning`, scale each query by 1 + attn_scale x log1p(floor((pos + 1) /
  floor_scale)) at its absolute position `pos`;
- rotary layers attend in chunks (`attention_chunk_size`, "chunked_attention" in
  `layer_types`): a query sees the keys of its own chunk of positions only. The core keeps
  the blocks of the last `attention_chunk_size` positions, which hold the chunk;
- the feed-forward is a dense MLP or a mixture of experts with a shared expert
  (`feed_forward`; HF's MoE returns (hidden, router logits)).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn
from transformers import PretrainedConfig

from realexec.engine.attention import AttentionBackend


class PagedWalk(Protocol):
    """What the walk reads of `paged_model.PagedCausalLM` (typed here: it imports this module)."""

    base: nn.Module
    layers: list[nn.Module]
    config: PretrainedConfig
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hf_rotate: Callable[..., Any]
    kv_index: list[int]
    scales: list[float | None]
    windows: list[int | None]


def temperature_scales(config: PretrainedConfig, pos: torch.Tensor) -> torch.Tensor | None:
    """`[T, 1, 1]` fp32 query scales of the NoPE layers at positions `pos`, None when off."""
    if not getattr(config, "attn_temperature_tuning", False):
        return None
    steps = torch.floor((pos.float() + 1.0) / config.floor_scale)
    return (torch.log1p(steps) * config.attn_scale + 1.0)[:, None, None]


def forward_llama4(model: PagedWalk, ids: torch.Tensor, pos: torch.Tensor,
                   attn: AttentionBackend) -> torch.Tensor:
    """Final hidden states `[T, hidden]` (before the last norm) for flat `ids` at `pos`."""
    base, t = model.base, ids.shape[0]
    h = base.embed_tokens(ids)
    freqs = base.rotary_emb(h, pos[None, :])  # complex [1, T, head_dim / 2]
    scales = temperature_scales(model.config, pos)
    for i, layer in enumerate(model.layers):
        sa = layer.self_attn
        x = layer.input_layernorm(h)
        q = sa.q_proj(x).view(t, model.num_heads, model.head_dim)
        k = sa.k_proj(x).view(t, model.num_kv_heads, model.head_dim)
        v = sa.v_proj(x).view(t, model.num_kv_heads, model.head_dim)
        if sa.use_rope:
            q, k = model.hf_rotate(q[None], k[None], freqs)
            q, k = q[0], k[0]
            if hasattr(sa, "qk_norm"):
                q, k = sa.qk_norm(q), sa.qk_norm(k)
        elif scales is not None:
            q = (q * scales).to(q.dtype)
        o = attn.attend(model.kv_index[i], q, k, v, model.scales[i], None,
                        chunk=model.windows[i])
        h = h + sa.o_proj(o.reshape(t, model.num_heads * model.head_dim))
        out = layer.feed_forward(layer.post_attention_layernorm(h))
        h = h + (out[0] if layer.is_moe_layer else out)
    return h


def complex_rotary(attention_module):
    """HF's `apply_rotary_emb` of the module's family (Llama 4's complex-pair rotary)."""
    return sys.modules[type(attention_module).__module__].apply_rotary_emb
