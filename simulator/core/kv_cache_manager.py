"""`KVCacheManager`: block tables per request on top of a `BlockPool`, with prefix
caching, fork (copy-on-write) for parallel sampling and swap to a host pool.

The manager only does bookkeeping; it returns the block copies a backend must
perform (swap-out, swap-in, copy-on-write) and the bytes they move, so the real
executor copies tensors and the simulator charges link time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from simulator.core.block_hash import extend_block_hashes
from simulator.core.block_pool import BlockPool, KVCacheBlock
from simulator.core.request import Request

# `num_cached_blocks` of a request whose further blocks can never be registered
_NEVER = 1 << 62


@dataclass
class KVCacheStats:
    """Counters since the manager was created (blocks, tokens)."""

    num_gpu_blocks: int
    num_free_blocks: int
    usage: float  # fraction of device blocks in use
    peak_usage: float
    prefix_queries_tokens: int  # prompt tokens looked up in the prefix cache
    prefix_hit_tokens: int  # of which found cached
    num_evictions: int
    num_collisions: int  # hash matches whose token ids differed (rejected)
    num_swapped_out_blocks: int
    num_swapped_in_blocks: int
    num_cpu_blocks: int
    num_free_cpu_blocks: int

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_queries_tokens if self.prefix_queries_tokens else 0.0


class KVCacheManager:
    """Per-replica KV bookkeeping: `num_gpu_blocks` device blocks of `block_size` tokens,
    `num_cpu_blocks` host blocks for swapping; `block_bytes` is one block's KV size (all
    layers), used only to report bytes moved."""

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        num_cpu_blocks: int = 0,
        block_bytes: int = 0,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1 token, got {block_size}")
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.block_bytes = block_bytes
        self.block_pool = BlockPool(num_gpu_blocks, enable_prefix_caching)
        self.num_gpu_blocks = num_gpu_blocks
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_to_block_ids: dict[str, list[int]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # leading blocks already registered
        self.num_cpu_blocks = num_cpu_blocks
        self.free_cpu_blocks: deque[int] = deque(range(num_cpu_blocks))
        self.req_to_cpu_blocks: dict[str, list[int]] = {}
        self.peak_usage = 0.0
        self.prefix_queries_tokens = 0
        self.prefix_hit_tokens = 0
        self.num_collisions = 0
        self.num_swapped_out_blocks = 0
        self.num_swapped_in_blocks = 0

    # ---- queries ----
    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_block_ids(self, request_id: str) -> list[int]:
        return self.req_to_block_ids.get(request_id, [])

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of `request` as (blocks, tokens). The last token is always
        recomputed so its logits exist (a full hit is cut back by one block)."""
        if not self.enable_prefix_caching:
            return [], 0
        bs = self.block_size
        max_blocks = (request.num_tokens - 1) // bs
        if max_blocks <= 0:
            return [], 0
        hashes = extend_block_hashes(request, bs, max_blocks)
        cached = self.block_pool.cached_hash_to_block
        hits: list[KVCacheBlock] = []
        check_tokens = request.prompt_token_ids is not None
        for i, block_hash in enumerate(hashes[:max_blocks]):
            block = cached.get(block_hash)
            if block is None:
                break
            if check_tokens and block.token_ids is not None and block.token_ids != tuple(
                request.token_ids_slice(i * bs, (i + 1) * bs)
            ):
                self.num_collisions += 1
                break
            hits.append(block)
        return hits, len(hits) * bs

    # ---- allocation ----
    def can_allocate(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[KVCacheBlock] = ()
    ) -> bool:
        blocks = self.req_to_blocks.get(request.request_id)
        have = (len(blocks) if blocks else 0) + len(new_computed_blocks)
        num_tokens = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        need = -(-(num_tokens + num_new_tokens) // self.block_size) - have
        reviving = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        return need <= self.block_pool.num_free_blocks - reviving

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] = (),
        cache: bool = True,
    ) -> bool:
        """Make room for `num_new_tokens` after the request's computed tokens (plus the
        prefix hits `new_computed_blocks`). Returns False, changing nothing, if the pool
        lacks free blocks. Full blocks are registered in the prefix cache when `cache`."""
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid)
        bs = self.block_size
        num_hit = len(new_computed_blocks)
        if blocks is None:
            blocks = self.req_to_blocks[rid] = []
            self.req_to_block_ids[rid] = []
            self.num_cached_blocks[rid] = self._no_blocks_cached(request)
            if self.enable_prefix_caching:
                self.prefix_queries_tokens += request.num_tokens
                self.prefix_hit_tokens += num_hit * bs
        num_total = request.num_computed_tokens + num_hit * bs + num_new_tokens
        need = -(-num_total // bs) - len(blocks) - num_hit
        if need > 0 or num_hit:
            pool = self.block_pool
            reviving = sum(1 for b in new_computed_blocks if b.ref_cnt == 0) if num_hit else 0
            if need > pool.num_free_blocks - reviving:
                return False
            ids = self.req_to_block_ids[rid]
            if num_hit:
                pool.touch(new_computed_blocks)
                blocks.extend(new_computed_blocks)
                ids.extend([b.block_id for b in new_computed_blocks])
                self.num_cached_blocks[rid] = len(blocks)
            if need > 0:
                new = pool.get_new_blocks(need)
                blocks.extend(new)
                ids.extend([b.block_id for b in new])
                usage = pool.usage
                if usage > self.peak_usage:
                    self.peak_usage = usage
        if cache and self.enable_prefix_caching and num_total // bs > self.num_cached_blocks[rid]:
            self.cache_full_blocks(request, num_total)
        return True

    @staticmethod
    def _no_blocks_cached(request: Request) -> int:
        """`num_cached_blocks` of a request holding no registered block: 0, or `_NEVER` when
        its content is unknown (a length-only prompt without trace hashes), so no block of
        it is ever looked at for the prefix cache."""
        if request.prompt_token_ids is None and request.prompt_hash_ids is None:
            return _NEVER
        return 0

    def cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's blocks that are full within its first `num_tokens` tokens."""
        rid = request.request_id
        bs = self.block_size
        start = self.num_cached_blocks[rid]
        blocks = self.req_to_blocks[rid]
        end = min(num_tokens // bs, len(blocks))
        if start >= end:
            return
        hashes = extend_block_hashes(request, bs, end)
        never = len(hashes) < end and request.prompt_token_ids is None
        end = min(end, len(hashes))
        keep_tokens = request.prompt_token_ids is not None
        pool = self.block_pool
        for i in range(start, end):
            tokens = tuple(request.token_ids_slice(i * bs, (i + 1) * bs)) if keep_tokens else None
            pool.cache_block(blocks[i], hashes[i], tokens)
        if never:  # content past the trace's hashed prompt is unknowable: never look again
            self.num_cached_blocks[rid] = _NEVER
        elif end > self.num_cached_blocks[rid]:
            self.num_cached_blocks[rid] = end

    def free(self, request: Request) -> None:
        """Release the request's device blocks (tail first, so the prefix stays cached longest)
        and any host blocks it holds."""
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, None)
        self.req_to_block_ids.pop(rid, None)
        self.num_cached_blocks.pop(rid, None)
        if blocks:
            self.block_pool.free_blocks(blocks[::-1])
        cpu = self.req_to_cpu_blocks.pop(rid, None)
        if cpu:
            self.free_cpu_blocks.extend(cpu)

    # ---- parallel sampling ----
    def fork(self, parent: Request, child: Request) -> list[tuple[int, int]] | None:
        """Give `child` the parent's computed blocks: full blocks are shared; a partial last
        block is copied. Returns the (src, dst) device copies to make (empty if none), or
        None (nothing changed) if no block is free for the copy."""
        pid, cid = parent.request_id, child.request_id
        bs = self.block_size
        num_computed = parent.num_computed_tokens
        parent_blocks = self.req_to_blocks.get(pid, [])
        num_full = num_computed // bs
        partial = num_computed % bs != 0
        if partial and self.block_pool.num_free_blocks < 1:
            return None
        shared = parent_blocks[:num_full]
        self.block_pool.touch(shared)
        blocks = list(shared)
        copy: list[tuple[int, int]] = []
        if partial:
            (new,) = self.block_pool.get_new_blocks(1)
            copy.append((parent_blocks[num_full].block_id, new.block_id))
            blocks.append(new)
        self.req_to_blocks[cid] = blocks
        self.req_to_block_ids[cid] = [b.block_id for b in blocks]
        self.num_cached_blocks[cid] = min(self.num_cached_blocks.get(pid, 0), num_full)
        child.block_hashes = list(parent.block_hashes[:num_full])
        child.block_hashes_block_size = parent.block_hashes_block_size
        return copy

    # ---- swapping ----
    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move all the request's device blocks to host blocks. Returns (device, host) pairs,
        or None (nothing changed) if the host pool is too small."""
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid, [])
        if len(blocks) > len(self.free_cpu_blocks):
            return None
        cpu = [self.free_cpu_blocks.popleft() for _ in blocks]
        mapping = [(b.block_id, c) for b, c in zip(blocks, cpu)]
        self.free(request)
        self.req_to_cpu_blocks[rid] = cpu
        self.num_swapped_out_blocks += len(cpu)
        return mapping

    def swap_in(self, request: Request) -> list[tuple[int, int]] | None:
        """Bring a swapped-out request back. Returns (host, device) pairs, or None (nothing
        changed) if too few device blocks are free."""
        rid = request.request_id
        cpu = self.req_to_cpu_blocks.get(rid, [])
        if len(cpu) > self.block_pool.num_free_blocks:
            return None
        del self.req_to_cpu_blocks[rid]
        blocks = self.block_pool.get_new_blocks(len(cpu))
        self.req_to_blocks[rid] = blocks
        self.req_to_block_ids[rid] = [b.block_id for b in blocks]
        self.num_cached_blocks[rid] = self._no_blocks_cached(request)
        self.free_cpu_blocks.extend(cpu)
        self.num_swapped_in_blocks += len(cpu)
        self._note_usage()
        return [(c, b.block_id) for c, b in zip(cpu, blocks)]

    def _note_usage(self) -> None:
        usage = self.block_pool.usage
        if usage > self.peak_usage:
            self.peak_usage = usage

    def reset_stats(self) -> None:
        """Start the peak usage and prefix-cache counters afresh (e.g. after a warm-up)."""
        self.peak_usage = self.usage
        self.prefix_queries_tokens = 0
        self.prefix_hit_tokens = 0

    def get_stats(self) -> KVCacheStats:
        return KVCacheStats(
            num_gpu_blocks=self.num_gpu_blocks,
            num_free_blocks=self.num_free_blocks,
            usage=self.usage,
            peak_usage=self.peak_usage,
            prefix_queries_tokens=self.prefix_queries_tokens,
            prefix_hit_tokens=self.prefix_hit_tokens,
            num_evictions=self.block_pool.num_evictions,
            num_collisions=self.num_collisions,
            num_swapped_out_blocks=self.num_swapped_out_blocks,
            num_swapped_in_blocks=self.num_swapped_in_blocks,
            num_cpu_blocks=self.num_cpu_blocks,
            num_free_cpu_blocks=len(self.free_cpu_blocks),
        )
