"""Attention backends without paging, for one request at a time: the ladder's baselines.

- `NoCacheAttention`: plain causal attention over the tokens of this forward only; used to
  recompute the whole sequence every token (ladder rung 1) and to profile peak activation
  memory without a cache.
- `ContiguousKVAttention`: one preallocated `[max_len, kv_heads, head_dim]` K and V tensor per
  layer for a single request (ladder rung 2, the classic HF-style cache); decode reads a
  contiguous slice, no gather.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from realexec.engine.attention import visible_keys
from realexec.engine.sinks import causal_mask, sdpa_with_sinks
from realexec.engine.softcap import softcapped_attention


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
          mask: torch.Tensor | None, causal: bool, sinks: torch.Tensor | None = None,
          softcap: float | None = None) -> torch.Tensor:
    """q `[Tq, h, d]`, k/v `[Tk, kvh, d]` -> `[Tq, h, d]`; `sinks` `[h]`: gpt-oss's per-head
    logits in the softmax denominator; `softcap`: Gemma 2's score cap."""
    q4, k4, v4 = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    gqa = k.shape[1] != q.shape[1]
    if causal and (softcap or sinks is not None):  # (no is_causal outside SDPA's)
        mask, causal = causal_mask(q.shape[0], k.shape[0], q.device), False
    if softcap:
        out = softcapped_attention(q4, k4, v4, mask, scale, softcap)
    elif sinks is not None:
        out = sdpa_with_sinks(q4, k4, v4, mask, scale, sinks.view(1, -1, 1, 1), enable_gqa=gqa)
    else:
        out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, is_causal=causal,
                                             scale=scale, enable_gqa=gqa)
    return out[0].transpose(0, 1)


def _window_causal_mask(q_start: int, q_len: int, k_len: int, window: int | None,
                        device: torch.device, chunk: int | None = None) -> torch.Tensor:
    q_pos = torch.arange(q_start, q_start + q_len, device=device)[:, None]
    k_pos = torch.arange(k_len, device=device)[None, :]
    return visible_keys(k_pos, q_pos, window, chunk)


class NoCacheAttention:
    """Causal attention over one sequence's tokens in this forward (no KV kept)."""

    def attend(self, layer: int, q, k, v, scale: float, window: int | None,
               sinks: torch.Tensor | None = None, softcap: float | None = None,
               chunk: int | None = None) -> torch.Tensor:
        if window is None and chunk is None:
            return _sdpa(q, k, v, scale, None, True, sinks, softcap)
        return _sdpa(q, k, v, scale, _window_causal_mask(0, q.shape[0], k.shape[0], window,
                                                         q.device, chunk), False, sinks, softcap)


class ContiguousKVAttention:
    """A contiguous per-request KV cache of `max_len` tokens; call `advance()` after a forward."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (num_layers, 2, max_len, num_kv_heads, head_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0  # tokens cached before the current forward
        self._new = 0

    def attend(self, layer: int, q, k, v, scale: float, window: int | None,
               sinks: torch.Tensor | None = None, softcap: float | None = None,
               chunk: int | None = None) -> torch.Tensor:
        n = q.shape[0]
        start, end = self.length, self.length + n
        if end > self.max_len:
            raise ValueError(f"contiguous cache of {self.max_len} tokens cannot hold {end}")
        self.kv[layer, 0, start:end] = k
        self.kv[layer, 1, start:end] = v
        self._new = n
        kc, vc = self.kv[layer, 0, :end], self.kv[layer, 1, :end]
        if start == 0 and window is None and chunk is None:
            return _sdpa(q, kc, vc, scale, None, True, sinks, softcap)
        if n == 1 and (window is None or end <= window) and (chunk is None or end <= chunk):
            return _sdpa(q, kc, vc, scale, None, False, sinks, softcap)
        return _sdpa(q, kc, vc, scale, _window_causal_mask(start, n, end, window, q.device,
                                                           chunk), False, sinks, softcap)

    def advance(self) -> None:
        """Commit the tokens of the forward just run."""
        self.length += self._new
        self._new = 0
