"""Paged attention over the block pool, for a flattened batch of many requests (ORCA).

All new tokens of a step, prompt chunks and decodes of many requests, are one flat batch
`[num_tokens, heads, head_dim]` for the linear layers; attention is then done per request
over its block table:

- decodes (one query token): one batched call. Each request's keys are gathered from its
  blocks into a padded `[B, kv_heads, L_max, head_dim]` tensor (padding and unwritten slots
  point at the zero null block and are masked); GQA is folded into the query rows
  (`[B, kv_heads, group, head_dim]`), so K/V are never repeated.
- prefill chunks: one call per request. A chunk at position `p0` with `q` tokens sees keys
  `0 .. p0 + i` for its query `i`; SDPA's `is_causal` assumes equal query and key lengths
  (top-left aligned), so it is only used when the request has no cached context; otherwise
  the bottom-right-aligned mask is built explicitly. Sliding-window layers (Mistral, Qwen2,
  gpt-oss) further hide keys at or before `pos - window` (HF: `kv_idx > q_idx - sliding_window`).
- chunked layers (Llama 4) hide keys outside the query's own chunk of `chunk` positions
  (HF: `kv_idx // chunk == q_idx // chunk`); the core keeps the last `chunk` positions' blocks.
- attention sinks (gpt-oss): each head's learned logit joins the softmax denominator
  (`realexec.engine.sinks.sdpa_with_sinks`, still one SDPA call).

When every layer slides by the same window (`build_metadata(window=...)`), only the keys
inside it are gathered: the core frees the blocks before it (their table entries are -1,
`simulator.core.block_pool.NULL_BLOCK_ID`), so they are never read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from realexec.engine.kv_cache import PagedKVCache
from realexec.engine.sinks import causal_mask, sdpa_with_sinks
from realexec.engine.softcap import softcapped_attention
from realexec.engine.sparse_index import IndexSelection

try:  # the SDPA backends the model walk allows on CUDA (`sdpa_backends`)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _NOT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
except ImportError:  # torch < 2.3: no sdpa_kernel (and no cuDNN attention to avoid)
    _NOT_CUDNN = None


def sdpa_backends(device: torch.device) -> contextlib.AbstractContextManager:
    """Where the model walk's SDPA calls may run: on CUDA every backend but cuDNN's.

    cuDNN's attention builds an execution graph per distinct shape, and a serving engine's
    key lengths change every step (the decode batch is padded to its longest context). On an
    H200 (torch 2.11, Llama-3-8B bf16) SDPA then picked cuDNN and rebuilt its graph on most
    steps: ~1.2 ms of CPU per call, 32 calls a step, so decode steps took ~60 ms instead of
    ~20 ms, while the profile, which repeats identical shapes, never saw it
    (bench/diagnostics/gpu_step_breakdown.py). Flash and memory-efficient attention have no per-shape
    setup. Elsewhere (CPU, MPS) and before torch 2.3 (no `sdpa_kernel`) SDPA chooses as usual.
    """
    if device.type != "cuda" or _NOT_CUDNN is None:
        return contextlib.nullcontext()
    return sdpa_kernel(_NOT_CUDNN)


class AttentionBackend(Protocol):
    """What the model walk calls per layer; `q`: `[T, heads, d]`, `k`/`v`: `[T, kv_heads, d]`."""

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
        window: int | None, sinks: torch.Tensor | None = None, softcap: float | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """Attention output `[T, heads, d]` for the flat batch (after storing k, v); `sinks`
        (`[heads]`, gpt-oss): one logit per head added to the softmax denominator; `softcap`
        (Gemma 2): scores capped at cap x tanh(score / cap); `chunk` (Llama 4): each query
        sees the keys of its own chunk of that many positions only."""
        ...


@dataclass
class _Prefill:
    q_start: int  # offset of the chunk's first token in the flat batch
    q_len: int
    ctx_before: int  # tokens already in the cache before this chunk
    slots: torch.Tensor | None  # [ctx_before - key_start + q_len] slots; None if ctx_before == 0
    masks: dict[tuple[int | None, int | None], torch.Tensor | None] = field(default_factory=dict)
    key_start: int = 0  # position of the first gathered key (> 0: a window's keys only)


@dataclass
class PagedAttentionMetadata:
    """Per-step indices for `PagedAttention`, built once and shared by every layer."""

    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    positions: torch.Tensor  # [T] absolute position of each new token
    decode_idx: torch.Tensor | None  # [B_d] flat indices of decode tokens
    decode_slots: torch.Tensor | None  # [B_d, L_max] gather slots (null slot where masked)
    decode_pos: torch.Tensor | None  # [B_d] position of each decode query
    decode_key_pos: torch.Tensor | None  # [1 or B_d, L_max] position of each gathered key
    decode_valid: torch.Tensor | None  # [B_d, L_max] key is in the context
    prefills: list[_Prefill]
    _decode_masks: dict[tuple[int | None, int | None], torch.Tensor] = field(
        default_factory=dict)

    decode_uniform: bool = False  # every decode row has L_max keys (no padding)

    def decode_mask(self, window: int | None, chunk: int | None = None) -> torch.Tensor | None:
        """`[B_d, 1, 1, L_max]` boolean mask (True = attend) for a layer's window or chunk;
        None when nothing is masked (SDPA then takes its unmasked fast path)."""
        if self.decode_uniform and chunk is None and (
                window is None or window >= self.decode_key_pos.shape[-1]):
            return None
        m = self._decode_masks.get((window, chunk))
        if m is None:
            m = self.decode_valid & visible_keys(self.decode_key_pos, self.decode_pos[:, None],
                                                 window, chunk)
            m = m[:, None, None, :]
            self._decode_masks[(window, chunk)] = m
        return m


def build_metadata(
    query_lens: list[int],
    context_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    null_block: int,
    device: torch.device,
    window: int | None = None,
) -> PagedAttentionMetadata:
    """Metadata for requests computing `query_lens[i]` tokens after `context_lens[i]` cached ones.

    `block_tables[i]` must cover positions `0 .. context_lens[i] + query_lens[i] - 1`;
    `null_block` is the zero block id padded gathers use. `window`: every layer attends to
    at most this many keys, so only the blocks of positions >= (first new position -
    window + 1) are read (entries before may be freed, -1); ValueError if one read is.
    """
    slot_list: list[int] = []
    pos_list: list[int] = []
    decode_rows: list[int] = []
    prefill_rows: list[int] = []
    q_starts: list[int] = []
    start = 0
    for i, (q, c, bt) in enumerate(zip(query_lens, context_lens, block_tables)):
        end = c + q
        if (end + block_size - 1) // block_size > len(bt):
            raise ValueError(
                f"request {i}: block table of {len(bt)} blocks cannot hold {end} tokens "
                f"(block_size {block_size})"
            )
        for p in range(c, end):
            slot_list.append(bt[p // block_size] * block_size + p % block_size)
        pos_list.extend(range(c, end))
        (decode_rows if q == 1 else prefill_rows).append(i)
        q_starts.append(start)
        start += q
    slot_mapping = torch.tensor(slot_list, dtype=torch.long, device=device)
    positions = torch.tensor(pos_list, dtype=torch.long, device=device)
    meta = PagedAttentionMetadata(slot_mapping, positions, None, None, None, None, None, [])
    if decode_rows:
        seq_lens = [context_lens[i] + 1 for i in decode_rows]
        # keys gathered per row: positions start .. seq_len - 1 (all, or the window's)
        starts = [max(0, n - window) for n in seq_lens] if window else [0] * len(seq_lens)
        key_lens = [n - k0 for n, k0 in zip(seq_lens, starts)]
        max_len = max(key_lens)
        first_blocks = [k0 // block_size for k0 in starts]
        nblocks = [(n + block_size - 1) // block_size - fb for n, fb in zip(seq_lens, first_blocks)]
        bt = torch.full((len(decode_rows), max(nblocks)), null_block, dtype=torch.long)
        for r, i in enumerate(decode_rows):
            ids = block_tables[i][first_blocks[r] : first_blocks[r] + nblocks[r]]
            if window:  # only a window's slid-out entries can be NULL
                _check_live(ids, i)
            bt[r, : nblocks[r]] = torch.tensor(ids, dtype=torch.long)
        bt = bt.to(device)
        offs = torch.arange(block_size, device=device)
        flat = (bt[:, :, None] * block_size + offs).reshape(len(decode_rows), -1)
        j = torch.arange(max_len, device=device)
        if window:  # row r's key j is position starts[r] + j, column shift[r] + j of `flat`
            shift = torch.tensor([k0 - fb * block_size for k0, fb in zip(starts, first_blocks)],
                                 dtype=torch.long, device=device)
            cols = (shift[:, None] + j[None, :]).clamp_(max=flat.shape[1] - 1)
            slots = flat.gather(1, cols)
            key_pos = torch.tensor(starts, dtype=torch.long, device=device)[:, None] + j[None, :]
        else:
            slots, key_pos = flat[:, :max_len], j[None, :]
        lens = torch.tensor(key_lens, dtype=torch.long, device=device)
        valid = j[None, :] < lens[:, None]
        meta.decode_slots = torch.where(valid, slots, null_block * block_size)
        meta.decode_valid = valid
        meta.decode_key_pos = key_pos
        meta.decode_pos = key_pos[:, 0] + lens - 1  # seq_len - 1, already on the device
        meta.decode_idx = torch.tensor([q_starts[i] for i in decode_rows], device=device)
        meta.decode_uniform = min(key_lens) == max_len
    for i in prefill_rows:
        c, q = context_lens[i], query_lens[i]
        s0 = q_starts[i]
        slots = None
        k0 = max(0, c - window + 1) if window else 0  # the first key any query reads
        if c > k0:
            # the chunk's own slots are slot_mapping[s0:s0+q]; the context's are recomputed
            fb = k0 // block_size
            ids = block_tables[i][fb : (c + block_size - 1) // block_size]
            if window:
                _check_live(ids, i)
            bt = torch.tensor(ids)
            ctx = (bt[:, None] * block_size + torch.arange(block_size)).reshape(-1)
            ctx = ctx[k0 - fb * block_size : c - fb * block_size]
            slots = torch.cat([ctx.to(device), slot_mapping[s0 : s0 + q]])
        elif c > 0:  # the window holds none of the context: the chunk's own keys alone
            slots = slot_mapping[s0 : s0 + q]
        meta.prefills.append(_Prefill(s0, q, c, slots, key_start=k0))
    return meta


def _check_live(block_ids: list[int], request: int) -> None:
    """A gather must never touch a freed (slid-out, -1) table entry."""
    if block_ids and min(block_ids) < 0:
        raise ValueError(f"request {request}: block table entry {block_ids} read after the "
                         "core freed it (outside the sliding window)")


def visible_keys(k_pos: torch.Tensor, q_pos: torch.Tensor, window: int | None,
                 chunk: int | None) -> torch.Tensor:
    """Where a query at `q_pos` sees the key at `k_pos` (broadcast): at or before it, within
    the layer's window (keys after `pos - window`) and its chunk, if it has them."""
    m = k_pos <= q_pos
    if window is not None:
        m = m & (k_pos > q_pos - window)
    if chunk is not None:
        m = m & (torch.div(k_pos, chunk, rounding_mode="floor")
                 == torch.div(q_pos, chunk, rounding_mode="floor"))
    return m


def _prefill_mask(p: _Prefill, window: int | None, device: torch.device,
                  chunk: int | None = None) -> torch.Tensor | None:
    """`[q, ctx_before + q]` mask (True = attend), or None when plain `is_causal` is right."""
    if p.ctx_before == 0 and window is None and chunk is None:
        return None
    if (window, chunk) in p.masks:
        return p.masks[(window, chunk)]
    q_pos = torch.arange(p.ctx_before, p.ctx_before + p.q_len, device=device)[:, None]
    k_pos = torch.arange(p.key_start, p.ctx_before + p.q_len, device=device)[None, :]
    m = visible_keys(k_pos, q_pos, window, chunk)
    p.masks[(window, chunk)] = m
    return m


class GatherWorkspace:
    """Persistent K/V gather buffers, reused by every layer of every step.

    A fresh multi-MB tensor per gather page-faults on every call on CPU: gathering a decode
    batch of 10 x 600 tokens into preallocated buffers measured 3-8x faster here than
    `k_cache[slots]`. One pair of buffers suffices because layers, and the decode and prefill
    parts of a layer, run one after another.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def gather(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """`k_cache[slots]`, `v_cache[slots]` (`[n, kv_heads, d]`) into the reused buffers."""
        n = slots.shape[0]
        if self.k is None or self.k.shape[0] < n or self.k.shape[1:] != k_cache.shape[1:] \
                or self.k.dtype != k_cache.dtype or self.k.device != k_cache.device:
            rows = max(n, 2 * self.k.shape[0] if self.k is not None else 0)
            self.k = torch.empty((rows, *k_cache.shape[1:]), dtype=k_cache.dtype, device=k_cache.device)
            self.v = torch.empty_like(self.k)
        k, v = self.k[:n], self.v[:n]
        torch.index_select(k_cache, 0, slots, out=k)
        torch.index_select(v_cache, 0, slots, out=v)
        return k, v


class PagedAttention:
    """`AttentionBackend` over a `PagedKVCache`, for one step's `PagedAttentionMetadata`.

    With KV cache groups (`realexec.engine.kv_groups`): `group_metas[t]` is the step's
    metadata over block table t, and `layer_map[l]` = (cache tensor, table) of KV layer l."""

    def __init__(self, cache: PagedKVCache, meta: PagedAttentionMetadata,
                 workspace: GatherWorkspace | None = None,
                 group_metas: list[PagedAttentionMetadata] | None = None,
                 layer_map: tuple[tuple[int, int], ...] | None = None) -> None:
        self.cache = cache
        self.meta = meta
        self.workspace = workspace or GatherWorkspace()
        self.group_metas = group_metas
        self.layer_map = layer_map

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
        window: int | None, sinks: torch.Tensor | None = None, softcap: float | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor:
        meta = self.meta
        if self.group_metas is not None and self.layer_map is not None:
            layer, table = self.layer_map[layer]  # (its cache tensor, its block table)
            meta = self.group_metas[table]
        self.cache.write(layer, meta.slot_mapping, k, v)
        k_cache = self.cache.key_cache(layer)
        v_cache = self.cache.value_cache(layer)
        return self._attend(q, k, v, lambda slots: self.workspace.gather(k_cache, v_cache, slots),
                            scale, window, sinks, softcap, meta=meta, chunk=chunk)

    def attend_latent(
        self, layer: int, q: torch.Tensor, latent: torch.Tensor,
        expand: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], scale: float,
        select: IndexSelection | None = None,
    ) -> torch.Tensor:
        """Multi-head latent attention: store `latent` (`[T, 1, kv_lora_rank + rope_dim]`, plus
        DeepSeek-V3.2's indexer key) and attend over keys/values `expand` rebuilds from the
        cached rows (`[n, heads, d_qk]`, `[n, heads, d_v]`), as HF's DeepSeek does; with
        `select`, each query over the keys its indexer keeps. Output `[T, heads, d_v]`."""
        self.cache.write(layer, self.meta.slot_mapping, latent, None)
        c_cache = self.cache.key_cache(layer)
        k, v = expand(latent)
        return self._attend(q, k, v, lambda slots: expand(c_cache.index_select(0, slots)),
                            scale, None, select=select)

    def cached_rows_tail(self, layer: int, start: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """`slots -> [n, dim - start]`: the elements from `start` on of layer `layer`'s cached
        single-plane rows (DeepSeek-V3.2: the indexer keys behind the MLA latent)."""
        cache = self.cache

        def tail(slots: torch.Tensor) -> torch.Tensor:
            return cache.key_cache(layer)[:, 0, start:].index_select(0, slots)

        return tail

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        gather: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], scale: float,
        window: int | None, sinks: torch.Tensor | None = None, softcap: float | None = None,
        select: IndexSelection | None = None, meta: PagedAttentionMetadata | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """Attention of the flat batch `q` over the new `k`, `v` and the keys/values `gather`
        returns for cache slots; `sinks` `[heads]` (gpt-oss) join each softmax's denominator;
        `softcap` (Gemma 2) caps the scores (`softcap.softcapped_attention`); `select`
        (DeepSeek-V3.2) narrows each query's keys to its indexer's top-k; `meta` the block
        table's metadata the layer reads (default: the step's); `chunk` (Llama 4) hides the
        keys outside each query's chunk."""
        if meta is None:
            meta = self.meta
        num_heads, head_dim = q.shape[1], q.shape[2]
        kv_heads, v_dim = k.shape[1], v.shape[2]
        out = q.new_empty(q.shape[0], num_heads, v_dim)
        if meta.decode_idx is not None:
            b = meta.decode_idx.shape[0]
            qd = q.index_select(0, meta.decode_idx).view(b, kv_heads, num_heads // kv_heads, head_dim)
            max_len = meta.decode_slots.shape[1]
            kd, vd = gather(meta.decode_slots.reshape(-1))
            kd = kd.view(b, max_len, kv_heads, head_dim).transpose(1, 2)  # [B, kvh, L, d]
            vd = vd.view(b, max_len, kv_heads, v_dim).transpose(1, 2)
            if select is not None:
                od = F.scaled_dot_product_attention(qd, kd, vd, scale=scale, attn_mask=(
                    select.decode_mask(meta.decode_idx, meta.decode_slots, meta.decode_valid)))
            elif softcap:  # query rows are (kv head, group member), as for sinks
                od = softcapped_attention(qd, kd, vd, meta.decode_mask(window, chunk), scale,
                                          softcap)
            elif sinks is None:
                od = F.scaled_dot_product_attention(
                    qd, kd, vd, attn_mask=meta.decode_mask(window, chunk), scale=scale
                )
            else:  # query rows are (kv head, group member): head kv * group + g
                od = sdpa_with_sinks(qd, kd, vd, meta.decode_mask(window, chunk), scale,
                                     sinks.view(1, kv_heads, num_heads // kv_heads, 1))
            out.index_copy_(0, meta.decode_idx, od.reshape(b, num_heads, v_dim))
        gqa = kv_heads != num_heads
        for p in meta.prefills:
            s, e = p.q_start, p.q_start + p.q_len
            qp = q[s:e].transpose(0, 1).unsqueeze(0)  # [1, h, q, d]
            if p.slots is None:
                kp, vp = k[s:e], v[s:e]
            else:
                kp, vp = gather(p.slots)
            kp = kp.transpose(0, 1).unsqueeze(0)
            vp = vp.transpose(0, 1).unsqueeze(0)
            mask = _prefill_mask(p, window, q.device, chunk)
            if mask is None and (select is not None or softcap or sinks is not None):
                mask = causal_mask(p.q_len, p.q_len, q.device)  # (no is_causal outside SDPA's)
            if select is not None:
                keys = meta.slot_mapping[s:e] if p.slots is None else p.slots
                op = F.scaled_dot_product_attention(
                    qp, kp, vp, attn_mask=select.prefill_mask(s, e, keys, mask), scale=scale)
            elif softcap:
                op = softcapped_attention(qp, kp, vp, mask, scale, softcap)
            elif sinks is None:
                op = F.scaled_dot_product_attention(
                    qp, kp, vp, attn_mask=mask, is_causal=mask is None, scale=scale,
                    enable_gqa=gqa,
                )
            else:
                op = sdpa_with_sinks(qp, kp, vp, mask, scale, sinks.view(1, num_heads, 1, 1),
                                     enable_gqa=gqa)
            out[s:e] = op[0].transpose(0, 1)
        return out
