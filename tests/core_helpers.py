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
