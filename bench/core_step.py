"""Scheduler + KV-manager cost per engine step (no model): schedule() + update().

(a) 256 running decodes, prefix caching on, token ids produced (as the real executor does);
(b) 64 running decodes plus a stream of chunked prompts (512-token chunks);
(c) like (a) but driven as the simulator does (no token ids, decode bursts of up to 64 steps).
Target (issue "Foundation"): under 1.5 ms per step at 256 running requests.
"""

from __future__ import annotations

import random
import time

from simulator.core import (
    CacheConfig,
    Request,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    StepResult,
)


def make(num_running: int, extra_waiting: int, seed: int = 0) -> tuple[Scheduler, list[Request]]:
    rng = random.Random(seed)
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=num_running + 8, max_num_batched_tokens=num_running + 512, max_model_len=16384),
        CacheConfig(num_gpu_blocks=200_000, block_size=16, enable_prefix_caching=True),
    )
    reqs = []
    for i in range(num_running + extra_waiting):
        prompt = [rng.randrange(32000) for _ in range(rng.randint(64, 512))]
        # the first num_running decode for ever; the rest are prompts that need 1 token
        max_tokens = 10_000 if i < num_running else 1
        r = Request(f"r{i}", prompt_token_ids=prompt,
                    sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        sched.add_request(r, 0.0)
        reqs.append(r)
    return sched, reqs


def bench(name: str, num_running: int, extra_waiting: int, steps: int, burst: int = 1) -> None:
    sched, _ = make(num_running, extra_waiting)
    now = 0.0
    # warm up: get everything running
    for _ in range(200):
        out = sched.schedule(now)
        sched.update(out, StepResult(0.01, [1] * len(out.reqs)), now + 0.01)
        now += 0.01
    total_reqs = 0
    done_steps = 0
    t0 = time.perf_counter()
    while done_steps < steps:
        out = sched.schedule(now)
        total_reqs += len(out.reqs)
        if burst > 1:
            k = sched.max_decode_burst(out, burst)
            ends = [now + 0.01 * (j + 1) for j in range(k)]
            sched.update(out, StepResult(0.01 * k, None, ends if k > 1 else None), ends[-1])
            now, done_steps = ends[-1], done_steps + k
        else:
            sched.update(out, StepResult(0.01, [1] * len(out.reqs)), now + 0.01)
            now, done_steps = now + 0.01, done_steps + 1
    dt = time.perf_counter() - t0
    us_step = dt / done_steps * 1e6
    us_req = dt / max(total_reqs, 1) * 1e6
    print(f"{name:58s} {us_step:9.1f} us/step {us_req:7.2f} us/scheduled request")


if __name__ == "__main__":
    print("scheduler + KV manager, per engine step (target < 1500 us/step at 256 running)")
    bench("(a) 256 running decodes, prefix caching, token ids", 256, 0, 2000)
    bench("(b) 64 decodes + chunked prefills (512-token chunks)", 64, 3000, 1000)
    bench("(c) 256 decodes, simulator mode (bursts <= 64 steps)", 256, 0, 20000, burst=64)
