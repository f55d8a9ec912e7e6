"""`KVCacheManager`: block tables per request on top of a `BlockPool`, with prefix
caching, fork (copy-on-write) for parallel sampling and swap to a host pool.

Sliding window (`sliding_window` > 0, for a model whose every attention layer slides, as
vLLM v1's `SlidingWindowManager`): a token at position p reads keys p - window + 1 .. p, so
once a request has computed c tokens no later step reads a block wholly before position
c - window + 1. `allocate_slots` frees those blocks before it allocates (they join the free
queue, keeping their prefix-cache hash until evicted) and leaves `NULL_BLOCK` (id -1) in
their place: a table keeps its length, its freed entries are always a prefix of it, and a
backend reads only the window's blocks. A prefix hit then needs only the cached blocks the
first recomputed token reads (the window before the hit point), not the whole prefix.

KV-cache groups (`sliding_groups` > 0, for a model that mixes sliding-window and
full-attention layers, as vLLM V1's hybrid KV cache manager): a pool block holds one group's
layers (as many as the model's full-attention layers), and each request has a block table per
group. Its table here is the full-attention group's; besides it the request holds
`sliding_groups` blocks for each block position its sliding layers still read (those of the
last `group_window` tokens and of the tokens a step adds), outside the table, freed as they
slide out (`allocate_slots`, vLLM's `remove_skipped_blocks`). Their full blocks are cached
with the table's, under the table block's hash mixed with the group (`group_hash`), so a
prefix hit is vLLM's hybrid one: the table's longest hit, cut back to the longest prefix whose
last window of positions every sliding group still has cached; those window blocks are
revived, the table's hit blocks before the window are shared as usual.

Recurrent state (`state_blocks` > 0, for a model with linear-attention layers: Qwen3-Next,
Qwen3.5): each request also holds that many blocks of the pool, outside its block table, from
its first allocation until it is freed, as vLLM V1 keeps such a state in the KV pool's pages.
A request holding no table entries yet has no state blocks either, so `blocks_to_grow` with
`held` 0 counts them; prefix caching and swapping are refused with them (`CacheConfig`).

The manager only does bookkeeping; it returns the block copies a backend must
perform (swap-out, swap-in, copy-on-write) and the bytes they move, so the real
executor copies tensors and the simulator charges link time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from simulator.core.block_hash import extend_block_hashes, is_length_only
from simulator.core.block_pool import NULL_BLOCK, BlockPool, KVCacheBlock, num_revived
from simulator.core.request import Request
from simulator.core.window_groups import WindowGroups, group_hash

# `num_cached_blocks` of a request whose further blocks can never be registered
NEVER_CACHED = 1 << 62


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



def blocks_held(num_tokens: int, block_size: int, window: int, step_tokens: int) -> int:
    """The most blocks a request of `num_tokens` tokens holds at once when its steps add at
    most `step_tokens` tokens: all of them, or with a sliding `window` (0: none) the window's
    plus one step's (vLLM's `SlidingWindowSpec.max_memory_usage_bytes`:
    cdiv(window - 1 + step, bs) + 1)."""
    need = -(-num_tokens // block_size)
    if not window:
        return need
    return min(need, -(-(window - 1 + step_tokens) // block_size) + 1)

class KVCacheManager(WindowGroups):
    """Per-replica KV bookkeeping: `num_gpu_blocks` device blocks of `block_size` tokens,
    `num_cpu_blocks` host blocks for swapping; `block_bytes` is one block's KV size (all
    layers), used only to report bytes moved. `sliding_window` (tokens, 0 = none): free the
    blocks that slid out of it (see the module docstring); `max_step_tokens`: the most new
    tokens a request computes in one step (bounds what a sliding-window request holds)."""

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        num_cpu_blocks: int = 0,
        block_bytes: int = 0,
        sliding_window: int = 0,
        max_step_tokens: int = 0,
        state_blocks: int = 0,
        sliding_groups: int = 0,
        group_window: int = 0,
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
        if sliding_window < 0:
            raise ValueError(f"sliding_window must be >= 0 tokens, got {sliding_window}")
        self.sliding_window = sliding_window
        self.max_step_tokens = max_step_tokens
        # leading NULL_BLOCK entries of a table (blocks slid out of the window), by request;
        # of a swapped-out request's table, by request
        self.num_skipped_blocks: dict[str, int] = {}
        self.cpu_skipped_blocks: dict[str, int] = {}
        # blocks before a hit point that a hit needs cached: those the next token reads
        self.window_hit_blocks = max(1, -(-(sliding_window - 1) // block_size))
        self.num_slid_out_blocks = 0  # freed because they slid out of the window
        if state_blocks < 0:
            raise ValueError(f"state_blocks must be >= 0 blocks, got {state_blocks}")
        self.state_blocks = state_blocks  # a request's recurrent state, from its first allocation
        self.req_to_state_blocks: dict[str, list[KVCacheBlock]] = {}
        if sliding_groups < 0 or group_window < 0 or bool(sliding_groups) != bool(group_window):
            raise ValueError("sliding_groups and group_window go together (both > 0, or both "
                             f"0), got {sliding_groups} and {group_window}")
        if sliding_groups and sliding_window:
            raise ValueError("sliding_groups (a model mixing sliding and full layers) and "
                             "sliding_window (every layer slides) exclude each other")
        self.sliding_groups = sliding_groups  # groups of sliding layers beside the table's
        self.group_window = group_window  # tokens their layers read back
        # cached positions a hit needs right before its end in every sliding group
        self.group_hit_blocks = max(1, -(-(group_window - 1) // block_size))
        # the sliding groups' live blocks (sliding_groups per block position, in position
        # order) and the first position they still hold, by request
        self.req_to_window_blocks: dict[str, list[KVCacheBlock]] = {}
        self.window_first: dict[str, int] = {}

    # ---- queries ----
    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def max_blocks_held(self, num_tokens: int) -> int:
        """The most device blocks one request of `num_tokens` tokens holds at once: all of
        them, or with a sliding window those of the window plus one step's new tokens
        (vLLM's `SlidingWindowSpec.max_memory_usage_bytes`: cdiv(window - 1 + step, bs) + 1)."""
        held = blocks_held(num_tokens, self.block_size, self.sliding_window,
                           self.max_step_tokens or num_tokens) + self.state_blocks
        if self.sliding_groups:
            held += self.sliding_groups * blocks_held(
                num_tokens, self.block_size, self.group_window, self.max_step_tokens or num_tokens)
        return held

    def limits(self) -> dict[str, int]:
        """What bounds the blocks one request can hold (`max_blocks_held`): the pool, the block
        size, the window blocks slide out of (0: none) and the most tokens a step adds."""
        return {"num_gpu_blocks": self.num_gpu_blocks, "block_size": self.block_size,
                "sliding_window": self.sliding_window, "max_step_tokens": self.max_step_tokens,
                "sliding_groups": self.sliding_groups, "group_window": self.group_window}

    def state_to_take(self, request_id: str) -> int:
        """Recurrent-state blocks the request still takes with its next allocation (0 once it
        holds them, or without linear-attention layers)."""
        if not self.state_blocks or request_id in self.req_to_state_blocks:
            return 0
        return self.state_blocks

    def blocks_to_grow(self, num_tokens: int, held: int, revived: int = 0,
                       request_id: str | None = None) -> int:
        """Device blocks a request whose table has `held` entries (`revived` of them prefix
        hits about to leave the free queue) may still take from the free pool before it holds
        `num_tokens` tokens: those it still allocates plus the revived ones and its state
        (`state_to_take`; without `request_id`, a table with no entries has none yet), and
        with a sliding window at most `max_blocks_held` (its table never holds more; what it
        frees meanwhile comes back). With sliding groups, also the most blocks they hold at
        once less those the request holds now."""
        grow = -(-num_tokens // self.block_size) - held + revived
        if self.state_blocks:
            grow += (self.state_to_take(request_id) if request_id is not None
                     else 0 if held else self.state_blocks)
        if self.sliding_groups:
            peak = self.sliding_groups * blocks_held(num_tokens, self.block_size,
                                                     self.group_window,
                                                     self.max_step_tokens or num_tokens)
            have = self.req_to_window_blocks.get(request_id) if request_id is not None else None
            if have:
                peak -= len(have)
            if peak > 0:
                grow += peak
        if self.sliding_window:
            peak = self.max_blocks_held(num_tokens)
            if peak < grow:
                return peak
        return grow

    def num_real_blocks(self, request_id: str) -> int:
        """Device blocks the request's table holds (its entries less the slid-out ones), and
        its sliding groups' live blocks."""
        blocks = self.req_to_blocks.get(request_id)
        window = self.req_to_window_blocks.get(request_id)
        return ((len(blocks) - self.num_skipped_blocks.get(request_id, 0) if blocks else 0)
                + (len(window) if window else 0))

    def get_block_ids(self, request_id: str) -> list[int]:
        return self.req_to_block_ids.get(request_id, [])

    def has_evictable_hits(self, request: Request) -> bool:
        """Whether `request`'s cached prefix includes blocks nobody holds: blocks in the free
        queue, which any allocation may evict, changing what the request would find."""
        if not self.enable_prefix_caching:
            return False
        collisions = self.num_collisions  # (a look, not a lookup: counted by the real one)
        hits, _ = self.get_computed_blocks(request)
        self.num_collisions = collisions
        if any(b.ref_cnt == 0 for b in hits if b is not NULL_BLOCK):
            return True
        return self.sliding_groups > 0 and any(
            b.ref_cnt == 0 for b in self._window_hit_blocks(request, len(hits)))

    def get_computed_blocks(
        self, request: Request, max_hit_tokens: int | None = None
    ) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of `request` as (blocks, tokens), at most `max_hit_tokens`.
        The last token is always recomputed so its logits exist (a full hit is cut back by
        one block). With a sliding window the hit may skip blocks its recomputation never
        reads: they come back as `NULL_BLOCK`. A request that asks for prompt logprobs never
        hits: the logits of cached tokens were never computed."""
        if not self.enable_prefix_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        bs = self.block_size
        max_blocks = (request.num_tokens - 1) // bs
        if max_hit_tokens is not None and max_hit_tokens // bs < max_blocks:
            max_blocks = max_hit_tokens // bs
        if max_blocks <= 0:
            return [], 0
        if not request.block_hashes and is_length_only(request):
            return [], 0  # its own content, never registered: nothing can hit (see `free`)
        hashes = extend_block_hashes(request, bs, max_blocks)
        if self.sliding_window:
            return self._window_hits(request, hashes[:max_blocks])
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
        if self.sliding_groups and hits:
            del hits[self._group_hit_length(hashes, len(hits)):]
        return hits, len(hits) * bs

    def _window_hits(self, request: Request, hashes: list[int]) -> tuple[list[KVCacheBlock], int]:
        """The longest hit of k blocks whose last `window_hit_blocks` (or all k, if fewer) are
        cached; earlier ones may have been evicted (vLLM's sliding-window cache hit rule)."""
        bs = self.block_size
        need = self.window_hit_blocks
        cached = self.block_pool.cached_hash_to_block
        check_tokens = request.prompt_token_ids is not None
        found: list[KVCacheBlock | None] = []
        best = run = 0
        for i, block_hash in enumerate(hashes):
            block = cached.get(block_hash)
            if block is not None and check_tokens and block.token_ids is not None and (
                block.token_ids != tuple(request.token_ids_slice(i * bs, (i + 1) * bs))
            ):
                self.num_collisions += 1
                block = None
            found.append(block)
            run = run + 1 if block is not None else 0
            if run >= need or run == i + 1:
                best = i + 1
        real = min(need, best)  # (the last `real` of the best run: none is None)
        return [NULL_BLOCK] * (best - real) + cast("list[KVCacheBlock]", found[best - real:best]), best * bs

    # ---- allocation ----
    def can_allocate(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[KVCacheBlock] = ()
    ) -> bool:
        blocks = self.req_to_blocks.get(request.request_id)
        have = (len(blocks) if blocks else 0) + len(new_computed_blocks)
        num_tokens = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        need = (-(-(num_tokens + num_new_tokens) // self.block_size) - have
                + self.state_to_take(request.request_id))
        if self.sliding_groups:
            need += self._window_need(request.request_id, num_tokens,
                                      num_tokens + num_new_tokens)
        return need <= self.block_pool.num_free_blocks - num_revived(new_computed_blocks)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
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
        elif self.sliding_window:
            self._free_slid_out(rid, blocks, request.num_computed_tokens)
        num_total = request.num_computed_tokens + num_hit * bs + num_new_tokens
        need = -(-num_total // bs) - len(blocks) - num_hit
        window = 0
        window_hits: list[KVCacheBlock] = []
        if self.sliding_groups:
            if rid in self.req_to_window_blocks:
                self.free_window_before(rid, self._window_first_at(request.num_computed_tokens))
            elif num_hit:  # the cached window before the hit point is revived, not taken
                window_hits = self._window_hit_blocks(request, num_hit)
            window = self._window_need(rid, request.num_computed_tokens + num_hit * bs,
                                       num_total) - len(window_hits)
        state = self.state_to_take(rid)
        pool = self.block_pool
        reviving = num_revived(new_computed_blocks) if num_hit else 0
        if window_hits:
            reviving += num_revived(window_hits)
        if (need if need > 0 else 0) + window + state > pool.num_free_blocks - reviving:
            return False
        if state:  # the recurrent state first: it is held for the request's whole life
            self.req_to_state_blocks[rid] = pool.take_blocks(state)[0]
            self._note_usage()
        # the hits first (table, then window): taking new blocks may evict free cached ones
        if num_hit:
            ids = self.req_to_block_ids[rid]
            skipped = 0  # NULL_BLOCKs lead a sliding-window hit
            while skipped < num_hit and new_computed_blocks[skipped] is NULL_BLOCK:
                skipped += 1
            pool.touch(new_computed_blocks[skipped:] if skipped else new_computed_blocks)
            if skipped:
                self.num_skipped_blocks[rid] = skipped
            blocks.extend(new_computed_blocks)
            ids.extend([b.block_id for b in new_computed_blocks])
            self.num_cached_blocks[rid] = len(blocks)
        if window or window_hits:  # the sliding groups' blocks of the new positions
            if rid not in self.req_to_window_blocks:
                self.req_to_window_blocks[rid] = []
                self.window_first[rid] = self._window_first_at(
                    request.num_computed_tokens + num_hit * bs)
            if window_hits:
                pool.touch(window_hits)
                self.req_to_window_blocks[rid].extend(window_hits)
            if window:
                self.req_to_window_blocks[rid].extend(pool.take_blocks(window)[0])
            self._note_usage()
        if need > 0:
            self.append_blocks(rid, need)
        if cache and self.enable_prefix_caching and num_total // bs > self.num_cached_blocks[rid]:
            self.cache_full_blocks(request, num_total)
        return True

    def append_blocks(self, request_id: str, num_blocks: int) -> None:
        """Take `num_blocks` free blocks onto the end of the request's table (the caller has
        checked that they are free) and note the peak usage."""
        pool = self.block_pool
        new, ids = pool.take_blocks(num_blocks)
        self.req_to_blocks[request_id].extend(new)
        self.req_to_block_ids[request_id].extend(ids)
        usage = 1.0 - pool.num_free_blocks / pool.num_blocks  # BlockPool.usage, inlined
        if usage > self.peak_usage:
            self.peak_usage = usage

    def append_blocks_each(self, needs: list[tuple[str, int]]) -> None:
        """`append_blocks(request_id, n)` for each (request_id, n) of `needs` in turn, from one
        take of the pool (the same blocks in the same order; the caller has checked that
        they are free)."""
        pool = self.block_pool
        new, ids = pool.take_blocks(sum(n for _, n in needs))
        to_blocks, to_ids = self.req_to_blocks, self.req_to_block_ids
        i = 0
        for rid, n in needs:
            to_blocks[rid].extend(new[i:i + n])
            to_ids[rid].extend(ids[i:i + n])
            i += n
        usage = 1.0 - pool.num_free_blocks / pool.num_blocks  # (it only grew meanwhile)
        if usage > self.peak_usage:
            self.peak_usage = usage

    def sliding_tables(self) -> tuple[int, dict[str, int], Callable[[str, int], None]]:
        """What slides out of a window: (the window, tokens; the first block position each
        request still holds; the call that frees a request's positions before a given one),
        of the sliding groups, or with every layer sliding of the block table."""
        if self.sliding_groups:
            return self.group_window, self.window_first, self.free_window_before
        return self.sliding_window, self.num_skipped_blocks, self.free_blocks_before

    def slides_out(self, request_id: str, num_computed: int) -> bool:
        """Whether computing from position `num_computed` on frees a block of the request."""
        if self.sliding_groups:
            return self._window_first_at(num_computed) > self.window_first.get(request_id, 0)
        return (num_computed - self.sliding_window + 1) // self.block_size > \
            self.num_skipped_blocks.get(request_id, 0)

    def free_blocks_before(self, request_id: str, first: int) -> None:
        """Free the request's blocks before table index `first` (slid out of the window)."""
        blocks = self.req_to_blocks.get(request_id)
        if blocks:
            self._free_before(request_id, blocks, first)

    def _free_slid_out(self, rid: str, blocks: list[KVCacheBlock], num_computed: int) -> None:
        """Free the blocks no token at position >= `num_computed` reads (all before the block
        of position num_computed - window + 1)."""
        self._free_before(rid, blocks, (num_computed - self.sliding_window + 1) // self.block_size)

    def _free_before(self, rid: str, blocks: list[KVCacheBlock], first: int) -> None:
        """Free entries before index `first`, latest first, as vLLM's
        `SlidingWindowManager.remove_skipped_blocks` does (the free queue's eviction order)."""
        skipped = self.num_skipped_blocks.get(rid, 0)
        if first <= skipped:
            return
        gone = blocks[first - 1:skipped - 1:-1] if skipped else blocks[first - 1::-1]
        ids = self.req_to_block_ids[rid]
        for i in range(skipped, first):
            blocks[i] = NULL_BLOCK
            ids[i] = NULL_BLOCK.block_id
        self.num_skipped_blocks[rid] = first
        self.num_slid_out_blocks += len(gone)
        self.block_pool.free_blocks(gone)

    @staticmethod
    def _no_blocks_cached(request: Request) -> int:
        """`num_cached_blocks` of a request holding no registered block: 0, or `NEVER_CACHED`
        for a length-only prompt: its blocks hash as content of its own (block_hash.py) that no
        other request can hit, so they are registered only when a preemption frees them
        (`free(..., preempted=True)`), the one time they can be hit (by the request itself on
        re-admission). The outcome equals registering them as they fill, at less cost."""
        return NEVER_CACHED if is_length_only(request) else 0

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
        skipped = self.num_skipped_blocks.get(rid, 0)
        if skipped > start:  # slid out before it could be registered: nothing to cache
            start = skipped
        for i in range(start, end):
            tokens = tuple(request.token_ids_slice(i * bs, (i + 1) * bs)) if keep_tokens else None
            pool.cache_block(blocks[i], hashes[i], tokens)
        if self.sliding_groups:  # the sliding groups' blocks of those positions still held
            window = self.req_to_window_blocks.get(rid)
            first = self.window_first.get(rid, 0)
            groups = self.sliding_groups
            if window:
                for i in range(max(start, first), min(end, first + len(window) // groups)):
                    for k in range(groups):
                        pool.cache_block(window[(i - first) * groups + k],
                                         group_hash(hashes[i], k), None)
        if never:  # content past the trace's hashed prompt is unknowable: never look again
            self.num_cached_blocks[rid] = NEVER_CACHED
        elif end > self.num_cached_blocks[rid]:
            self.num_cached_blocks[rid] = end

    def free(self, request: Request, preempted: bool = False) -> None:
        """Release the request's device blocks (tail first, so the prefix stays cached longest)
        and any host blocks it holds. `preempted`: it will be re-admitted, so a length-only
        request's computed full blocks are registered first (vLLM's preempted request finds
        its freed blocks still cached until they are reused)."""
        rid = request.request_id
        if preempted and self.enable_prefix_caching and is_length_only(request) and (
                rid in self.req_to_blocks):
            self.num_cached_blocks[rid] = 0
            self.cache_full_blocks(request, request.num_computed_tokens)
        blocks = self.req_to_blocks.pop(rid, None)
        ids = self.req_to_block_ids.pop(rid, None)
        self.num_cached_blocks.pop(rid, None)
        skipped = self.num_skipped_blocks.pop(rid, 0)
        if blocks:
            assert ids is not None  # (popped with the blocks)
            done = request.num_computed_tokens // self.block_size
            if self.enable_prefix_caching and done < len(blocks):
                # blocks registered for tokens scheduled in a step that never ran for it (it
                # was preempted, swapped out or aborted in the pass that allocated them) hold
                # no such KV: a later prefix hit must not find them
                self.block_pool.forget(blocks[done:])
                window = self.req_to_window_blocks.get(rid)
                if window:
                    first = self.window_first.get(rid, 0)
                    at = max(0, done - first) * self.sliding_groups
                    self.block_pool.forget(window[at:])
            if skipped:
                self.block_pool.free_blocks(blocks[:skipped - 1:-1], ids[:skipped - 1:-1])
            else:
                self.block_pool.free_blocks(blocks[::-1], ids[::-1])
        state = self.req_to_state_blocks.pop(rid, None)
        if state:
            self.block_pool.free_blocks(state)
        window = self.req_to_window_blocks.pop(rid, None)
        self.window_first.pop(rid, None)
        if window:
            self.block_pool.free_blocks(window[::-1])
        cpu = self.req_to_cpu_blocks.pop(rid, None)
        self.cpu_skipped_blocks.pop(rid, None)
        if cpu:
            self.free_cpu_blocks.extend(cpu)

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
