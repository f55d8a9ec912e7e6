"""`BlockPool`: fixed-size KV blocks, ref counts, an LRU free queue and the prefix-cache map.

A freed block keeps its content hash and stays findable in the prefix cache until
it is handed out again (then it is evicted). Allocation pops the least recently
freed block; all operations are O(1) per block.

The free queue is a list read from a head index (blocks are taken as one slice, freed
blocks appended at the tail) rather than a linked map: a block revived by a prefix hit
leaves a hole (None) at its place, skipped when the head passes it. The order blocks
leave the queue is the same as a linked list's. A block's place is kept only when it is
freed with a hash (the only free blocks a prefix hit can find); reviving one freed without
a hash (no caller of the core does) searches the queue for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import cast

_BLOCK_ID = attrgetter("block_id")


class KVCacheBlock:
    """One block of `block_size` token slots in the device KV pool."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "token_ids", "free_pos")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None  # set once the block is full and cached
        self.token_ids: tuple[int, ...] | None = None  # kept for the collision guard
        self.free_pos = -1  # its place in the pool's free queue (kept if freed with a hash)

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


# The table entry of a block a sliding-window request no longer reads (vLLM v1's null block):
# id -1, never in the pool, never freed, touched or cached; its ref count stays 1 so that
# nothing counts it as a free block to revive. A backend must never read id -1.
NULL_BLOCK_ID = -1
NULL_BLOCK = KVCacheBlock(NULL_BLOCK_ID)
NULL_BLOCK.ref_cnt = 1


def num_revived(hits: Sequence[KVCacheBlock]) -> int:
    """Prefix-hit blocks that nobody holds: taking them takes them out of the free queue."""
    return sum(1 for b in hits if b.ref_cnt == 0)


class BlockPool:
    """The device block pool shared by all requests of one replica."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        # block objects are made the first time they are handed out (None before)
        self.blocks: list[KVCacheBlock | None] = [None] * num_blocks
        # Blocks never handed out come first, in id order (kept as a counter, so a pool of
        # millions of blocks is cheap to build); then freed blocks, least recently freed first:
        # `_queue[_head:]` (their ids alongside in `_queue_ids`), holes (None) where a block
        # was revived; `_base` is the queue position of `_queue[0]` (positions stay valid when
        # the taken prefix is dropped).
        self._next_unused = 0
        self._queue: list[KVCacheBlock | None] = []
        self._queue_ids: list[int] = []
        self._head = 0
        self._base = 0
        self._num_holes = 0
        self.num_free_blocks = num_blocks  # blocks no request references
        self.compact_after = 1024  # taken queue entries kept before they are dropped (amortised O(1))
        self.cached_hash_to_block: dict[int, KVCacheBlock] = {}
        self.num_evictions = 0

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by at least one request (0..1)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def free_queue_blocks(self) -> list[KVCacheBlock]:
        """The freed blocks (not the never-used ones), least recently freed first."""
        return [b for b in self._queue[self._head:] if b is not None]

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` free blocks (never used first, then LRU), evicting their
        cached hashes."""
        return self.take_blocks(num_blocks)[0]

    def take_blocks(self, num_blocks: int) -> tuple[list[KVCacheBlock], list[int]]:
        """`get_new_blocks(num_blocks)` and the blocks' ids."""
        free = self.num_free_blocks
        if num_blocks > free:
            raise ValueError(f"cannot allocate {num_blocks} blocks: only {free} free")
        self.num_free_blocks = free - num_blocks
        out: list[KVCacheBlock] = []
        out_ids: list[int] = []
        fresh = min(num_blocks, self.num_blocks - self._next_unused)
        if fresh:
            start = self._next_unused
            self._next_unused += fresh
            blocks = self.blocks
            out_ids = list(range(start, start + fresh))
            for i in out_ids:
                block = blocks[i] = KVCacheBlock(i)
                block.ref_cnt = 1
                out.append(block)
            num_blocks -= fresh
        if not num_blocks:
            return out, out_ids
        queue, head = self._queue, self._head
        popped: list[KVCacheBlock]
        if not self._num_holes:  # (no hole: no None among them)
            popped = cast("list[KVCacheBlock]", queue[head:head + num_blocks])
            ids = self._queue_ids[head:head + num_blocks]
            head += num_blocks
        else:
            popped, ids = [], []
            queue_ids = self._queue_ids
            while len(popped) < num_blocks:
                entry = queue[head]
                if entry is None:
                    self._num_holes -= 1
                else:
                    popped.append(entry)
                    ids.append(queue_ids[head])
                head += 1
        if head > self.compact_after and 2 * head > len(queue):  # drop the taken prefix
            del queue[:head], self._queue_ids[:head]
            self._base += head
            head = 0
        self._head = head
        if not self.cached_hash_to_block:  # no free block holds a hash: nothing to evict
            for block in popped:
                block.ref_cnt = 1
        else:
            for block in popped:
                if block.block_hash is not None:
                    self._evict(block)
                block.ref_cnt = 1
        if out:
            return out + popped, out_ids + ids
        return popped, ids

    def _evict(self, block: KVCacheBlock) -> None:
        h = block.block_hash
        if h is not None and self.cached_hash_to_block.get(h) is block:
            del self.cached_hash_to_block[h]
        block.block_hash = None
        block.token_ids = None
        self.num_evictions += 1

    def forget(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Unregister the hash of each of `blocks` that only its holder references: its
        content is not the KV the hash names (it was never computed). Not an eviction."""
        cached = self.cached_hash_to_block
        for block in blocks:
            h = block.block_hash
            if h is not None and block.ref_cnt == 1:
                if cached.get(h) is block:
                    del cached[h]
                block.block_hash = None
                block.token_ids = None

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take a reference on cached blocks (prefix hits or sharing), reviving free ones."""
        queue = self._queue
        for block in blocks:
            if block.ref_cnt == 0:
                i = block.free_pos - self._base
                if not (self._head <= i < len(queue) and queue[i] is block):
                    i = queue.index(block, self._head)  # freed without a hash: not kept
                queue[i] = None
                self._num_holes += 1
                self.num_free_blocks -= 1
            block.ref_cnt += 1

    def free_blocks(self, blocks_in_eviction_order: list[KVCacheBlock],
                    block_ids: list[int] | None = None) -> None:
        """Drop one reference from each block; unreferenced blocks join the free queue's tail.
        `block_ids`: the blocks' ids, if the caller has them."""
        blocks = blocks_in_eviction_order
        freed = 0
        for block in blocks:
            ref = block.ref_cnt - 1
            block.ref_cnt = ref
            if not ref:
                freed += 1
            elif ref < 0:
                raise RuntimeError(f"ref count of block {block.block_id} went negative")
        if not freed:
            return
        self.num_free_blocks += freed
        queue = self._queue
        start = self._base + len(queue)
        if freed == len(blocks):  # (the blocks of a table are distinct)
            queue.extend(blocks)
            self._queue_ids.extend(block_ids if block_ids is not None else map(_BLOCK_ID, blocks))
            if self.cached_hash_to_block:
                # a prefix hit finds a free block by its hash, and revives it from its place
                # (a block is hashed before it is freed, never in the queue)
                for i, block in enumerate(blocks):
                    if block.block_hash is not None:
                        block.free_pos = start + i
            return
        queue_ids = self._queue_ids
        for block in blocks:
            if not block.ref_cnt:
                block.free_pos = self._base + len(queue)
                queue.append(block)
                queue_ids.append(block.block_id)

    def cache_block(
        self, block: KVCacheBlock, block_hash: int, token_ids: tuple[int, ...] | None
    ) -> None:
        """Register a full block under its hash (first one wins when content is duplicated)."""
        if block.block_hash is not None or block_hash in self.cached_hash_to_block:
            return
        block.block_hash = block_hash
        block.token_ids = token_ids
        self.cached_hash_to_block[block_hash] = block

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        return self.cached_hash_to_block.get(block_hash)

    def reset_prefix_cache(self) -> int:
        """Forget every cached hash of unreferenced blocks; returns how many were dropped."""
        dropped = 0
        for block in self.free_queue_blocks():
            if block.block_hash is not None:
                self._evict(block)
                dropped += 1
        return dropped
