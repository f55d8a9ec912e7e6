"""Engine steps timed beside a busy neighbour process (CPU hosts): what two PD workers on one
machine do to each other (`cluster.host_memory_share`, `cluster.host_compute_share`).

A few step points of the profile grid (short, middle and long prompts; a small and a large
decode batch) are timed in interleaved rounds with the neighbour in each of three modes:
`none` (idle), `stream` (one thread reading a tensor larger than the caches: a neighbour
whose step is all memory, f = 1) and `spin` (one thread busy on registers: a neighbour that
takes a core but no memory bandwidth, f = 0). `kvpd calibrate` fits the two shares from the
ratios (`simulator.calibrate.host_share`).
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing as mp
import time
from typing import Any

import numpy as np
import torch

MODES = ("none", "stream", "spin")
SETTLE_S = 0.2  # after switching the neighbour's mode


def _neighbour(mode: Any, ready: Any, nbytes: int) -> None:
    """Child process: idle, stream or spin as `mode` says (index into MODES; -1: exit)."""
    torch.set_num_threads(1)
    a = torch.ones(nbytes // 4)
    a.sum()
    ready.set()
    x = 0
    while True:
        m = mode.value
        if m < 0:
            return
        if m == 1:
            a.sum()
        elif m == 2:
            t = time.perf_counter()
            while time.perf_counter() - t < 0.005:
                x += 1
        else:
            time.sleep(0.002)


def decode_points(grid) -> list[tuple[int, int]]:
    """(batch, context) of the decode steps the profile's extra checks time: the smallest and
    largest decode batch <= 16 at the middle decode context of the grid (none without one)."""
    if not grid.decode_contexts or not grid.decode_batches:
        return []
    batches = sorted(b for b in grid.decode_batches if b <= 16) or sorted(grid.decode_batches)[:1]
    ctx = sorted(grid.decode_contexts)[len(grid.decode_contexts) // 2]
    return [(b, ctx) for b in sorted({batches[0], batches[-1]})]


def contention_points(grid) -> list[tuple[str, tuple]]:
    """(kind, args) of the timed points: up to three prompt lengths (shortest >= 16 tokens,
    longest <= 512, one between) and the `decode_points`."""
    lens = sorted(n for n in grid.prefill_lens if 16 <= n <= 512) or sorted(grid.prefill_lens)[:1]
    picks = sorted({lens[0], lens[len(lens) // 2], lens[-1]})
    return ([("prefill", (n,)) for n in picks]
            + [("decode", (b, ctx, ())) for b, ctx in decode_points(grid)])


def host_contention(prof, repeats: int | None = None, warmup: int | None = None,
                    nbytes: int = 256 << 20) -> dict[str, Any]:
    """Time `contention_points` of `prof` (a `realexec.fidelity.profile.profiler.Profiler`) alone and beside a
    neighbour process streaming memory or spinning; medians per point and mode (s)."""
    g = prof.grid
    repeats = g.repeats if repeats is None else repeats
    warmup = g.warmup if warmup is None else warmup
    fns = {"prefill": prof._prefill, "decode": prof._group}
    kinds = contention_points(g)
    points = [functools.partial(fns[kind], *args) for kind, args in kinds]
    ctx = mp.get_context("spawn")
    mode, ready = ctx.Value("i", 0), ctx.Event()
    proc = ctx.Process(target=_neighbour, args=(mode, ready, nbytes), daemon=True)
    proc.start()
    times: dict[tuple[int, str], list[float]] = {}
    shapes: dict[int, Any] = {}
    try:
        if not ready.wait(120):
            raise RuntimeError("contention neighbour process did not start within 120 s")
        order, modes = list(range(len(points))), list(range(len(MODES)))
        for rnd in range(warmup + repeats):
            prof.rng.shuffle(modes)
            for m in modes:
                mode.value = m
                time.sleep(SETTLE_S)
                prof.rng.shuffle(order)
                for i in order:
                    (_key, kind, dt, _cpu, shape), *_ = points[i]()
                    if rnd >= warmup:
                        times.setdefault((i, MODES[m]), []).append(dt)
                        shapes[i] = shape
    finally:
        mode.value = -1
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    out = []
    for i in range(len(points)):
        row: dict[str, Any] = {"kind": kinds[i][0],
                               "shape": dataclasses.asdict(shapes[i])}
        for name in MODES:
            row[f"{name}_s"] = float(np.median(times[(i, name)]))
        out.append(row)
    prof.progress(f"host contention: {len(points)} points x {len(MODES)} neighbour modes, "
                  f"{repeats} rounds")
    return {"neighbour_modes": list(MODES), "repeats": repeats, "points": out}
