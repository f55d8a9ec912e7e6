"""A request's recurrent-state blocks (`state_blocks`, linear-attention models) in the shared
core: taken once with its first allocation, counted by every admission check, returned at
its end, and the pool whole again after random workloads under every capacity policy."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from simulator.core import CacheConfig, KVCacheManager, Request, Scheduler, SchedulerConfig
from tests.core_helpers import make_request, workload_requests
from tests.test_core_properties import TokenExecutor, run


def _req(rid: str, n: int) -> Request:
    return Request(rid, prompt_token_ids=list(range(n)))


def test_state_is_taken_with_the_first_allocation_and_returned_by_free():
    kvm = KVCacheManager(num_gpu_blocks=10, block_size=4, enable_prefix_caching=False,
                         state_blocks=3)
    a = _req("a", 6)
    assert kvm.blocks_to_grow(6, 0) == 2 + 3 and kvm.max_blocks_held(6) == 5
    assert kvm.can_allocate(a, 6)
    assert kvm.allocate_slots(a, 6)
    assert kvm.num_free_blocks == 10 - 2 - 3 and kvm.num_real_blocks("a") == 2
    a.num_computed_tokens = 6
    assert kvm.blocks_to_grow(9, 2) == 1  # (it holds its state already)
    assert kvm.allocate_slots(a, 3)  # a third block, no second state
    assert kvm.num_free_blocks == 4
    kvm.free(a)
    assert kvm.num_free_blocks == 10 and not kvm.req_to_state_blocks


def test_an_allocation_that_does_not_fit_with_its_state_changes_nothing():
    kvm = KVCacheManager(num_gpu_blocks=6, block_size=4, enable_prefix_caching=False,
                         state_blocks=3)
    a = _req("a", 16)  # 4 blocks + 3 of state > 6
    assert not kvm.can_allocate(a, 16)
    assert not kvm.allocate_slots(a, 16)
    assert kvm.num_free_blocks == 6 and "a" not in kvm.req_to_state_blocks
    assert kvm.allocate_slots(a, 8)  # 2 blocks + 3 of state
    assert kvm.num_free_blocks == 1


def test_a_forked_child_gets_a_copy_of_the_parents_state():
    kvm = KVCacheManager(num_gpu_blocks=12, block_size=4, enable_prefix_caching=False,
                         state_blocks=2)
    parent = make_request("p", 6, n=2)
    assert kvm.allocate_slots(parent, 6)
    parent.num_computed_tokens = 6
    child = make_request("c", 6)
    copies = kvm.fork(parent, child)  # one shared full block, the partial one and the state
    assert len(copies) == 1 + 2
    assert [s for s, _ in copies[1:]] == [b.block_id for b in kvm.req_to_state_blocks["p"]]
    assert kvm.num_free_blocks == 12 - (2 + 2) - (1 + 2)
    for r in (parent, child):
        kvm.free(r)
    assert kvm.num_free_blocks == 12


def test_state_refuses_prefix_caching_and_swapping():
    with pytest.raises(ValueError, match="enable_prefix_caching false"):
        CacheConfig(num_gpu_blocks=8, state_blocks=2)
    with pytest.raises(ValueError, match="recompute"):
        CacheConfig(num_gpu_blocks=8, state_blocks=2, enable_prefix_caching=False,
                    num_cpu_blocks=4)


def test_a_prompt_whose_state_and_blocks_exceed_the_pool_is_rejected():
    cache = CacheConfig(num_gpu_blocks=10, block_size=4, enable_prefix_caching=False,
                        state_blocks=3)
    sched = Scheduler(SchedulerConfig(max_model_len=64), cache)
    fits, too_long = (make_request("fits", 12), make_request("too_long", 28))  # 4 + 3, 8 + 3
    assert sched.rejection_reason(fits) is None
    assert sched.rejection_reason(too_long) == ("needs 11 KV blocks for 32 tokens (3 of them its "
                                                "linear-attention state) but the whole pool has 10")


knobs = st.fixed_dictionaries({
    "block_size": st.sampled_from([1, 2, 4]),
    "num_gpu_blocks": st.integers(8, 40),
    "state_blocks": st.integers(1, 4),
    "max_num_seqs": st.integers(1, 6),
    "budget": st.integers(4, 40),
    "chunked": st.booleans(),
    "mixed": st.booleans(),
    "policy": st.sampled_from(["max_utilization", "guaranteed_no_evict", "reserve_ratio"]),
})
workload = st.lists(st.tuples(st.integers(1, 30), st.integers(1, 10), st.integers(0, 3),
                              st.floats(0, 0.2), st.sampled_from([1, 1, 2]), st.integers(0, 1)),
                    min_size=1, max_size=12)


# a parallel-sampling child forked under guaranteed_no_evict took a state it was never
# promised (its blocks were shared, so the promise counted no state) and found no block
FORK_KNOBS = {"block_size": 1, "num_gpu_blocks": 9, "state_blocks": 3, "max_num_seqs": 1,
              "budget": 4, "chunked": False, "mixed": False, "policy": "guaranteed_no_evict"}
FORK_WORKLOAD = [(1, 1, 0, 0.0, 1, 0)] * 7 + [(3, 1, 0, 0.0, 2, 0)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000))
@example(FORK_KNOBS, FORK_WORKLOAD, 0)
def test_every_request_finishes_and_the_pool_is_whole_with_state_blocks(k, wl, seed):
    cache = CacheConfig(num_gpu_blocks=k["num_gpu_blocks"], block_size=k["block_size"],
                        enable_prefix_caching=False, state_blocks=k["state_blocks"])
    cfg = SchedulerConfig(max_num_seqs=k["max_num_seqs"],
                          max_num_batched_tokens=k["budget"] + k["block_size"], max_model_len=64,
                          enable_chunked_prefill=k["chunked"], mixed_batches=k["mixed"],
                          capacity_policy=k["policy"])
    sched = Scheduler(cfg, cache)
    reqs = workload_requests(wl, seed, prefix_len=20)
    run(sched, reqs, TokenExecutor(seed, True))
    kvm = sched.kv_cache_manager
    assert kvm.num_free_blocks == kvm.num_gpu_blocks and not kvm.req_to_state_blocks
    assert all(r.status.is_finished for r in reqs)
    if k["policy"] == "guaranteed_no_evict":
        assert sched.get_stats()["num_preemptions"] == 0
