"""`BlockPool`'s free queue (a list read from a head index, holes where a prefix hit revived a
block) against a plain LRU model: an OrderedDict of free blocks, popped from the front."""

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.core import BlockPool

# ("take", n) | ("free", held index, count, reversed) | ("cache", held index) | ("hit", k)
ops = st.lists(st.one_of(
    st.tuples(st.just("take"), st.integers(0, 7)),
    st.tuples(st.just("free"), st.integers(0, 50), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("cache"), st.integers(0, 50)),
    st.tuples(st.just("hit"), st.integers(0, 50)),
), max_size=120)


class _Model:
    """Reference: never-used blocks in id order, then an OrderedDict LRU of freed ones."""

    def __init__(self, n: int) -> None:
        self.n, self.next_unused = n, 0
        self.free: OrderedDict[int, None] = OrderedDict()
        self.ref = [0] * n
        self.hashed: dict[int, int] = {}  # hash -> block id

    def take(self, k: int) -> list[int]:
        out = list(range(self.next_unused, min(self.n, self.next_unused + k)))
        self.next_unused += len(out)
        while len(out) < k:
            out.append(self.free.popitem(last=False)[0])
        for b in out:
            self.ref[b] = 1
            for h, hb in list(self.hashed.items()):
                if hb == b:
                    del self.hashed[h]  # evicted when handed out again
        return out

    def free_ids(self, ids: list[int]) -> None:
        for b in ids:
            self.ref[b] -= 1
            if not self.ref[b]:
                self.free[b] = None

    def touch(self, b: int) -> None:
        if not self.ref[b]:
            del self.free[b]
        self.ref[b] += 1


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 24), ops, st.sampled_from([0, 3, 1024]))
def test_free_queue_matches_an_lru_model(num_blocks, program, compact_after):
    pool, model = BlockPool(num_blocks), _Model(num_blocks)
    pool.compact_after = compact_after  # drop taken entries early, late or never
    held: list = []  # (block, id) references the "requests" hold, one entry per reference
    next_hash = 0
    for op in program:
        if op[0] == "take":
            k = min(op[1], pool.num_free_blocks)
            blocks, ids = pool.take_blocks(k)
            assert ids == [b.block_id for b in blocks] == model.take(k)
            held.extend(zip(blocks, ids))
        elif op[0] == "free" and held:
            i = op[1] % len(held)
            batch = []  # distinct blocks, as a request's table holds them
            for item in held[i:i + op[2]]:
                if all(item[0] is not b for b, _ in batch):
                    batch.append(item)
            for item in batch:
                held.remove(item)
            if op[3]:
                batch.reverse()
            pool.free_blocks([b for b, _ in batch], [x for _, x in batch] if op[3] else None)
            model.free_ids([x for _, x in batch])
        elif op[0] == "cache" and held:
            block = held[op[1] % len(held)][0]
            pool.cache_block(block, next_hash, None)
            if block.block_hash == next_hash:
                model.hashed[next_hash] = block.block_id
            next_hash += 1
        elif op[0] == "hit" and model.hashed:
            h = sorted(model.hashed)[op[1] % len(model.hashed)]
            block = pool.get_cached_block(h)
            assert block is not None and block.block_id == model.hashed[h]
            pool.touch([block])
            model.touch(block.block_id)
            held.append((block, block.block_id))
        assert pool.num_free_blocks == len(model.free) + num_blocks - model.next_unused
        assert [b.block_id for b in pool.free_queue_blocks()] == list(model.free)
        assert all(pool.blocks[b] is None or pool.blocks[b].ref_cnt == model.ref[b]
                   for b in range(num_blocks))
    # what is left comes out in the model's order
    rest = pool.num_free_blocks
    assert [b.block_id for b in pool.get_new_blocks(rest)] == model.take(rest)


def test_a_prefix_hit_after_the_taken_entries_were_dropped():
    pool = BlockPool(6)
    pool.compact_after = 0
    blocks = pool.get_new_blocks(6)
    for h, b in enumerate(blocks):
        pool.cache_block(b, h, None)
    pool.free_blocks(blocks)  # queue: 0 1 2 3 4 5
    first = pool.get_new_blocks(4)  # takes 0-3, drops them from the queue
    assert [b.block_id for b in first] == [0, 1, 2, 3]
    pool.free_blocks(first[:2])  # queue: 4 5 0 1
    pool.touch([pool.get_cached_block(5)])  # revived: a hole where 5 was
    assert [b.block_id for b in pool.free_queue_blocks()] == [4, 0, 1]
    assert [b.block_id for b in pool.get_new_blocks(3)] == [4, 0, 1]


def test_touching_a_free_block_freed_without_a_hash():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(4)
    pool.free_blocks(blocks)  # no hashes: their places are not kept
    pool.touch([blocks[2]])  # found by a search instead
    assert [b.block_id for b in pool.free_queue_blocks()] == [0, 1, 3]
    assert pool.num_free_blocks == 3 and blocks[2].ref_cnt == 1
    assert [b.block_id for b in pool.get_new_blocks(3)] == [0, 1, 3]
