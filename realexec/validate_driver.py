"""In-process real-engine driver for `kvpd validate` (colocated): replays a trace on an `LLM`.

Requests are added when their arrival time has come, the engine steps while it has work, and
the loop sleeps only when idle (the loop of `LLM.generate` with staggered arrivals). Every
request gets random prompt token ids (seeded), `max_tokens` = its trace output length with
`ignore_eos` and greedy sampling, so real and simulated requests do the same work. After the
run, every timestamp is shifted to the trace's time base (the first arrival at its trace
time), the semantics of the simulator's requests.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import workloads
from simulator.core.request import Request, SamplingParams


@dataclass(frozen=True)
class RunKnobs:
    """Scheduler and KV-cache knobs both backends run with (vLLM names)."""

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    num_gpu_blocks: int = 512  # the same KV pool (blocks) in the real engine and the simulator
    num_cpu_blocks: int = 0  # host pool for swap preemption
    block_size: int = 16
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False  # prompts are random: no prefix reuse either way
    preemption_mode: str = "recompute"
    policy: str = "fcfs"
    max_model_len: int | None = None  # default: the model's context

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def llm_kwargs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_prompts(trace: workloads.Trace, vocab_size: int, seed: int) -> list[list[int]]:
    """Seeded random prompt token ids (ids 3.. avoid special tokens) of the trace's lengths."""
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab_size, size=int(n)).tolist() for n in trace.prompt_len]


def shift_times(req: Request, offset: float) -> None:
    """Subtract `offset` (s) from every timestamp of `req`."""
    req.arrival_time -= offset
    for name in ("first_scheduled_time", "first_token_time", "finish_time"):
        v = getattr(req, name)
        if v is not None:
            setattr(req, name, v - offset)
    for i in range(len(req.token_times)):
        req.token_times[i] -= offset


def sampling(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max(int(max_tokens), 1), ignore_eos=True, temperature=0.0)


def warm_up(llm, seed: int) -> None:
    """A few untimed prompt, mixed and decode steps (first-call costs, allocator growth)."""
    rng = np.random.default_rng(seed + 7)
    cap = llm.max_model_len - 9
    for i, n in enumerate((min(256, cap), min(48, cap), 8)):
        llm.add_request(f"warmup{i}", rng.integers(3, llm.vocab_size, size=n).tolist(),
                        sampling(8))
    while llm.has_unfinished_requests():
        llm.step()


class ColocatedRunner:
    """One real engine (kept across runs) that replays traces."""

    def __init__(self, model_config: dict[str, Any], dtype: str, device: str | None,
                 knobs: RunKnobs, seed: int = 0) -> None:
        from realexec.llm import LLM

        self.knobs = knobs
        self.seed = seed
        self.llm = LLM(model_config, dtype=dtype, device=device, seed=seed, model_seed=seed,
                       **knobs.llm_kwargs())
        warm_up(self.llm, seed)
        self.runs = 0

    def run(self, trace: workloads.Trace, lead_s: float = 0.05) -> list[Request]:
        """Replay `trace` (arrival_s from its own origin); returns the finished requests."""
        llm = self.llm
        prompts = make_prompts(trace, llm.vocab_size, self.seed)
        offsets = (trace.arrival_s - trace.arrival_s[0]).tolist() if len(trace) else []
        reqs = [llm.make_request(f"{i}", p, sampling(o), 0.0, index=i)
                for i, (p, o) in enumerate(zip(prompts, trace.output_len.tolist()))]
        self.runs += 1
        start = llm.clock() + lead_s
        for r, off in zip(reqs, offsets):
            r.arrival_time = start + off
        k, n = 0, len(reqs)
        while k < n or llm.has_unfinished_requests():
            now = llm.clock()
            while k < n and reqs[k].arrival_time <= now:
                llm.engine.add_request(reqs[k], now)
                k += 1
            if llm.has_unfinished_requests():
                llm.step()
            elif k < n:
                time.sleep(max(0.0, reqs[k].arrival_time - llm.clock()))
        origin = start - (float(trace.arrival_s[0]) if n else 0.0)
        for r in reqs:
            shift_times(r, origin)
            r.annotations["replica"] = "real"
        return reqs

    def close(self) -> None:
        self.llm = None
