"""Capacity policies of the core: `guaranteed_no_evict` reserves each request's whole length at
admission and never preempts; `max_utilization` (the default) is vLLM's admit-and-preempt."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.core import (
    CacheConfig,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    StepResult,
)
from simulator.core.capacity import reserved_blocks
from tests.core_helpers import hand_over, make_engine, make_request, serve_three_at_once
from tests.test_core_properties import TokenExecutor, build, knobs, run, workload

NO_EVICT = "guaranteed_no_evict"


def no_evict(sched: Scheduler) -> Scheduler:
    """A fresh scheduler like `sched` under guaranteed_no_evict."""
    cfg = dataclasses.replace(sched.config, capacity_policy=NO_EVICT)
    return Scheduler(cfg, sched.cache_config)


def reserved(sched: Scheduler) -> int:
    return reserved_blocks(sched.kv_cache_manager, sched.running, sched.waiting_for_kv.values(),
                           sched.config.role)


class CheckedExecutor:
    """Checks, after every schedule(), that nothing was preempted or swapped and that the free
    blocks cover every promise still to be allocated."""

    def __init__(self, sched: Scheduler, inner) -> None:
        self.sched, self.inner = sched, inner
        self.steps = 0

    def execute(self, out: SchedulerOutput) -> StepResult:
        assert not out.preempted_req_ids and not out.blocks_to_swap_out and not out.blocks_to_swap_in
        assert self.sched.kv_cache_manager.num_free_blocks >= reserved(self.sched)
        self.steps += 1
        return self.inner.execute(out)


def test_the_default_is_max_utilization_and_a_bad_policy_is_refused():
    assert SchedulerConfig().capacity_policy == "max_utilization"
    with pytest.raises(ValueError, match=r"scheduler.capacity_policy must be one of "
                       r"\['max_utilization', 'guaranteed_no_evict', 'reserve_ratio'\], "
                       r"got 'never'"):
        SchedulerConfig(capacity_policy="never")


def test_no_evict_waits_where_max_utilization_preempts():
    # 12 blocks of 4 tokens; each request grows to 8 + 16 = 24 tokens = 6 blocks: two fit
    # their whole length, a third only its prompt
    serve = serve_three_at_once
    first, reqs, sched = serve("max_utilization")
    assert first.new_req_ids == ["r0", "r1", "r2"] and sched.num_preemptions > 0
    first, reqs, sched = serve(NO_EVICT)
    assert first.new_req_ids == ["r0", "r1"]  # r2 waits for a whole length to be free
    assert sched.num_preemptions == 0 and all(r.num_preemptions == 0 for r in reqs)
    assert all(r.status == RequestStatus.FINISHED_LENGTH and r.num_output_tokens == 16 for r in reqs)
    assert reqs[2].first_scheduled_time >= reqs[0].finish_time  # admitted once r0 freed its blocks
    assert sched.kv_cache_manager.num_free_blocks == 12


def test_no_evict_counts_prefix_hits_toward_the_prompt():
    # r0 holds a 16-token prompt (4 blocks) and grows to 6 blocks; r1 shares 12 of its tokens
    # (3 full blocks, held by r0: free for r1) and needs 6 - 3 = 3 more blocks: 9 of 10 fit
    eng = make_engine(num_gpu_blocks=10, block_size=4, capacity_policy=NO_EVICT)
    prompt = list(range(16))
    r0 = make_request("r0", prompt, max_tokens=8)
    r1 = make_request("r1", prompt[:12] + [99, 98, 97, 96], max_tokens=8)
    eng.add_request(r0, 0.0)
    out = eng.scheduler.schedule(0.0)
    eng.scheduler.update(out, StepResult(0.01), 0.01)
    eng.add_request(r1, 0.01)
    out = eng.scheduler.schedule(0.01)
    assert out.new_req_ids == ["r1"] and r1.num_cached_tokens == 12
    # without the shared prefix r1 would need 6 blocks; 10 - 6 promised to r0 leaves 4
    eng2 = make_engine(num_gpu_blocks=10, block_size=4, capacity_policy=NO_EVICT)
    eng2.add_request(make_request("r0", prompt, max_tokens=8), 0.0)
    out = eng2.scheduler.schedule(0.0)
    eng2.scheduler.update(out, StepResult(0.01), 0.01)
    eng2.add_request(make_request("r1", [50 + i for i in range(16)], max_tokens=8), 0.01)
    assert eng2.scheduler.schedule(0.01).new_req_ids == []


def test_a_request_longer_than_the_pool_is_rejected_not_left_waiting():
    eng = make_engine(num_gpu_blocks=4, block_size=4, capacity_policy=NO_EVICT)
    big, ok = make_request("big", 10, max_tokens=10), make_request("ok", 6, max_tokens=10)
    eng.add_request(big, 0.0)
    eng.add_request(ok, 0.0)
    eng.run_until_idle()
    assert big.status == RequestStatus.FINISHED_REJECTED
    assert big.stop_reason == "needs 5 KV blocks for 20 tokens but the whole pool has 4"
    assert ok.status == RequestStatus.FINISHED_LENGTH


def test_prefill_worker_reserves_the_prompt_and_decode_worker_the_whole_length():
    prefill = make_engine(num_gpu_blocks=8, block_size=4, role="prefill", capacity_policy=NO_EVICT)
    decode = make_engine(num_gpu_blocks=12, block_size=4, role="decode", capacity_policy=NO_EVICT)
    reqs = [make_request(f"r{i}", 8, max_tokens=16) for i in range(3)]
    for r in reqs:
        prefill.add_request(r, 0.0)
    step = prefill.step(0.0)
    # a prefill worker promises 2 blocks (the prompt) each: all three start
    assert step.scheduler_output.new_req_ids == ["r0", "r1", "r2"]
    for r in step.kv_ready:
        decode.add_request(r, step.end_time)
    out = decode.scheduler.schedule(0.1)
    # a decode worker promises 6 blocks (8 + 16 tokens) each: two of three
    assert [r.request_id for r, _ in out.kv_to_receive] == ["r0", "r1"]
    hand_over(prefill, decode, out, 0.1)
    assert decode.scheduler.num_preemptions == 0
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in reqs)
    assert decode.scheduler.kv_cache_manager.num_free_blocks == 12
    assert prefill.scheduler.kv_cache_manager.num_free_blocks == 8


def _serve_fork(num_gpu_blocks: int):
    """Serve one n=2 request (prompt 9 tokens, max_tokens 7); returns the scheduler, the
    finished requests by id and the time each request id was first scheduled."""
    eng = make_engine(num_gpu_blocks=num_gpu_blocks, block_size=4, capacity_policy=NO_EVICT)
    eng.add_request(make_request("p", list(range(9)), max_tokens=7, n=2), 0.0)
    finished, first = {}, {}
    now = 0.0
    while eng.has_unfinished_requests():
        step = eng.step(now)
        for r in step.scheduled:
            first.setdefault(r.request_id, now)
        finished.update((r.request_id, r) for r in step.finished)
        now = step.end_time
    return eng.scheduler, finished, first


def test_a_child_that_does_not_fit_at_the_fork_waits_and_reuses_the_prompt():
    # 16 tokens = 4 blocks each; the fork (at 8 tokens) shares 2 full blocks, so the child
    # needs 2 more: with 6 blocks both run together
    sched, finished, first = _serve_fork(6)
    assert set(finished) == {"p", "1_p"} and sched.num_preemptions == 0
    assert first["1_p"] < finished["p"].finish_time
    # with 5 the child waits for the parent, then finds the prompt's 2 blocks cached
    sched, finished, first = _serve_fork(5)
    assert set(finished) == {"p", "1_p"} and sched.num_preemptions == 0
    assert first["1_p"] >= finished["p"].finish_time
    assert sched.kv_cache_manager.prefix_hit_tokens == 8
    assert all(r.status == RequestStatus.FINISHED_LENGTH and r.num_output_tokens == 7
               for r in finished.values())
    assert sched.kv_cache_manager.num_free_blocks == 5


# ------------------------------------------------------------------ properties
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000), st.booleans(), st.sampled_from([1, 64]))
def test_no_evict_never_preempts_never_deadlocks_and_finishes_everyone(k, wl, seed, ids, burst):
    sched = no_evict(build(k, wl, seed)[0])
    _, reqs = build(k, wl, seed)
    executor = CheckedExecutor(sched, TokenExecutor(seed, ids))
    run(sched, reqs, executor, max_burst=burst, check=burst == 1)
    kvm = sched.kv_cache_manager
    assert sched.num_preemptions == 0 and kvm.num_swapped_out_blocks == 0
    assert kvm.num_free_blocks == kvm.num_gpu_blocks
    assert not sched.running and not sched.waiting and not sched.requests
    bs, pool = k["block_size"], k["num_gpu_blocks"]
    for r in reqs:
        assert r.status.is_finished and r.num_preemptions == 0
        total = r.num_prompt_tokens + r.max_tokens
        # blocks a request never holds: the watermark, or one every append wants free
        kept = max(int(k["watermark"] * pool), 1 if k["append_reserve"] else 0)
        never_fits = total > sched.config.max_model_len or -(-total // bs) > pool - kept or (
            not k["chunked"] and r.num_prompt_tokens > sched.config.max_num_batched_tokens)
        assert (r.status == RequestStatus.FINISHED_REJECTED) == never_fits, r
        if never_fits:
            assert r.stop_reason  # says why


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000), st.sampled_from([NO_EVICT, "reserve_ratio"]))
def test_each_policy_gives_the_same_schedule_for_the_same_seed(k, wl, seed, policy):
    def once():
        base = build(k, wl, seed)[0]
        cfg = dataclasses.replace(base.config, capacity_policy=policy)
        return run(Scheduler(cfg, base.cache_config), build(k, wl, seed)[1], TokenExecutor(seed, True))

    assert once() == once()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(1, 12)), min_size=1, max_size=10),
    st.integers(8, 24),  # prefill pool, blocks
    st.integers(8, 24),  # decode pool, blocks
    st.booleans(),  # prefix caching
)
def test_pd_workers_under_no_evict_finish_everyone_without_preempting(wl, pre_blocks, dec_blocks, caching):
    def engine(role: str, blocks: int):
        sched = Scheduler(
            SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64, role=role,
                            capacity_policy=NO_EVICT),
            CacheConfig(num_gpu_blocks=blocks, block_size=4, enable_prefix_caching=caching),
        )
        return sched

    pre, dec = engine("prefill", pre_blocks), engine("decode", dec_blocks)
    reqs = [make_request(f"r{i}", list(range(i % 3, i % 3 + p)), max_tokens=m)
            for i, (p, m) in enumerate(wl)]
    for r in reqs:
        pre.add_request(r, 0.0)
    now = 0.0
    for _ in range(5000):
        if not (pre.has_unfinished_requests() or dec.has_unfinished_requests()):
            break
        out = pre.schedule(now)
        assert reserved(pre) <= pre.kv_cache_manager.num_free_blocks
        pre.update(out, StepResult(0.01), now + 0.01)
        for r in pre.pop_kv_ready():
            dec.add_request(r, now + 0.01)
            if r.status == RequestStatus.FINISHED_REJECTED:  # the decode pool is too small
                pre.release_transferred(r.request_id)
        out = dec.schedule(now)
        assert reserved(dec) <= dec.kv_cache_manager.num_free_blocks
        for r, _ in out.kv_to_receive:  # instant transfer
            pre.release_transferred(r.request_id)
            dec.on_kv_received(r.request_id)
        dec.update(out, StepResult(0.01), now + 0.01)
        now += 0.01
    else:
        raise AssertionError("did not finish")
    assert pre.num_preemptions == 0 and dec.num_preemptions == 0
    assert all(r.status.is_finished for r in reqs)
    assert pre.kv_cache_manager.num_free_blocks == pre_blocks
    assert dec.kv_cache_manager.num_free_blocks == dec_blocks
