"""Do steps of shapes the engine has not run before cost more than repeated ones?

The profile times every grid point at one exact shape, warm-up round first, so it only ever
times what a per-shape cache makes of that shape. A serving engine rarely repeats a shape:
the decode batch is padded to its longest context, which grows every step, and prompt
lengths vary. Where a library sets something up per shape (cuDNN's attention graphs; graph
compilation on MPS), the served steps pay it and the profile does not see it: on a lent H200
cuDNN attention made served decode steps ~3x the profiled ones (docs/gpu-runs.md).

This check times a few grid points at their own (repeated) shape and, interleaved, at shapes
two to a few tokens shorter that no step has had yet (every other length: a decode point's
untimed warm-up step, `Profiler._warm_decode`, runs the length below it), and reports
fresh / repeated per point. A ratio near 1 says the profile stands for serving; well above 1 says served steps
will be slower than it, by about that much on most steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from realexec.fidelity.profile.contention import decode_points
from simulator.calibrate.fresh_shapes import WARN_RATIO


def fresh_points(grid) -> list[tuple[str, int, int]]:
    """(kind, batch, tokens) checked: the middle prompt length of the grid, and the decode
    steps the contention check times (`decode_points`)."""
    lens = sorted(n for n in grid.prefill_lens if n >= 8) or sorted(grid.prefill_lens)
    pts = [("prefill", 1, lens[len(lens) // 2])] if lens else []
    return pts + [("decode", b, ctx) for b, ctx in decode_points(grid)]


def fresh_shape_check(prof, repeats: int = 3) -> dict[str, Any]:
    """Time `fresh_points` of `prof` (a `realexec.fidelity.profile.profiler.Profiler` whose grid has run) at
    their grid shape and at never-run shapes (tokens - 2, - 4, ...), interleaved.

    Returns {"points": [{kind, batch, tokens, repeated_s, fresh_s, ratio}], "ratio": median
    of the points' ratios (None without points), "warn": ratio > WARN_RATIO}."""
    out = []
    for kind, batch, tokens in fresh_points(prof.grid):
        if tokens - 2 * repeats < 3:
            continue
        repeated, fresh = [], []
        for r in range(repeats):
            for n, sink in ((tokens, repeated), (tokens - 2 - 2 * r, fresh)):
                if kind == "prefill":
                    (sample,) = prof._prefill(n)
                else:
                    sample = prof._group(batch, n, ())[0]
                sink.append(sample[2])
        rep, fr = float(np.median(repeated)), float(np.median(fresh))
        out.append({"kind": kind, "batch": batch, "tokens": tokens, "repeated_s": rep,
                    "fresh_s": fr, "ratio": fr / rep if rep > 0 else None})
    ratios = [p["ratio"] for p in out if p["ratio"] is not None]
    ratio = float(np.median(ratios)) if ratios else None
    return {"points": out, "ratio": ratio, "warn": ratio is not None and ratio > WARN_RATIO}
