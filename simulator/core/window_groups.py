"""The sliding groups of `KVCacheManager` (a mixin, as `BlockCopies`): vLLM V1's hybrid KV
cache manager for a model that mixes sliding-window and full-attention layers. Besides its
table (the full-attention group's), a request holds `sliding_groups` blocks per block position
its sliding layers still read, position-major (`req_to_window_blocks`, from position
`window_first`); these helpers find where a window starts, what a step takes, what slides out
(in vLLM's order), the sliding groups' part of a prefix hit and their block tables.
"""

from __future__ import annotations

from simulator.core.block_copies import BlockCopies
from simulator.core.block_pool import NULL_BLOCK, KVCacheBlock
from simulator.core.request import Request


def group_layout(num_full: int, num_sliding: int) -> tuple[int, int] | None:
    """(layers per group, groups of sliding layers) of vLLM V1's hybrid KV cache manager for
    `num_full` full-attention and `num_sliding` sliding-window layers; None where kvpd keeps
    one table for every layer. vLLM (`_get_kv_cache_groups_uniform_page_size`, v0.11.0)
    groups each attention type's layers by the smaller type's count, padding the last group
    of a type; kvpd models one full-attention group, so a model with more full than sliding
    layers, or with layers of one kind only, gets None."""
    if num_full <= 0 or num_sliding <= 0 or num_full > num_sliding:
        return None
    return num_full, -(-num_sliding // num_full)


def group_hash(block_hash: int, group: int) -> int:
    """The prefix-cache key of sliding group `group`'s block at a position whose table block
    hashes `block_hash` (vLLM keys each group's blocks by (hash, group id))."""
    return hash((block_hash, group + 1))


class WindowGroups(BlockCopies):
    """The sliding-group part of `KVCacheManager` (see the module docstring). The state it
    reads beyond `BlockCopies`' is declared here (set by `KVCacheManager.__init__`)."""

    group_window: int
    group_hit_blocks: int
    num_slid_out_blocks: int

    def window_block_ids(self, request_id: str) -> list[list[int]]:
        """The request's block table of each sliding group: one entry per block position it
        has allocated, `NULL_BLOCK`'s id for the positions that slid out (as the table of a
        model whose every layer slides)."""
        window = self.req_to_window_blocks.get(request_id, [])
        head = [NULL_BLOCK.block_id] * self.window_first.get(request_id, 0)
        g = self.sliding_groups
        return [head + [b.block_id for b in window[k::g]] for k in range(g)]

    def _group_hit_length(self, hashes: list[int], length: int) -> int:
        """The longest prefix of the table's `length` hit positions whose last
        `group_hit_blocks` positions (or all of them, if fewer) every sliding group has cached
        (vLLM's hybrid cache hit: the sliding window's rule within the full layers' hit)."""
        cached = self.block_pool.cached_hash_to_block
        groups = self.sliding_groups
        need = self.group_hit_blocks
        best = run = 0
        for i in range(length):
            h = hashes[i]
            if all(group_hash(h, k) in cached for k in range(groups)):
                run += 1
                if run >= need or run == i + 1:
                    best = i + 1
            else:
                run = 0
        return best

    def _window_hit_blocks(self, request: Request, num_hit: int) -> list[KVCacheBlock]:
        """The cached sliding-group blocks a hit of `num_hit` table positions revives: those of
        the window before the hit point (from `_window_first_at`), position-major, group
        order, as the request's window list holds them."""
        if not num_hit:
            return []
        hashes = request.block_hashes
        cached = self.block_pool.cached_hash_to_block
        first = self._window_first_at(num_hit * self.block_size)
        return [cached[group_hash(hashes[p], k)] for p in range(first, num_hit)
                for k in range(self.sliding_groups)]

    def _window_first_at(self, num_computed: int) -> int:
        """The first block position a sliding layer still reads once `num_computed` tokens are
        computed (vLLM's `remove_skipped_blocks`: keys from num_computed - window + 1 on)."""
        first = (num_computed - self.group_window + 1) // self.block_size
        return first if first > 0 else 0

    def _window_need(self, rid: str, num_computed: int, num_total: int) -> int:
        """Blocks the sliding groups take so that the request holds `num_total` tokens, once
        those before what `num_computed` computed tokens read are freed: one per group for
        each new block position (from the first one they still read, for a request holding
        none yet)."""
        window = self.req_to_window_blocks.get(rid)
        end = -(-num_total // self.block_size)
        if window is None:
            start = self._window_first_at(num_computed)
        else:
            start = self.window_first[rid] + len(window) // self.sliding_groups
        return self.sliding_groups * (end - start) if end > start else 0

    def free_window_before(self, request_id: str, first: int) -> None:
        """Free the request's sliding-group blocks of the block positions before `first`
        (slid out of the window)."""
        rid = request_id
        window = self.req_to_window_blocks.get(rid)
        if not window:
            return
        held_from = self.window_first[rid]
        n = min(first - held_from, len(window) // self.sliding_groups) * self.sliding_groups
        if n <= 0:
            return
        groups = self.sliding_groups
        self.window_first[rid] = held_from + n // groups
        # vLLM's order (`SlidingWindowManager.remove_skipped_blocks` of each group in turn):
        # group by group, each group's positions latest first
        gone = [window[i] for k in range(groups) for i in range(n - groups + k, -1, -groups)]
        del window[:n]
        self.num_slid_out_blocks += n
        self.block_pool.free_blocks(gone)
