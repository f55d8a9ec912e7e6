"""Block moves of `KVCacheManager` that a backend must copy (a mixin): `fork` shares a
parent's full blocks with a parallel-sampling child and copies its partial last block;
`swap_out` / `swap_in` move a preempted request's blocks to and from the host pool. Each
returns the (source, destination) block pairs for the executor to copy (the simulator
charges their link time), or None when nothing changed.
"""

from __future__ import annotations

from collections import deque

from simulator.core.block_pool import NULL_BLOCK, BlockPool, KVCacheBlock
from simulator.core.request import Request


class BlockCopies:
    """Fork and swap of a `KVCacheManager` (see the module docstring). The manager's state
    and methods it uses are declared here (set and defined by `KVCacheManager`), so the
    compiled core lays them out once."""

    block_size: int
    block_pool: BlockPool
    sliding_window: int
    req_to_blocks: dict[str, list[KVCacheBlock]]
    req_to_block_ids: dict[str, list[int]]
    num_cached_blocks: dict[str, int]
    num_skipped_blocks: dict[str, int]
    free_cpu_blocks: deque[int]
    req_to_cpu_blocks: dict[str, list[int]]
    cpu_skipped_blocks: dict[str, int]
    num_swapped_out_blocks: int
    num_swapped_in_blocks: int
    state_blocks: int
    req_to_state_blocks: dict[str, list[KVCacheBlock]]
    sliding_groups: int
    req_to_window_blocks: dict[str, list[KVCacheBlock]]
    window_first: dict[str, int]

    def free(self, request: Request, preempted: bool = False) -> None:
        raise NotImplementedError  # KVCacheManager.free

    def _free_slid_out(self, rid: str, blocks: list[KVCacheBlock], num_computed: int) -> None:
        raise NotImplementedError  # KVCacheManager._free_slid_out

    @staticmethod
    def _no_blocks_cached(request: Request) -> int:
        raise NotImplementedError  # KVCacheManager._no_blocks_cached

    def _note_usage(self) -> None:
        raise NotImplementedError  # KVCacheManager._note_usage

    def fork(self, parent: Request, child: Request) -> list[tuple[int, int]] | None:
        """Give `child` the parent's computed blocks: full blocks are shared; a partial last
        block is copied, and so are the parent's recurrent state (`state_blocks`) and its
        sliding groups' live blocks (`sliding_groups`). Returns the
        (src, dst) device copies to make (empty if none), or None (nothing changed) if no
        block is free for the copies."""
        pid, cid = parent.request_id, child.request_id
        bs = self.block_size
        num_computed = parent.num_computed_tokens
        parent_blocks = self.req_to_blocks.get(pid, [])
        num_full = num_computed // bs
        partial = num_computed % bs != 0
        state = self.req_to_state_blocks.get(pid, []) if self.state_blocks else []
        window = self.req_to_window_blocks.get(pid, []) if self.sliding_groups else []
        if (1 if partial else 0) + len(state) + len(window) > self.block_pool.num_free_blocks:
            return None
        shared = parent_blocks[:num_full]
        skipped = self.num_skipped_blocks.get(pid, 0)  # <= num_full: the window ends later
        self.block_pool.touch(shared[skipped:] if skipped else shared)
        if skipped:
            self.num_skipped_blocks[cid] = skipped
        blocks = list(shared)
        copy: list[tuple[int, int]] = []
        if partial:
            (new,) = self.block_pool.get_new_blocks(1)
            copy.append((parent_blocks[num_full].block_id, new.block_id))
            blocks.append(new)
        if state:  # the child's own copy of the state the parent reached
            own = self.block_pool.get_new_blocks(len(state))
            copy.extend((s.block_id, d.block_id) for s, d in zip(state, own))
            self.req_to_state_blocks[cid] = own
        if pid in self.req_to_window_blocks:  # the child's own copy of the window's KV
            mine = self.block_pool.get_new_blocks(len(window)) if window else []
            copy.extend((s.block_id, d.block_id) for s, d in zip(window, mine))
            self.req_to_window_blocks[cid] = mine
            self.window_first[cid] = self.window_first[pid]
        self.req_to_blocks[cid] = blocks
        self.req_to_block_ids[cid] = [b.block_id for b in blocks]
        self.num_cached_blocks[cid] = min(self.num_cached_blocks.get(pid, 0), num_full)
        child.block_hashes = list(parent.block_hashes[:num_full])
        child.block_hashes_block_size = parent.block_hashes_block_size
        return copy

    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move all the request's device blocks to host blocks. Returns (device, host) pairs,
        or None (nothing changed) if the host pool is too small."""
        rid = request.request_id
        if self.sliding_window and rid in self.req_to_blocks:
            # blocks that slid out during its last step are freed, not copied to the host: a
            # long prompt chunk can leave most of them, and restoring them could need more
            # blocks than the whole pool (the request would never be swapped back in)
            self._free_slid_out(rid, self.req_to_blocks[rid], request.num_computed_tokens)
        skipped = self.num_skipped_blocks.get(rid, 0)
        blocks = self.req_to_blocks.get(rid, [])[skipped:]  # slid-out entries stay NULL
        if len(blocks) > len(self.free_cpu_blocks):
            return None
        cpu = [self.free_cpu_blocks.popleft() for _ in blocks]
        mapping = [(b.block_id, c) for b, c in zip(blocks, cpu)]
        self.free(request)
        self.req_to_cpu_blocks[rid] = cpu
        if skipped:
            self.cpu_skipped_blocks[rid] = skipped
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
        new = self.block_pool.get_new_blocks(len(cpu))
        skipped = self.cpu_skipped_blocks.pop(rid, 0)
        blocks = [NULL_BLOCK] * skipped + new if skipped else new
        if skipped:
            self.num_skipped_blocks[rid] = skipped
        self.req_to_blocks[rid] = blocks
        self.req_to_block_ids[rid] = [b.block_id for b in blocks]
        self.num_cached_blocks[rid] = self._no_blocks_cached(request)
        self.free_cpu_blocks.extend(cpu)
        self.num_swapped_in_blocks += len(cpu)
        self._note_usage()
        return [(c, b.block_id) for c, b in zip(cpu, new)]
