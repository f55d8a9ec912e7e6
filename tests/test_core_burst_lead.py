"""Decode bursts led by a step that completes prompts (`simulator.core.decode_burst`): when they
are allowed, their segments, and that they equal stepping one by one."""

from __future__ import annotations

from itertools import accumulate

from simulator.core import CacheConfig, Scheduler, SchedulerConfig, StepResult
from simulator.core.decode_burst import burst_segments
from tests.core_helpers import make_request


def _sched(**kw) -> Scheduler:
    cfg = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)
    cfg.update(kw)
    return Scheduler(SchedulerConfig(**cfg), CacheConfig(num_gpu_blocks=64, block_size=4))


def _running_plus_arrival(sched: Scheduler, prompt: int = 10):
    """One request decoding (its prompt and first token done), then a prompt of `prompt`
    tokens arriving: the step that admits it."""
    sched.add_request(make_request("a", 6, max_tokens=20), 0.0)
    sched.update(sched.schedule(0.0), StepResult(0.01), 0.01)
    sched.add_request(make_request("b", prompt, max_tokens=5, arrival=0.01), 0.01)
    return sched.schedule(0.01)


def test_a_step_completing_a_prompt_leads_a_burst_when_nothing_waits():
    sched = _sched()
    out = _running_plus_arrival(sched)
    assert out.shape.num_prefill_reqs == 1 and out.shape.num_decode_reqs == 1
    k = sched.max_decode_burst(out, 64)
    assert k == 5  # until b reaches max_tokens
    segs = list(burst_segments(out, k))
    assert segs[0] == (out.shape, 1)
    shape, n = segs[1]
    # from step 2 both decode: a's context (incl. the new token) 7 at step 1 and 8 at step 2,
    # b's its 10-token prompt + 1
    assert n == k - 1 and shape.num_prefill_reqs == 0 and shape.num_decode_reqs == 2
    assert shape.decode_context_tokens == 8 + 11


def test_no_lead_when_a_request_waits_or_a_prompt_is_unfinished():
    sched = _sched(max_num_seqs=2)
    out = _running_plus_arrival(sched)
    sched.add_request(make_request("c", 4), 0.01)  # step 2 would still not admit it, but waits
    assert sched.max_decode_burst(out, 64) == 1
    sched = _sched(max_num_batched_tokens=8, enable_chunked_prefill=True)
    out = _running_plus_arrival(sched, prompt=20)  # a 7-token chunk of 20
    assert out.shape.num_prefill_tokens == 7
    assert sched.max_decode_burst(out, 64) == 1


def _drive(max_burst: int) -> list[list[float]]:
    """Arrivals at fixed times, a step of 10 ms + 1 ms per token; token times per request."""
    sched = _sched(max_num_batched_tokens=32, enable_chunked_prefill=True)
    arrivals = [(0.0, make_request("r0", 9, 30)), (0.05, make_request("r1", 17, 12)),
                (0.051, make_request("r2", 40, 8)), (0.3, make_request("r3", 3, 1))]
    reqs = [r for _, r in arrivals]
    now, leads = 0.0, 0
    while sched.has_unfinished_requests() or arrivals:
        while arrivals and arrivals[0][0] <= now:
            sched.add_request(arrivals.pop(0)[1], now)
        if not sched.has_unfinished_requests():
            now = arrivals[0][0]
            continue
        out = sched.schedule(now)
        k = sched.max_decode_burst(out, max_burst) if max_burst > 1 else 1
        durations = [0.01 + 0.001 * shape.num_tokens
                     for shape, n in burst_segments(out, k) for _ in range(n)] if k > 1 else []
        leads += k > 1 and out.shape.num_prefill_reqs > 0
        if k > 1 and arrivals:  # an arrival cuts the burst at the step it lands in
            ends = list(accumulate(durations, initial=now))[1:]
            k = next((j + 1 for j, e in enumerate(ends) if e >= arrivals[0][0]), k)
        if k > 1:
            ends = list(accumulate(durations[:k], initial=now))[1:]
            result, now = StepResult(ends[-1] - now, None, ends), ends[-1]
        else:
            now += 0.01 + 0.001 * out.shape.num_tokens
            result = StepResult(0.0)
        sched.update(out, result, now)
    assert max_burst == 1 or leads >= 2
    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_gpu_blocks
    return [list(r.token_times) for r in reqs]


def test_led_bursts_equal_step_by_step():
    assert _drive(64) == _drive(1)
