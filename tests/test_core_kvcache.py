import pytest

from simulator.core import BlockPool, CacheConfig, KVCacheManager, Request, SchedulerConfig
from simulator.core.block_hash import extend_block_hashes


def _req(rid, tokens):
    return Request(rid, prompt_token_ids=list(tokens))


def test_block_pool_lru_reuse_and_eviction():
    pool = BlockPool(4)
    a = pool.get_new_blocks(2)
    pool.cache_block(a[0], 111, None)
    pool.free_blocks(a[::-1])  # tail first
    assert pool.num_free_blocks == 4
    # the never-used blocks 2,3 come first, then a[1], then a[0] (freed last)
    order = [b.block_id for b in pool.get_new_blocks(4)]
    assert order == [2, 3, a[1].block_id, a[0].block_id]
    assert pool.num_evictions == 1 and pool.get_cached_block(111) is None


def test_block_pool_rejects_over_allocation_and_negative_refs():
    pool = BlockPool(2)
    with pytest.raises(ValueError, match="only 2 free"):
        pool.get_new_blocks(3)
    (b,) = pool.get_new_blocks(1)
    pool.free_blocks([b])
    with pytest.raises(RuntimeError, match="negative"):
        pool.free_blocks([b])


def test_prefix_hit_after_free_and_full_hit_rule():
    kvm = KVCacheManager(num_gpu_blocks=16, block_size=4)
    a = _req("a", range(8))  # exactly two full blocks
    assert kvm.allocate_slots(a, 8)
    a.num_computed_tokens = 8
    kvm.free(a)
    b = _req("b", range(8))
    hits, n = kvm.get_computed_blocks(b)
    # full hit is cut back by one block: the last token must be recomputed
    assert n == 4 and len(hits) == 1
    c = _req("c", list(range(8)) + [99])
    hits, n = kvm.get_computed_blocks(c)
    assert n == 8
    assert kvm.allocate_slots(c, 1, hits)
    assert kvm.get_block_ids("c")[:2] == [h.block_id for h in hits]
    d = _req("d", [1] + list(range(1, 9)))  # differs in the first block: no hit
    assert kvm.get_computed_blocks(d)[1] == 0


def test_blocks_registered_for_tokens_never_computed_are_not_hit_after_a_free():
    """A request allocated (and its full blocks registered) for 12 tokens but preempted before
    the step computed more than 4 of them: only the computed block may be hit afterwards."""
    kvm = KVCacheManager(num_gpu_blocks=16, block_size=4)
    a = _req("a", range(13))
    assert kvm.allocate_slots(a, 12)  # registers the three full blocks as it allocates
    a.num_computed_tokens = 4  # the step that would have computed 4..11 never ran for it
    kvm.free(a, preempted=True)
    hits, n = kvm.get_computed_blocks(_req("b", range(13)))
    assert n == 4 and len(hits) == 1
    assert kvm.block_pool.num_evictions == 0  # forgetting is not an eviction


def test_hit_blocks_carry_the_same_tokens_and_collisions_are_refused():
    kvm = KVCacheManager(num_gpu_blocks=8, block_size=2)
    a = _req("a", [1, 2, 3, 4, 5])
    kvm.allocate_slots(a, 5)
    kvm.free(a)
    from simulator.core.block_hash import hash_token_block

    b = _req("b", [9, 9, 3, 4, 5])
    # a block registered under b's first-block hash but holding other tokens: a hash collision
    kvm.block_pool.cached_hash_to_block.clear()
    blk = kvm.block_pool.get_new_blocks(1)[0]
    kvm.block_pool.cache_block(blk, hash_token_block(None, (9, 9)), (1, 2))
    hits, n = kvm.get_computed_blocks(b)
    assert n == 0 and kvm.num_collisions == 1


def test_trace_hashes_map_onto_any_dividing_block_size():
    for bs in (16, 32, 64, 128, 512):
        r1 = Request("x", num_prompt_tokens=1024, prompt_hash_ids=[7, 8], hash_block_size=512)
        r2 = Request("y", num_prompt_tokens=1024, prompt_hash_ids=[7, 9], hash_block_size=512)
        h1 = extend_block_hashes(r1, bs, 1024 // bs)
        h2 = extend_block_hashes(r2, bs, 1024 // bs)
        assert len(h1) == 1024 // bs and len(set(h1)) == len(h1)  # distinct derived hashes
        half = 512 // bs
        assert h1[:half] == h2[:half] and not set(h1[half:]) & set(h2[half:])
    # partial coverage: only blocks whose content hashes are known get hashes
    r3 = Request("z", num_prompt_tokens=2000, prompt_hash_ids=[1], hash_block_size=512)
    assert len(extend_block_hashes(r3, 16, 1000)) == 32


def test_trace_prefix_reuse_through_manager():
    kvm = KVCacheManager(num_gpu_blocks=200, block_size=16)
    a = Request("a", num_prompt_tokens=1100, prompt_hash_ids=[1, 2, 3], hash_block_size=512)
    kvm.allocate_slots(a, 1100)
    a.num_computed_tokens = 1100  # its prompt ran
    kvm.free(a)
    b = Request("b", num_prompt_tokens=700, prompt_hash_ids=[1, 5], hash_block_size=512)
    assert kvm.get_computed_blocks(b)[1] == 512


def test_fork_shares_full_blocks_and_copies_partial():
    kvm = KVCacheManager(num_gpu_blocks=8, block_size=4)
    p = _req("p", range(10))
    kvm.allocate_slots(p, 9)
    p.num_computed_tokens = 9
    child = _req("1_p", range(10))
    copies = kvm.fork(p, child)
    pb, cb = kvm.get_block_ids("p"), kvm.get_block_ids("1_p")
    assert cb[:2] == pb[:2] and cb[2] != pb[2]
    assert copies == [(pb[2], cb[2])]
    assert kvm.block_pool.blocks[pb[0]].ref_cnt == 2
    kvm.free(p)
    kvm.free(child)
    assert kvm.num_free_blocks == 8


def test_swap_out_and_in_report_mappings_and_bytes():
    kvm = KVCacheManager(num_gpu_blocks=4, block_size=4, num_cpu_blocks=4, block_bytes=1000)
    r = _req("r", range(8))
    kvm.allocate_slots(r, 8)
    dev = list(kvm.get_block_ids("r"))
    out = kvm.swap_out(r)
    assert [d for d, _ in out] == dev and kvm.num_free_blocks == 4
    assert len(kvm.free_cpu_blocks) == 2
    back = kvm.swap_in(r)
    assert [c for c, _ in back] == [c for _, c in out]
    assert len(kvm.free_cpu_blocks) == 4 and kvm.get_stats().num_swapped_in_blocks == 2
    small = KVCacheManager(num_gpu_blocks=4, block_size=4, num_cpu_blocks=1)
    r2 = _req("r2", range(8))
    small.allocate_slots(r2, 8)
    assert small.swap_out(r2) is None and small.num_free_blocks == 2  # nothing changed


def test_allocation_failure_changes_nothing():
    kvm = KVCacheManager(num_gpu_blocks=2, block_size=4)
    r = _req("r", range(12))
    assert not kvm.allocate_slots(r, 12)
    assert kvm.num_free_blocks == 2 and kvm.get_block_ids("r") == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_gpu_blocks": 4, "block_size": 0}, "block_size"),
        ({"num_gpu_blocks": 0}, "num_gpu_blocks"),
        ({"num_gpu_blocks": 4, "num_cpu_blocks": -1}, "num_cpu_blocks"),
    ],
)
def test_cache_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CacheConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": -1}, "max_num_batched_tokens"),
        ({"policy": "lifo"}, "policy must be one of"),
        ({"preemption_mode": "drop"}, "preemption_mode"),
        ({"batching": "dynamic"}, "batching"),
        ({"role": "router"}, "role"),
        ({"long_prefill_token_threshold": -5}, "long_prefill"),
    ],
)
def test_scheduler_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**kwargs)


def test_budget_smaller_than_a_block_and_swap_without_host_pool():
    with pytest.raises(ValueError, match="at least one block"):
        SchedulerConfig(max_num_batched_tokens=8).validate_with(CacheConfig(num_gpu_blocks=4, block_size=16))
    with pytest.raises(ValueError, match="num_cpu_blocks"):
        SchedulerConfig(preemption_mode="swap").validate_with(CacheConfig(num_gpu_blocks=4))


def test_length_only_request_finds_only_its_own_blocks_after_a_preemption():
    """A synthetic prompt (lengths only) has content of its own: a request re-admitted after
    a preemption hits its still-cached blocks (as vLLM's prefix cache does), another request
    of the same length hits nothing, and the hashes do not depend on the run."""
    kvm = KVCacheManager(num_gpu_blocks=16, block_size=4)
    a = Request("a", num_prompt_tokens=10)
    assert kvm.get_computed_blocks(a) == ([], 0)
    assert kvm.allocate_slots(a, 10)
    a.num_computed_tokens = 10
    kvm.free(a, preempted=True)  # preempted: its two full blocks stay cached
    a.num_computed_tokens = 0
    hits, n = kvm.get_computed_blocks(a)
    assert n == 8 and len(hits) == 2
    b = Request("b", num_prompt_tokens=10)
    assert kvm.get_computed_blocks(b) == ([], 0)
    again = Request("a", num_prompt_tokens=10)
    assert extend_block_hashes(again, 4, 2) == a.block_hashes[:2]
