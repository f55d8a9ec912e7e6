"""Attention logit soft-capping (Gemma 2): scores pass through cap x tanh(score / cap) before
the mask and the softmax, as HF's `eager_attention_forward` of the family does.

SDPA has no soft-cap, so this path builds the score matrix itself (one `[B, Hq, Lq, Lk]`
tensor per call): q.k^T x scale, capped, masked, softmaxed in fp32 (HF's upcast) and cast
back, then times v.
"""

from __future__ import annotations

import torch


def softcapped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
    cap: float,
) -> torch.Tensor:
    """q `[B, Hq, Lq, d]`, k `[B, Hk, Lk, d]`, v `[B, Hk, Lk, dv]` (Hq a multiple of Hk: GQA);
    `mask`: boolean (True = attend), broadcastable to `[B, Hq, Lq, Lk]`, or None (every key).
    Output `[B, Hq, Lq, dv]`."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / cap) * cap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)
