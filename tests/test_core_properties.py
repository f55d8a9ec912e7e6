"""Property-based tests of the core over random workloads and tiny random pools."""

from __future__ import annotations

import random
from itertools import accumulate

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from simulator.core import (
    CacheConfig,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    StepResult,
)
from simulator.core.decode_burst import burst_segments
from tests.core_helpers import workload_requests

knobs = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 2, 4, 8]),
        "num_gpu_blocks": st.integers(4, 40),
        "num_cpu_blocks": st.integers(0, 40),
        "budget_blocks": st.integers(1, 8),
        "max_num_seqs": st.integers(1, 6),
        "chunked": st.booleans(),
        "threshold": st.sampled_from([0, 0, 3, 7]),
        "swap": st.booleans(),
        "policy": st.sampled_from(["fcfs", "priority"]),
        "batching": st.sampled_from(["continuous", "continuous", "static"]),
        "caching": st.booleans(),
        "mixed": st.booleans(),
        "first_token": st.sampled_from([False, False, True]),
        # vLLM V0's block manager: whole-prompt allocation at admission, a watermark
        "whole_prompt": st.sampled_from([False, False, True]),
        "watermark": st.sampled_from([0.0, 0.0, 0.1]),
        "append_reserve": st.sampled_from([False, False, True]),
        # SGLang's --scheduler-recv-interval: arrivals taken in every N-th decoding step
        "recv_interval": st.sampled_from([1, 1, 1, 2, 5]),
        # TensorRT-LLM's batch waiting (timeout steps, token ratio): mixed batches only
        "batch_wait": st.sampled_from([(0, 0.0), (0, 0.0), (0, 0.0), (2, 0.5), (4, 0.9)]),
    }
)
workload = st.lists(
    st.tuples(
        st.integers(1, 40),  # prompt length
        st.integers(1, 12),  # max tokens
        st.integers(0, 3),  # shared-prefix family
        st.floats(0, 0.2),  # arrival gap (s)
        st.sampled_from([1, 1, 1, 2, 3]),  # n
        st.integers(0, 2),  # priority
    ),
    min_size=1,
    max_size=14,
)


def build(k, wl, seed):
    cache = CacheConfig(
        num_gpu_blocks=k["num_gpu_blocks"],
        block_size=k["block_size"],
        num_cpu_blocks=k["num_cpu_blocks"] if k["swap"] else 0,
        enable_prefix_caching=k["caching"],
    )
    cfg = SchedulerConfig(
        max_num_seqs=k["max_num_seqs"],
        max_num_batched_tokens=k["budget_blocks"] * 8 + k["block_size"],
        max_model_len=64,
        enable_chunked_prefill=k["chunked"],
        long_prefill_token_threshold=k["threshold"],
        preemption_mode="swap" if k["swap"] and k["num_cpu_blocks"] else "recompute",
        policy=k["policy"],
        batching=k["batching"],
        mixed_batches=k["mixed"],
        first_token_from_decode=k["first_token"],
        prompt_allocation="whole_prompt" if k.get("whole_prompt") else "per_chunk",
        admission_watermark=k.get("watermark", 0.0),
        append_needs_free_block=k.get("append_reserve", False),
        recv_interval=k.get("recv_interval", 1),
        batch_wait_timeout_iters=k.get("batch_wait", (0, 0.0))[0] if k["mixed"] else 0,
        batch_wait_max_tokens_ratio=k.get("batch_wait", (0, 0.0))[1] if k["mixed"] else 0.0,
    )
    return Scheduler(cfg, cache), workload_requests(wl, seed, prefix_len=30)


class TokenExecutor:
    """Deterministic pseudo-random tokens (so stop tokens happen), fixed step time."""

    def __init__(self, seed: int, ids: bool) -> None:
        self.rng = random.Random(seed)
        self.ids = ids

    def execute(self, out: SchedulerOutput) -> StepResult:
        toks = [self.rng.randrange(6) for _ in out.reqs] if self.ids else None
        return StepResult(0.01 + 0.001 * out.shape.num_tokens, toks)


def run(sched, reqs, executor, max_burst=1, check=True):
    """Drive the scheduler with virtual time; returns the schedule trace."""
    kvm = sched.kv_cache_manager
    cfg = sched.config
    pending = list(reqs)
    now, trace, all_reqs = 0.0, [], {}
    admitted_order = []
    for _ in range(20000):
        while pending and pending[0].arrival_time <= now:
            r = pending.pop(0)
            sched.add_request(r, now)
        if not sched.has_unfinished_requests():
            if not pending:
                break
            now = pending[0].arrival_time
            continue
        out = sched.schedule(now)
        for r in out.reqs:
            all_reqs[r.request_id] = r
        admitted_order += [rid for rid in out.new_req_ids if "_" not in rid and rid not in admitted_order]
        if check:
            assert out.shape.num_tokens <= cfg.max_num_batched_tokens
            assert len(out.reqs) <= cfg.max_num_seqs or any("_" in r.request_id for r in out.reqs)
            assert all(b.ref_cnt >= 0 for b in kvm.block_pool.blocks if b is not None)
            if not cfg.mixed_batches:  # running decodes wait while prompts (or resumes) run
                new = set(out.new_req_ids)
                # a decode: one token that samples, of a request that has sampled before (a
                # one-token chunk short of the end is prompt work: first_token_from_decode)
                kinds = {not (n == 1 and before + n == r.num_tokens and r.num_output_tokens > 0
                              and r.request_id not in new)
                         for r, before, n in zip(out.reqs, out.num_computed_before,
                                                 out.num_new_tokens)}
                assert len(kinds) <= 1, (out.num_new_tokens, [r.num_output_tokens for r in out.reqs])
            if cfg.first_token_from_decode:  # a token is sampled only by a one-token pass
                assert all(q == 1 for r, before, q in zip(out.reqs, out.num_computed_before,
                                                        out.num_new_tokens)
                           if before + q == r.num_tokens), out.num_new_tokens
            bs = kvm.block_size
            for r, ids, before, q in zip(out.reqs, out.block_ids, out.num_computed_before, out.num_new_tokens):
                assert len(ids) * bs >= before + q
                for j in range((before + q) // bs):  # every cached block holds this request's tokens
                    blk = kvm.block_pool.blocks[ids[j]]
                    if blk.token_ids is not None:
                        assert list(blk.token_ids) == r.token_ids_slice(j * bs, (j + 1) * bs)
        result = executor.execute(out)
        k = sched.max_decode_burst(out, max_burst) if max_burst > 1 else 1
        if k > 1:  # each run of the burst at its own batch shape (past finishes: it shrinks)
            durations = [0.01 + 0.001 * shape.num_tokens
                         for shape, n in burst_segments(out, k) for _ in range(n)]
        if k > 1 and pending:  # an arrival ends the burst at the step it lands in
            ends = list(accumulate(durations, initial=now))[1:]
            k = next((j + 1 for j, e in enumerate(ends) if e >= pending[0].arrival_time), k)
        if k > 1:
            ends = list(accumulate(durations[:k], initial=now))[1:]
            result = StepResult(ends[-1] - now, None, ends)
            end = ends[-1]
        else:
            end = now + result.duration_s
        finished = sched.update(out, result, end)
        trace.append((tuple(r.request_id for r in out.reqs), tuple(out.num_new_tokens), len(finished)))
        now = end
    else:
        raise AssertionError("did not finish")
    for r in reqs:  # every served parent forked its n - 1 children, and they finished
        n = r.sampling_params.n
        if n > 1 and r.status != RequestStatus.FINISHED_REJECTED:
            assert r.num_forked == n - 1, (r.request_id, r.num_forked, n)
            for i in range(1, n):
                child = all_reqs.get(f"{i}_{r.request_id}")
                assert child is not None and child.status.is_finished, (r.request_id, i)
    return trace, admitted_order


# prompts in steps of their own, a running prompt's next chunk finding no block free (every
# append wants one): it preempted itself in a step of no work, was readmitted, and did so again
# (6,664 times), while the decodes that would free blocks never got a step
LIVELOCK_KNOBS = {"block_size": 4, "num_gpu_blocks": 12, "num_cpu_blocks": 0, "budget_blocks": 2,
                  "max_num_seqs": 5, "chunked": False, "threshold": 7, "swap": False,
                  "policy": "fcfs", "batching": "continuous", "caching": False, "mixed": False,
                  "first_token": False, "whole_prompt": False, "watermark": 0.0,
                  "append_reserve": True, "recv_interval": 1}
LIVELOCK_WORKLOAD = [(1, 1, 0, 0.0, 1, 0), (1, 1, 0, 0.0, 1, 0), (12, 7, 0, 0.0, 1, 0),
                     (1, 4, 0, 0.0625, 1, 0), (1, 4, 0, 0.0, 2, 0), (14, 3, 0, 0.0, 1, 0)]


# a parallel-sampling parent swapped out before its fork point resumed with its whole
# remaining prompt in one step, past the fork point, so it never forked: its n - 1 children
# were silently lost (the real executor returned one sequence for n = 2; a fuzz found it)
FORK_SWAP_KNOBS = {**LIVELOCK_KNOBS, "block_size": 2, "num_gpu_blocks": 13, "num_cpu_blocks": 1,
                   "budget_blocks": 3, "max_num_seqs": 2, "chunked": True, "threshold": 0,
                   "swap": True, "mixed": True, "append_reserve": False, "batch_wait": (0, 0.0)}
FORK_SWAP_WORKLOAD = [(24, 2, 0, 0.0, 1, 0), (4, 1, 0, 0.0, 2, 0)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000), st.booleans())
@example(LIVELOCK_KNOBS, LIVELOCK_WORKLOAD, 0, False)
@example(FORK_SWAP_KNOBS, FORK_SWAP_WORKLOAD, 0, True)
def test_every_request_finishes_and_pool_is_whole_again(k, wl, seed, ids):
    sched, reqs = build(k, wl, seed)
    run(sched, reqs, TokenExecutor(seed, ids))
    kvm = sched.kv_cache_manager
    assert kvm.num_free_blocks == kvm.num_gpu_blocks
    assert len(kvm.free_cpu_blocks) == kvm.num_cpu_blocks
    for r in reqs:
        assert r.status.is_finished, r
        assert r.num_output_tokens <= r.max_tokens
        if r.status != RequestStatus.FINISHED_REJECTED:
            assert r.num_output_tokens >= 1 and len(r.token_times) == r.num_output_tokens
            assert r.first_token_time >= r.arrival_time
    assert not sched.running and not sched.waiting and not sched.requests


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000))
def test_same_seed_gives_the_same_schedule_step_for_step(k, wl, seed):
    t1 = run(*build(k, wl, seed), TokenExecutor(seed, True))
    t2 = run(*build(k, wl, seed), TokenExecutor(seed, True))
    assert t1 == t2


# a whole-prompt request swapped out mid-prompt holds host blocks beyond its computed tokens:
# the swap-in check counted only those, and the swap-in then found too few device blocks
SWAP_IN_KNOBS = {**LIVELOCK_KNOBS, "block_size": 2, "num_gpu_blocks": 14, "num_cpu_blocks": 8,
                 "budget_blocks": 2, "max_num_seqs": 3, "threshold": 3, "swap": True,
                 "mixed": True, "first_token": True, "whole_prompt": True,
                 "append_reserve": False, "batch_wait": (0, 0.0)}
SWAP_IN_WORKLOAD = [(1, 1, 0, 0.0, 1, 0), (3, 6, 0, 0.0, 2, 0), (15, 1, 0, 0.03125, 1, 0)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000))
@example(SWAP_IN_KNOBS, SWAP_IN_WORKLOAD, 0)
def test_fcfs_admits_in_arrival_order(k, wl, seed):
    k = dict(k, policy="fcfs")
    sched, reqs = build(k, wl, seed)
    _, admitted = run(sched, reqs, TokenExecutor(seed, False))
    served = [r.request_id for r in reqs if r.status != RequestStatus.FINISHED_REJECTED]
    assert admitted == served


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000))
def test_decode_bursts_give_identical_timestamps(k, wl, seed):
    s1, r1 = build(k, wl, seed)
    run(s1, r1, TokenExecutor(seed, False), max_burst=1)
    s2, r2 = build(k, wl, seed)
    run(s2, r2, TokenExecutor(seed, False), max_burst=64, check=False)
    for a, b in zip(r1, r2):
        assert a.status == b.status and a.num_output_tokens == b.num_output_tokens
        assert list(a.token_times) == list(b.token_times)
        assert a.num_preemptions == b.num_preemptions
    assert s2.kv_cache_manager.num_free_blocks == s2.kv_cache_manager.num_gpu_blocks
    assert s2.kv_cache_manager.peak_usage == s1.kv_cache_manager.peak_usage


# prompts in steps of their own: a forked request's one-token last prompt chunk looked like a
# decode, so a burst ran past the step at which the blocks it had been promised let a waiting
# request in
PROMISE_KNOBS = {**LIVELOCK_KNOBS, "block_size": 2, "num_gpu_blocks": 12, "max_num_seqs": 3,
                 "threshold": 0, "policy": "priority", "append_reserve": False}
PROMISE_WORKLOAD = [(1, 1, 0, 0.0, 1, 0), (12, 6, 0, 0.0, 1, 0), (5, 3, 0, 0.046875, 1, 0),
                    (17, 1, 0, 0.0, 1, 1), (3, 2, 0, 0.0, 2, 0)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000))
@example(PROMISE_KNOBS, PROMISE_WORKLOAD, 0)
def test_decode_bursts_past_finishes_give_identical_timestamps(k, wl, seed):
    """With nothing waiting a burst runs on past finishing requests (their blocks freed after
    their last step): timestamps, finish times, preemptions and peak KV equal step by step."""
    s1, r1 = build(k, wl, seed)
    run(s1, r1, TokenExecutor(seed, False), max_burst=1)
    s2, r2 = build(k, wl, seed)
    s2.burst_past_finishes = True
    trace, _ = run(s2, r2, TokenExecutor(seed, False), max_burst=64, check=False)
    for a, b in zip(r1, r2):
        assert a.status == b.status and a.num_output_tokens == b.num_output_tokens
        assert list(a.token_times) == list(b.token_times)
        assert a.finish_time == b.finish_time
        assert a.num_preemptions == b.num_preemptions
    assert s2.kv_cache_manager.num_free_blocks == s2.kv_cache_manager.num_gpu_blocks
    assert s2.kv_cache_manager.peak_usage == s1.kv_cache_manager.peak_usage
