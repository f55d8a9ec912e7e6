"""Attention sinks (gpt-oss): one learned logit per head added to the softmax denominator.

HF's `GptOssAttention` appends each head's `sinks` logit as an extra column to the attention
scores, takes the softmax over keys + sink and drops the sink's column, so a query may put
weight on "nothing" (out = sum_j p_j v_j with sum_j p_j = Z / (Z + exp(sink)) < 1).

We keep SDPA (fused, no score matrix on the flash/efficient paths) by making the sink a real
key: an all-zero key scores q . 0 = 0, an additive mask of `sink` on its column gives it the
logit `sink`, and its all-zero value adds nothing to the output. The softmax over that key set
is HF's over keys + sink, exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_mask(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """`[q_len, k_len]` top-left aligned causal mask (True = attend): SDPA's `is_causal`."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()


def sdpa_with_sinks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
    sinks: torch.Tensor, enable_gqa: bool = False,
) -> torch.Tensor:
    """SDPA whose softmax also counts `exp(sink)` per query row.

    q `[B, Hq, Lq, d]`, k `[B, Hk, Lk, d]`, v `[B, Hk, Lk, dv]`; `mask`: boolean (True = attend),
    broadcastable to `[B, Hq, Lq, Lk]`, or None (every key); `sinks`: logits broadcastable to
    `[B, Hq, Lq, 1]`. Output `[B, Hq, Lq, dv]`.
    """
    b, hq, lq = q.shape[0], q.shape[1], q.shape[2]
    lk = k.shape[2]
    k = torch.cat([k, k.new_zeros(k.shape[0], k.shape[1], 1, k.shape[3])], dim=2)
    v = torch.cat([v, v.new_zeros(v.shape[0], v.shape[1], 1, v.shape[3])], dim=2)
    keys = q.new_zeros(()) if mask is None else q.new_zeros(mask.shape).masked_fill(
        ~mask, float("-inf"))
    keys = keys.expand(b, hq, lq, lk)  # leading dims are added as needed
    sink = sinks.to(q.dtype).expand(b, hq, lq, 1)
    bias = torch.cat([keys, sink], dim=-1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale,
                                          enable_gqa=enable_gqa)
