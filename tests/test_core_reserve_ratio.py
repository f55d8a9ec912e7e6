"""`capacity_policy: reserve_ratio`, SGLang's admission: a waiting request needs its prompt and
output budget below the free blocks less a decaying share (`new_token_ratio`) of the running
requests' remaining outputs; running requests grow and are preempted as under
max_utilization; the ratio decays per decoding step and is re-estimated after a preemption."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.core import RequestStatus, Scheduler, StepResult
from simulator.core.capacity import (
    RATIO_DECAY,
    RATIO_INIT,
    RATIO_MIN,
    RETRACT_DECODE_STEPS,
)
from tests.core_helpers import make_engine, make_request, serve_three_at_once
from tests.test_core_properties import TokenExecutor, build, knobs, run, workload


def by_ratio(sched: Scheduler) -> Scheduler:
    cfg = dataclasses.replace(sched.config, capacity_policy="reserve_ratio")
    return Scheduler(cfg, sched.cache_config)


def test_admission_keeps_room_for_the_outputs_and_everyone_finishes():
    """12 blocks of 4 tokens; requests of 8 prompt + 16 output tokens (6 blocks each).
    max_utilization admits all three at once; reserve_ratio admits r0 (6 < 12 free), then not
    r1 (6 >= 12 - 6 promised to r0), as SGLang's PrefillAdder would."""
    serve = serve_three_at_once
    first, reqs, sched = serve("max_utilization")
    assert first.new_req_ids == ["r0", "r1", "r2"] and sched.num_preemptions > 0
    first, reqs, sched = serve("reserve_ratio")
    assert first.new_req_ids == ["r0"]
    assert all(r.status == RequestStatus.FINISHED_LENGTH and r.num_output_tokens == 16 for r in reqs)


def test_the_ratio_decays_once_per_decoding_step():
    eng = make_engine(num_gpu_blocks=64, block_size=4, capacity_policy="reserve_ratio")
    sched = eng.scheduler
    eng.add_request(make_request("a", 8, max_tokens=50), 0.0)
    out = sched.schedule(0.0)  # the prompt alone: no decode, no decay
    assert sched.new_token_ratio == RATIO_INIT
    sched.update(out, StepResult(0.01), 0.01)
    want = RATIO_INIT
    for i in range(5):
        out = sched.schedule(0.01 * (i + 2))
        sched.update(out, StepResult(0.01), 0.01 * (i + 2))
        want = max(want - RATIO_DECAY, RATIO_MIN)
        assert sched.new_token_ratio == want


class RatioChecked:
    """After every schedule(): a preemption re-estimated the ratio from the requests left
    running, (their outputs + 20 x their count) / (their max_tokens + 1), at most 1."""

    def __init__(self, sched: Scheduler, inner) -> None:
        self.sched, self.inner, self.preempting_steps = sched, inner, 0

    def execute(self, out):
        if out.preempted_req_ids:
            self.preempting_steps += 1
            left = [r for r in self.sched.running if r.status == RequestStatus.RUNNING]
            decoded = sum(r.num_output_tokens for r in left)
            budget = sum(r.max_tokens for r in left)
            assert self.sched.new_token_ratio == min(
                1.0, (decoded + RETRACT_DECODE_STEPS * len(left)) / (budget + 1))
        return self.inner.execute(out)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000), st.booleans())
def test_every_request_finishes_and_the_pool_is_whole_again(k, wl, seed, ids):
    sched = by_ratio(build(k, wl, seed)[0])
    _, reqs = build(k, wl, seed)
    run(sched, reqs, RatioChecked(sched, TokenExecutor(seed, ids)))
    kvm = sched.kv_cache_manager
    assert kvm.num_free_blocks == kvm.num_gpu_blocks
    assert not sched.running and not sched.waiting and not sched.requests
    assert all(r.status.is_finished for r in reqs)
    assert RATIO_MIN <= sched.new_token_ratio <= 1.0


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000))
def test_decode_bursts_give_identical_timestamps_and_ratio(k, wl, seed):
    """A burst decays the ratio once per step it ran, exactly as step by step."""
    s1, r1 = by_ratio(build(k, wl, seed)[0]), build(k, wl, seed)[1]
    run(s1, r1, TokenExecutor(seed, False), max_burst=1)
    s2, r2 = by_ratio(build(k, wl, seed)[0]), build(k, wl, seed)[1]
    run(s2, r2, TokenExecutor(seed, False), max_burst=64, check=False)
    for a, b in zip(r1, r2):
        assert a.status == b.status and list(a.token_times) == list(b.token_times)
        assert a.num_preemptions == b.num_preemptions
    assert s1.new_token_ratio == s2.new_token_ratio


def _second_admission(ignore_eos: bool, caching: bool = False, r1_output: int = 12) -> list[str]:
    """14 blocks of 4 tokens. r0 (8 prompt + 40 output) runs alone for a step; then r1 (8 +
    `r1_output`) arrives. Returns the requests the second step admits."""
    eng = make_engine(num_gpu_blocks=14, block_size=4, capacity_policy="reserve_ratio",
                      enable_prefix_caching=caching)
    sched = eng.scheduler
    eng.add_request(make_request("r0", 8, max_tokens=40, ignore_eos=ignore_eos), 0.0)
    out = sched.schedule(0.0)
    sched.update(out, StepResult(0.01), 0.01)
    eng.add_request(make_request("r1", list(range(100, 108)), max_tokens=r1_output,
                                 ignore_eos=ignore_eos), 0.01)
    return sched.schedule(0.01).new_req_ids


def test_an_ignore_eos_request_is_admitted_when_everyone_can_finish():
    """SGLang's PrefillAdder.add_one_req_ignore_eos (radix cache off). In the second step r0
    holds 3 blocks (9 tokens), 11 are free and the ratio keeps ceil(0.7 x 39 / 4) = 7 for r0's
    output. The budget test refuses r1: its 8 + 12 tokens take 5 blocks >= 11 - 7. The
    ignore-EOS test admits it: its prompt takes 2 <= 11 - 7 blocks, leaving 36 free tokens;
    by tokens left (plus 3 for 4-token blocks), r1 (12 + 3) finishing first needs
    36 - 15 x 2 = 6 > 2 free, and r0 (39 + 3) then 36 + 8 freed - 42 = 2 > 1."""
    assert _second_admission(ignore_eos=False) == []
    assert _second_admission(ignore_eos=True) == ["r1"]
    # r1 for 30 tokens: 36 - 33 x 2 < 2, refused
    assert _second_admission(ignore_eos=True, r1_output=30) == []
    # with prefix caching (SGLang's radix cache) on, the flag changes nothing
    assert _second_admission(ignore_eos=True, caching=True) == []


ignore_eos_workload = st.lists(
    st.tuples(st.integers(1, 30), st.integers(1, 40), st.floats(0, 0.2)), min_size=1, max_size=14)


def _ignore_eos_run(wl, bs, blocks, chunked, seqs, seed, *, ignore_eos=True, caching=False):
    from simulator.core import CacheConfig, SchedulerConfig

    cfg = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=32, max_model_len=128,
                          enable_chunked_prefill=chunked, capacity_policy="reserve_ratio")
    sched = Scheduler(cfg, CacheConfig(num_gpu_blocks=blocks, block_size=bs,
                                       enable_prefix_caching=caching))
    now, reqs = 0.0, []
    for i, (p, m, gap) in enumerate(wl):
        now += gap
        reqs.append(make_request(f"r{i}", list(range(i % 3, i % 3 + p)), max_tokens=m,
                                 arrival=now, ignore_eos=ignore_eos))
    trace = run(sched, reqs, TokenExecutor(seed, False))
    return sched, reqs, trace


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ignore_eos_workload, st.sampled_from([1, 2, 4, 8, 16]), st.integers(8, 60), st.booleans(),
       st.integers(1, 8), st.integers(0, 1000))
def test_ignore_eos_admission_never_preempts_and_everyone_finishes(wl, bs, blocks, chunked,
                                                                    seqs, seed):
    """Requests that surely run to max_tokens, admitted only when every running request can
    finish: none is ever preempted, all finish, the pool is whole again, at any block size."""
    sched, reqs, _ = _ignore_eos_run(wl, bs, blocks, chunked, seqs, seed)
    assert sched.num_preemptions == 0
    assert all(r.status.is_finished and r.num_preemptions == 0 for r in reqs)
    kvm = sched.kv_cache_manager
    assert kvm.num_free_blocks == kvm.num_gpu_blocks and not sched.requests


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ignore_eos_workload, st.sampled_from([1, 4, 16]), st.integers(8, 60), st.booleans(),
       st.integers(1, 8), st.integers(0, 1000))
def test_with_prefix_caching_ignore_eos_changes_nothing(wl, bs, blocks, chunked, seqs, seed):
    """SGLang takes the ignore-EOS path only without its radix cache: with prefix caching on,
    the same workload with and without the flag gives the same schedule."""
    a = _ignore_eos_run(wl, bs, blocks, chunked, seqs, seed, ignore_eos=True, caching=True)[2]
    b = _ignore_eos_run(wl, bs, blocks, chunked, seqs, seed, ignore_eos=False, caching=True)[2]
    assert a == b


def test_conservativeness_scales_the_ratio_and_an_idle_engine_starts_it_over():
    """SGLang: init = min(0.7 c, 1), floor = 0.14 init, (init - floor) / 600 per decoding step;
    self_check_during_idle puts it back to init."""
    from simulator.core.capacity import reserve_ratios

    init, floor, decay = reserve_ratios(0.3)
    assert (init, floor) == (pytest.approx(0.21), pytest.approx(0.21 * 0.14))
    assert decay == pytest.approx((init - floor) / 600)
    assert reserve_ratios(2.0)[0] == 1.0  # capped
    eng = make_engine(num_gpu_blocks=64, block_size=4, capacity_policy="reserve_ratio",
                      schedule_conservativeness=0.3)
    sched = eng.scheduler
    assert sched.new_token_ratio == pytest.approx(0.21)
    eng.add_request(make_request("a", 8, max_tokens=6), 0.0)
    out = sched.schedule(0.0)
    sched.update(out, StepResult(0.01), 0.01)
    out = sched.schedule(0.01)
    sched.update(out, StepResult(0.01), 0.02)
    assert sched.new_token_ratio == pytest.approx(0.21 - decay)
    eng.run_until_idle(0.02)
    assert not sched.running and sched.new_token_ratio == pytest.approx(0.21)
    with pytest.raises(ValueError, match="scheduler.schedule_conservativeness must be > 0"):
        make_engine(capacity_policy="reserve_ratio", schedule_conservativeness=0.0)
