"""Median times of a scheduler's two host phases per step, shared by the vLLM drivers'
timing modes (`vllm_v0_driver.py`, `vllm_v1_driver.py`). Standard library only: the drivers
run under an interpreter that imports a released vLLM."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def median_phase_times(first: Callable[[], Any], between: Callable[[Any], Any],
                       second: Callable[[Any], int], n: int, steps: int,
                       warm: int) -> tuple[float, float]:
    """Run `warm + steps` steps of `first()`, `between(its result)` (untimed: what the model's
    step would hand over) and `second(that)`, and return the median seconds of `first` and of
    `second` over the last `steps`. `second` returns how many requests the step scheduled;
    RuntimeError unless that is `n` (all of them decoding side by side)."""
    t_first, t_second = [], []
    for step in range(warm + steps):
        t0 = time.perf_counter()
        out = first()
        t1 = time.perf_counter()
        handed = between(out)
        t2 = time.perf_counter()
        scheduled = second(handed)
        t3 = time.perf_counter()
        if step >= warm:
            if scheduled != n:
                raise RuntimeError(f"step {step} scheduled {scheduled} of {n} requests")
            t_first.append(t1 - t0)
            t_second.append(t3 - t2)
    return sorted(t_first)[len(t_first) // 2], sorted(t_second)[len(t_second) // 2]
