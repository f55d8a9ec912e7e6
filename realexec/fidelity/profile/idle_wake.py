"""The first step after the engine sat idle, timed against the same step run back to back
(`CostParams.idle_wake_s`, `idle_wake_tau_s`).

A serving engine that waits for requests does nothing between steps, and its first step after
the wait ran slower than the same step right after another on the 2-core CPU VM kvpd is
validated on: +1-2 ms after 2-30 ms idle, +8 ms after 100 ms, +14 ms after 300 ms and +22 ms
after 1 s for a 64-token prompt of llama-50m (a ~38 ms step; the same +11-13 ms after 1 s at
128-192 tokens), which made served prompt steps 15-50% slower than the grid's back-to-back
ones (docs/validation-runs.md, run of 2026-12-02). Whatever the cause (caches, the core's
power state, the hypervisor), it is a property of the device under serving, so it is measured
here and priced by the simulator after each idle spell (`simulator.calibrate.idle_wake`).

One prompt length of the grid is timed after each idle gap in `GAPS_S`, gaps shuffled per
round; every timed step follows an untimed one, so gap 0 is a step run back to back.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

GAPS_S = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0)  # idle seconds before the timed step


def wake_prompt_len(grid) -> int:
    """The prompt timed: the grid's longest prompt of at most 64 tokens (its shortest if none)."""
    short = [n for n in grid.prefill_lens if n <= 64]
    return max(short) if short else min(grid.prefill_lens)


def idle_wake(prof, repeats: int | None = None, warmup: int | None = None,
              gaps: tuple[float, ...] = GAPS_S) -> dict[str, Any]:
    """Time `prof`'s (a `realexec.fidelity.profile.profiler.Profiler`) prompt step of
    `wake_prompt_len` tokens right after an untimed one and after idle `gaps` (s); the median
    per gap (s)."""
    g = prof.grid
    repeats = g.repeats if repeats is None else repeats
    warmup = g.warmup if warmup is None else warmup
    n = wake_prompt_len(g)
    times: dict[float, list[float]] = {gap: [] for gap in gaps}
    order = list(gaps)
    for rnd in range(warmup + repeats):
        prof.rng.shuffle(order)
        for gap in order:
            prof._prefill(n)  # untimed: the engine is busy until the gap starts
            if gap > 0:
                time.sleep(gap)
            (_key, _kind, dt, _cpu, _shape), *_ = prof._prefill(n)
            if rnd >= warmup:
                times[gap].append(dt)
    medians = [float(np.median(times[gap])) for gap in gaps]
    prof.progress(f"idle wake: {n}-token prompt after {len(gaps)} idle gaps, {repeats} rounds: "
                  + ", ".join(f"{gap:g} s {m * 1e3:.1f} ms" for gap, m in zip(gaps, medians)))
    return {"prompt_tokens": n, "repeats": repeats, "gaps_s": list(gaps), "median_s": medians}
