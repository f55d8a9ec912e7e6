"""KV cache groups of sliding layers (`sliding_groups`, vLLM V1's hybrid KV cache manager) in
the shared core: a request holds its full-attention table plus one block per sliding group for
each block position its sliding layers still read; those slide out as it computes, every
admission check counts them, and the pool is whole again after random workloads under every
capacity policy, with no block freed that a step still reads."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.core import CacheConfig, KVCacheManager, Request, Scheduler, SchedulerConfig
from tests.core_helpers import make_request, workload_requests
from tests.test_core_properties import TokenExecutor, run
from tests.test_core_state_blocks import workload  # (the same random workloads)


def _req(rid: str, n: int) -> Request:
    return Request(rid, prompt_token_ids=list(range(n)))


def _kvm(blocks: int = 40, groups: int = 1, window: int = 8, step: int = 8) -> KVCacheManager:
    return KVCacheManager(num_gpu_blocks=blocks, block_size=4, enable_prefix_caching=False,
                          sliding_groups=groups, group_window=window, max_step_tokens=step)


def test_a_prompt_takes_its_window_blocks_beside_its_table_and_they_slide_out():
    kvm = _kvm(groups=2)
    a = _req("a", 20)
    assert kvm.allocate_slots(a, 20)  # 5 positions: 5 table blocks + 2 x 5 window blocks
    assert kvm.num_free_blocks == 40 - 5 - 10 and kvm.num_real_blocks("a") == 15
    a.num_computed_tokens = 20
    # a decode at position 20 reads keys 13..20: positions 3..5 (the 6th is new)
    assert kvm.allocate_slots(a, 1)
    assert kvm.window_first["a"] == 3 and len(kvm.req_to_window_blocks["a"]) == 2 * 3
    assert kvm.num_free_blocks == 40 - 6 - 6
    kvm.free(a)
    assert kvm.num_free_blocks == 40 and not kvm.req_to_window_blocks and not kvm.window_first


def test_slid_out_blocks_leave_latest_first_group_by_group():
    """vLLM's remove_skipped_blocks frees a group's slid-out blocks latest position first, one
    group after the other: the free queue's eviction order (vLLM's own scheduler, driven by
    bench/diagnostics/vllm_scheduler.py, differs on shared prefixes otherwise)."""
    kvm = _kvm(groups=2)
    a = _req("a", 20)
    assert kvm.allocate_slots(a, 20)
    window = list(kvm.req_to_window_blocks["a"])  # positions 0..4, groups 0 and 1 each
    a.num_computed_tokens = 20
    assert kvm.allocate_slots(a, 1)  # positions 0..2 slide out
    assert kvm.block_pool.free_queue_blocks() == [window[4], window[2], window[0],
                                                  window[5], window[3], window[1]]
    one = KVCacheManager(num_gpu_blocks=20, block_size=4, enable_prefix_caching=False,
                         sliding_window=8, max_step_tokens=8)  # every layer slides
    b = _req("b", 20)
    assert one.allocate_slots(b, 20)
    table = list(one.req_to_blocks["b"])
    b.num_computed_tokens = 20
    assert one.allocate_slots(b, 1)
    assert one.block_pool.free_queue_blocks() == [table[2], table[1], table[0]]


def test_counts_of_what_a_request_holds_at_once():
    kvm = _kvm(groups=3, window=8, step=8)
    # 40 tokens: 10 table blocks + 3 x (cdiv(8 - 1 + 8, 4) + 1 = 5) window blocks
    assert kvm.max_blocks_held(40) == 10 + 3 * 5
    assert kvm.max_blocks_held(6) == 2 + 3 * 2  # shorter than the window: all positions
    assert kvm.blocks_to_grow(40, 0) == 10 + 15
    a = _req("a", 8)
    assert kvm.allocate_slots(a, 8)  # 2 positions
    assert kvm.blocks_to_grow(40, 2, request_id="a") == 8 + (15 - 6)


def test_an_allocation_that_does_not_fit_with_its_window_changes_nothing():
    kvm = _kvm(blocks=9, groups=1)
    a = _req("a", 20)  # 5 + 5 > 9
    assert not kvm.can_allocate(a, 20)
    assert not kvm.allocate_slots(a, 20)
    assert kvm.num_free_blocks == 9 and "a" not in kvm.req_to_window_blocks
    assert kvm.allocate_slots(a, 16)  # 4 + 4
    assert kvm.num_free_blocks == 1


def test_a_forked_child_gets_a_copy_of_the_parents_window():
    kvm = _kvm(blocks=30, groups=1)
    parent = make_request("p", 6, n=2)
    assert kvm.allocate_slots(parent, 6)
    parent.num_computed_tokens = 6
    child = make_request("c", 6)
    copies = kvm.fork(parent, child)  # the partial block and the window's two blocks
    assert len(copies) == 1 + 2
    assert [s for s, _ in copies[1:]] == [b.block_id for b in kvm.req_to_window_blocks["p"]]
    assert kvm.window_first["c"] == kvm.window_first["p"]
    for r in (parent, child):
        kvm.free(r)
    assert kvm.num_free_blocks == 30


def test_groups_refuse_what_they_cannot_serve():
    with pytest.raises(ValueError, match="mixes sliding-window"):
        CacheConfig(num_gpu_blocks=8, sliding_groups=1)
    with pytest.raises(ValueError, match="recompute"):
        CacheConfig(num_gpu_blocks=8, sliding_window=8, sliding_groups=1, num_cpu_blocks=4)
    with pytest.raises(ValueError, match="colocated"):
        Scheduler(SchedulerConfig(role="decode"),
                  CacheConfig(num_gpu_blocks=8, sliding_window=8, sliding_groups=1))
    with pytest.raises(ValueError, match="go together"):
        KVCacheManager(num_gpu_blocks=8, sliding_groups=1)


def test_a_prompt_whose_window_and_table_exceed_the_pool_is_rejected():
    cache = CacheConfig(num_gpu_blocks=12, block_size=4, enable_prefix_caching=False,
                        sliding_window=8, sliding_groups=1)
    sched = Scheduler(SchedulerConfig(max_model_len=64, max_num_batched_tokens=8), cache)
    fits, too_long = make_request("fits", 20), make_request("too_long", 28)  # 5 + 4, 8 + 5
    assert sched.rejection_reason(fits) is None
    assert sched.rejection_reason(too_long) == ("needs 13 KV blocks at once (sliding window 8) "
                                                "for 32 tokens but the whole pool has 12")


knobs = st.fixed_dictionaries({
    "block_size": st.sampled_from([1, 2, 4]),
    "num_gpu_blocks": st.integers(12, 60),
    "groups": st.integers(1, 3),
    "window": st.integers(1, 12),
    "max_num_seqs": st.integers(1, 6),
    "budget": st.integers(4, 40),
    "chunked": st.booleans(),
    "mixed": st.booleans(),
    "caching": st.booleans(),
    "policy": st.sampled_from(["max_utilization", "guaranteed_no_evict", "reserve_ratio"]),
})


class WindowCheck:
    """A scheduler whose every step is checked: each scheduled request holds the sliding
    groups' blocks of every position its new tokens read (keys from position - window + 1)."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    def __getattr__(self, name):
        return getattr(self.sched, name)

    def schedule(self, now):
        out = self.sched.schedule(now)
        kvm = self.sched.kv_cache_manager
        bs, w, g = kvm.block_size, kvm.group_window, kvm.sliding_groups
        for req, before, n in zip(out.reqs, out.num_computed_before, out.num_new_tokens):
            rid = req.request_id
            first = kvm.window_first[rid]
            held = len(kvm.req_to_window_blocks[rid])
            assert held % g == 0
            assert first <= max(0, (before - w + 1) // bs), (rid, first, before)
            assert first + held // g >= -(-(before + n) // bs), (rid, first, held, before, n)
        return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000))
def test_every_request_finishes_the_pool_is_whole_and_no_read_block_is_freed(k, wl, seed):
    cache = CacheConfig(num_gpu_blocks=k["num_gpu_blocks"], block_size=k["block_size"],
                        enable_prefix_caching=k["caching"], sliding_window=k["window"],
                        sliding_groups=k["groups"])
    cfg = SchedulerConfig(max_num_seqs=k["max_num_seqs"],
                          max_num_batched_tokens=k["budget"] + k["block_size"], max_model_len=64,
                          enable_chunked_prefill=k["chunked"], mixed_batches=k["mixed"],
                          capacity_policy=k["policy"])
    sched = Scheduler(cfg, cache)
    reqs = workload_requests(wl, seed, prefix_len=20)
    run(WindowCheck(sched), [r for r in reqs if sched.rejection_reason(r) is None],
        TokenExecutor(seed, True))
    kvm = sched.kv_cache_manager
    assert not kvm.req_to_window_blocks and not kvm.window_first
    assert kvm.num_free_blocks == kvm.num_gpu_blocks
    assert all(b.ref_cnt == 0 for b in kvm.block_pool.blocks if b is not None)
    if k["policy"] == "guaranteed_no_evict":
        assert sched.get_stats()["num_preemptions"] == 0


def test_guaranteed_no_evict_promises_the_window_blocks_too():
    # each request: 8 table blocks at its end + 2 groups x 5 window blocks at once = 18 of 20,
    # so the second waits for the first (its table alone would fit beside it, and then the
    # windows would run the pool dry mid-decode)
    cache = CacheConfig(num_gpu_blocks=20, block_size=4, enable_prefix_caching=False,
                        sliding_window=8, sliding_groups=2)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=8, max_model_len=64,
                                      capacity_policy="guaranteed_no_evict"), cache)
    reqs = [make_request(rid, 16, max_tokens=16) for rid in ("a", "b")]
    trace, _ = run(sched, reqs, TokenExecutor(0, False))
    assert sched.get_stats()["num_preemptions"] == 0
    assert all(r.status.is_finished for r in reqs)
    assert not any({"a", "b"} <= set(ids) for ids, _, _ in trace), "ran side by side"
