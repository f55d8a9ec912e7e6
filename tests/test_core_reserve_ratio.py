"""`capacity_policy: reserve_ratio`, SGLang's admission: a waiting request needs its prompt and
output budget below the free blocks less a decaying share (`new_token_ratio`) of the running
requests' remaining outputs; running requests grow and are preempted as under
max_utilization; the ratio decays per decoding step and is re-estimated after a preemption."""

from __future__ import annotations

import dataclasses

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
