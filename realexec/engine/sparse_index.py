"""DeepSeek Sparse Attention (DSA: DeepSeek-V3.2, GLM-5): the lightning indexer's top-k keys.

Each MLA layer of V3.2 carries an indexer with its own small projections: per query token
`index_n_heads` queries (from the MLA's normalised query latent) and per-head weights, per key
token one key of `index_head_dim` (a LayerNorm'd projection of the layer input), both rotated
over their first `qk_rope_head_dim` dims (half-split, unlike MLA's interleaved rotary). A query
scores every key it may see as sum_h w_h x relu(q_h . k x d^-0.5) and attends only to the
`index_topk` best; shorter contexts attend to every key, as plain MLA. GLM-5 rotates the
indexer interleaved (as its MLA) and may let a layer reuse the previous layer's selection
(`indexer_types` "shared": that layer has no indexer; its rows' indexer part stays zero).

The executor caches the indexer key beside the MLA latent (the tail of the same cache row,
`mla.mla_cache_dim`), so one slot mapping serves both. Scores are computed in fp32 with the
operations, shapes and order of transformers' `DeepseekV32Indexer` (its bf16 reference form:
the released kernels' Hadamard rotation preserves the dot products and their FP8 scoring is a
precision choice), so the selected keys match it exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

# model types whose MLA layers select keys with an indexer
SPARSE_INDEX_MODEL_TYPES = frozenset({"deepseek_v32", "glm_moe_dsa"})
_DECODE = (-1, -1)  # the key of a step's (one) decode batch among the memoised masks
# the most bytes one fp32 score tensor [rows, index_heads, keys] may take: queries are scored
# in row chunks below it (a 2,048-token chunk over 128k keys with 64 heads would be 64 GiB at
# once). Each query row's scores are computed on their own either way, so chunking changes no
# value and no selection.
SCORE_BYTES = 1 << 28


def index_key_dim(config) -> int:
    """Elements of one token's indexer key per layer (`index_head_dim`; 0 without DSA)."""
    return int(config.index_head_dim) if config.model_type in SPARSE_INDEX_MODEL_TYPES else 0


class IndexSelection:
    """One layer's indexer queries for a step's flat batch, and the keys each query keeps.

    `q`: `[T, index_heads, index_head_dim]` fp32 (rotated), `weights`: `[T, index_heads]` fp32
    (x index_heads^-0.5); `keys(slots)` returns the cached indexer keys of `slots` (any
    shape, one more dim of `index_head_dim`); `topk`: keys kept per query; `scale`:
    `index_head_dim^-0.5`.
    """

    def __init__(self, q: torch.Tensor, weights: torch.Tensor,
                 keys: Callable[[torch.Tensor], torch.Tensor], topk: int, scale: float) -> None:
        self.q = q
        self.weights = weights
        self.keys = keys
        self.topk = topk
        self.scale = scale
        self._masks: dict[tuple[int, int], torch.Tensor] = {}  # by rows, for reusing layers

    def decode_mask(self, rows: torch.Tensor, slots: torch.Tensor, valid: torch.Tensor
                    ) -> torch.Tensor:
        """`[B, 1, 1, L]` keys to attend for decode rows `rows` `[B]` over gathered key slots
        `slots` `[B, L]` of which `valid` `[B, L]` are in the context (True = attend)."""
        if _DECODE in self._masks:
            return self._masks[_DECODE]
        b, n = slots.shape
        q = self.q.index_select(0, rows)[:, None]  # [B, 1, H, D]: HF's [batch, seq, H, D]
        w = self.weights.index_select(0, rows)[:, None]  # [B, 1, H]
        k = self.keys(slots.reshape(-1)).view(b, n, -1)
        mask = self._masks[_DECODE] = self._select(q, w, k, valid[:, None, :])[:, :, None, :]
        return mask

    def prefill_mask(self, start: int, end: int, slots: torch.Tensor, allowed: torch.Tensor
                     ) -> torch.Tensor:
        """`[q, n]` keys to attend for the chunk of flat rows `start:end` over key slots
        `slots` `[n]` where `allowed` `[q, n]` (causal, True = attend)."""
        if (start, end) in self._masks:
            return self._masks[start, end]
        q = self.q[start:end][None]  # [1, q, H, D]
        w = self.weights[start:end][None]
        k = self.keys(slots)[None]  # [1, n, D]
        mask = self._masks[start, end] = self._select(q, w, k, allowed[None])[0]
        return mask

    def _select(self, q: torch.Tensor, w: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor
                ) -> torch.Tensor:
        """`allowed` narrowed to each query's top-k keys by index score, as HF's
        `DeepseekV32Indexer.forward`: q `[B, S, H, D]`, w `[B, S, H]`, k `[B, T, D]`,
        `allowed` `[B, S, T]`; rows scored in chunks of at most `SCORE_BYTES` of scores."""
        kt = k.transpose(-1, -2).float().unsqueeze(1)  # [B, 1, D, T]
        b, rows, heads = q.shape[:3]
        cells = max(1, SCORE_BYTES // (heads * kt.shape[-1] * 4))  # (batch, row) pairs a chunk
        keep = torch.zeros_like(allowed)
        for b0, b1, r0, r1 in _chunks(b, rows, cells):
            scores = torch.relu(torch.matmul(q[b0:b1, r0:r1], kt[b0:b1]) * self.scale)
            index = torch.matmul(w[b0:b1, r0:r1].unsqueeze(-2), scores).squeeze(-2)
            index = index.masked_fill(~allowed[b0:b1, r0:r1], float("-inf"))
            top = index.topk(min(self.topk, index.shape[-1]), dim=-1).indices
            keep[b0:b1, r0:r1].scatter_(-1, top, True)
        return keep & allowed


def _chunks(batch: int, rows: int, cells: int) -> list[tuple[int, int, int, int]]:
    """(b0, b1, r0, r1) blocks covering `batch` x `rows` with at most `cells` pairs each: whole
    rows of several batch entries (decodes: one row each), else row chunks of one entry."""
    if rows <= cells:
        per = cells // rows
        return [(b0, min(batch, b0 + per), 0, rows) for b0 in range(0, batch, per)]
    return [(b0, b0 + 1, r0, min(rows, r0 + cells)) for b0 in range(batch)
            for r0 in range(0, rows, cells)]


def index_selection(
    sa: nn.Module, x: torch.Tensor, q_latent: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    rotate: Callable, keys: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, IndexSelection]:
    """(new tokens' indexer keys `[T, index_head_dim]`, their `IndexSelection`) for MLA layer
    `sa` (its `indexer` module) on the flat batch `x` `[T, hidden]`, with the MLA's normalised
    query latent `q_latent` `[T, q_lora_rank]`, `cos`/`sin` `[T, rope_dim]` and `rotate` the
    indexer's rotary (`mla.indexer_rotate`)."""
    ix = sa.indexer
    t = x.shape[0]
    rope = ix.qk_rope_head_dim
    q = ix.wq_b(q_latent).view(t, ix.n_heads, ix.head_dim)
    q_rot, q_pass = q.split([rope, ix.head_dim - rope], dim=-1)
    k = ix.k_norm(ix.wk(x)).view(t, 1, ix.head_dim)
    k_rot, k_pass = k.split([rope, ix.head_dim - rope], dim=-1)
    q_rot, k_rot = rotate(q_rot, k_rot, cos, sin, unsqueeze_dim=1)
    q = torch.cat([q_rot, q_pass], dim=-1).float()
    k = torch.cat([k_rot, k_pass], dim=-1)[:, 0]
    w = ix.weights_proj(x.to(ix.weights_proj.weight.dtype)).float() * (ix.n_heads ** -0.5)
    return k, IndexSelection(q, w, keys, ix.index_topk, ix.softmax_scale)


class SparseIndexState:
    """One forward's sparse-attention state across layers: the last selection, which a GLM-5
    layer without an indexer of its own ("shared") reuses. `rotate`: the indexer's rotary (HF's
    `apply_rotary_pos_emb`, or `apply_rotary_pos_emb_interleave` for GLM-5); `key_dim`: its
    key width (`index_key_dim`)."""

    def __init__(self, rotate: Callable, key_dim: int) -> None:
        self.rotate = rotate
        self.key_dim = key_dim
        self.last: IndexSelection | None = None

    def select(self, sa: nn.Module, x: torch.Tensor, q_latent: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, keys: Callable[[torch.Tensor], torch.Tensor]
               ) -> tuple[torch.Tensor, IndexSelection]:
        """(indexer keys to cache `[T, key_dim]`, the selection) of layer `sa`: its own, or
        for a layer without an indexer zeros and the previous layer's."""
        if sa.indexer is None:
            if self.last is None:
                raise ValueError("a shared sparse-attention layer needs an earlier layer's "
                                 "indexer (indexer_types must start with 'full')")
            return x.new_zeros(x.shape[0], self.key_dim), self.last
        key, self.last = index_selection(sa, x, q_latent, cos, sin, self.rotate, keys)
        return key, self.last
