"""Helpers for driving the core in tests with virtual time."""

from __future__ import annotations

from simulator.core import (
    CacheConfig,
    EngineCore,
    IdealExecutor,
    Request,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    StepResult,
)


def make_engine(
    num_gpu_blocks: int = 64,
    block_size: int = 4,
    executor=None,
    **sched_kwargs,
) -> EngineCore:
    cache_keys = {"num_cpu_blocks", "enable_prefix_caching", "block_bytes"}
    cache_kwargs = {k: sched_kwargs.pop(k) for k in list(sched_kwargs) if k in cache_keys}
    sched_kwargs.setdefault("max_model_len", 4096)
    scheduler = Scheduler(
        SchedulerConfig(**sched_kwargs),
        CacheConfig(num_gpu_blocks=num_gpu_blocks, block_size=block_size, **cache_kwargs),
    )
    return EngineCore(scheduler, executor or IdealExecutor(step_s=0.01, token_s=0.001))


def admitted_at(eng: EngineCore, rid: str, now: float, steps: int) -> int | None:
    """Step (1-based, from `now`) whose output admits `rid`, or None within `steps`."""
    for i in range(1, steps + 1):
        out = eng.step(now)
        now = out.end_time
        if rid in out.scheduler_output.new_req_ids:
            return i
    return None


def make_request(
    rid: str,
    prompt: list[int] | int,
    max_tokens: int = 4,
    arrival: float = 0.0,
    **sp_kwargs,
) -> Request:
    if isinstance(prompt, int):
        return Request(
            rid,
            num_prompt_tokens=prompt,
            sampling_params=SamplingParams(max_tokens=max_tokens, **sp_kwargs),
            arrival_time=arrival,
        )
    return Request(
        rid,
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(max_tokens=max_tokens, **sp_kwargs),
        arrival_time=arrival,
    )


def hand_over(prefill: EngineCore, decode: EngineCore, out, now: float) -> float:
    """Step a PD decode engine until it is idle, each KV transfer completing at once (the
    prefill side released as the decode side receives); returns the end time."""
    from simulator.core import StepResult

    while True:
        for r, _ in out.kv_to_receive:
            prefill.scheduler.release_transferred(r.request_id)
            decode.scheduler.on_kv_received(r.request_id)
        decode.scheduler.update(out, StepResult(0.01), now + 0.01)
        now += 0.01
        if not decode.has_unfinished_requests():
            return now
        out = decode.scheduler.schedule(now)


def workload_requests(workload, seed: int, prefix_len: int) -> list[Request]:
    """Requests from hypothesis workload rows (prompt length, max tokens, prefix family,
    arrival gap s, n[, priority]): prompts start with one of 4 seeded shared prefixes of
    `prefix_len` tokens; without a priority column, request i has priority i % 3."""
    import random

    rng = random.Random(seed)
    prefixes = [[rng.randrange(5) for _ in range(prefix_len)] for _ in range(4)]
    reqs, t = [], 0.0
    for i, (plen, max_tokens, fam, gap, n, *prio) in enumerate(workload):
        t += gap
        prompt = (prefixes[fam] + [rng.randrange(5) for _ in range(plen)])[:plen]
        sp = SamplingParams(max_tokens=max_tokens, n=n, stop_token_ids=(4,), seed=i)
        reqs.append(Request(f"r{i}", prompt_token_ids=prompt, sampling_params=sp, arrival_time=t,
                            priority=prio[0] if prio else i % 3))
    return reqs


def serve_three_at_once(policy: str):
    """Three requests of 8 prompt + 16 output tokens arriving together in 12 blocks of 4 tokens
    (each grows to 6 blocks) under capacity `policy`, served to the end: (the first step's
    output, the requests, the scheduler)."""
    eng = make_engine(num_gpu_blocks=12, block_size=4, capacity_policy=policy, max_num_seqs=8)
    reqs = [make_request(f"r{i}", 8, max_tokens=16) for i in range(3)]
    for r in reqs:
        eng.add_request(r, 0.0)
    first = eng.scheduler.schedule(0.0)
    eng.scheduler.update(first, StepResult(0.01), 0.01)
    eng.run_until_idle(0.01)
    return first, reqs, eng.scheduler

