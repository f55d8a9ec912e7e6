"""`BlockPool`: fixed-size KV blocks, ref counts, an LRU free queue and the prefix-cache map.

A freed block keeps its content hash and stays findable in the prefix cache until
it is handed out again (then it is evicted). Allocation pops the least recently
freed block; all operations are O(1) per block.
"""

from __future__ import annotations

from collections import OrderedDict


class KVCacheBlock:
    """One block of `block_size` token slots in the device KV pool."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None  # set once the block is full and cached
        self.token_ids: tuple[int, ...] | None = None  # kept for the collision guard

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


# The table entry of a block a sliding-window request no longer reads (vLLM v1's null block):
# id -1, never in the pool, never freed, touched or cached; its ref count stays 1 so that
# nothing counts it as a free block to revive. A backend must never read id -1.
NULL_BLOCK_ID = -1
NULL_BLOCK = KVCacheBlock(NULL_BLOCK_ID)
NULL_BLOCK.ref_cnt = 1


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
        # millions of blocks is cheap to build); then freed blocks, least recently freed first.
        self._next_unused = 0
        self.free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict()
        self.cached_hash_to_block: dict[int, KVCacheBlock] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue) + self.num_blocks - self._next_unused

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by at least one request (0..1)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` free blocks (never used first, then LRU), evicting their
        cached hashes."""
        free = self.num_free_blocks
        if num_blocks > free:
            raise ValueError(f"cannot allocate {num_blocks} blocks: only {free} free")
        out = []
        fresh = min(num_blocks, self.num_blocks - self._next_unused)
        if fresh:
            start = self._next_unused
            self._next_unused += fresh
            blocks = self.blocks
            for i in range(start, start + fresh):
                block = blocks[i] = KVCacheBlock(i)
                block.ref_cnt = 1
                out.append(block)
            num_blocks -= fresh
        if not num_blocks:
            return out
        popitem = self.free_queue.popitem
        if not self.cached_hash_to_block:  # no free block holds a hash: nothing to evict
            popped = [popitem(False)[1] for _ in range(num_blocks)]
            for block in popped:
                block.ref_cnt = 1
        else:
            popped = []
            for _ in range(num_blocks):
                block = popitem(False)[1]
                if block.block_hash is not None:
                    self._evict(block)
                block.ref_cnt = 1
                popped.append(block)
        if out:
            out.extend(popped)
            return out
        return popped

    def _evict(self, block: KVCacheBlock) -> None:
        if self.cached_hash_to_block.get(block.block_hash) is block:
            del self.cached_hash_to_block[block.block_hash]
        block.block_hash = None
        block.token_ids = None
        self.num_evictions += 1

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Take a reference on cached blocks (prefix hits or sharing), reviving free ones."""
        free_queue = self.free_queue
        for block in blocks:
            if block.ref_cnt == 0:
                del free_queue[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, blocks_in_eviction_order: list[KVCacheBlock]) -> None:
        """Drop one reference from each block; unreferenced blocks join the free queue's tail."""
        free_queue = self.free_queue
        for block in blocks_in_eviction_order:
            ref = block.ref_cnt - 1
            block.ref_cnt = ref
            if not ref:
                free_queue[block.block_id] = block
            elif ref < 0:
                raise RuntimeError(f"ref count of block {block.block_id} went negative")

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
        for block in list(self.free_queue.values()):
            if block.block_hash is not None:
                self._evict(block)
                dropped += 1
        return dropped
