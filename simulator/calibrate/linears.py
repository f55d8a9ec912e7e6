"""GEMM size factors from a profile's `linear` and `lm_head` rows (`kvpd calibrate`).

The step fit prices the linears with a roofline: right at the sizes the step grid profiled
(the anchors), smooth between them, while a BLAS kernel's time jumps with the row count.
For every profiled size n, r(n) = measured time / the fitted model's time of that
operator; the factor is r(n) / r interpolated linearly between the neighbouring anchors
(the nearest anchor outside them). At an anchor the factor is 1, so the step fit and its
held-back errors are unchanged; between anchors the operator follows the measured curve.
Sizes the profile did not time get 1. Results: `CostParams.linear_token_factors` (anchors:
the step points' token counts) and `lm_head_row_factors` (anchors: their request counts).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.calibrate.profile_io import Profile
from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import LINEAR_OPS
from simulator.cost.costmodel import CostModel


def _op_seconds(cm: CostModel, n: int, names: tuple[str, ...]) -> float:
    """The model's seconds for operators `names` of a step of `n` one-token decodes."""
    shape = BatchShape.from_lists([1] * n, [1] * n)
    return sum(op.time_s for op in cm.explain(shape).ops if op.name in names)


def linear_seconds(cm: CostModel, tokens: int) -> float:
    """The model's seconds for the per-layer linears of a step of `tokens` tokens."""
    return _op_seconds(cm, tokens, LINEAR_OPS)


def lm_head_seconds(cm: CostModel, requests: int) -> float:
    """The model's seconds for the LM head of a step of `requests` requests."""
    return _op_seconds(cm, requests, ("lm_head",))


def size_factors(sizes: np.ndarray, ratio: np.ndarray, anchors: set[int]) -> tuple[float, ...]:
    """Factors for sizes 1 .. max(sizes) from measured / model `ratio` at `sizes`, relative
    to `ratio` interpolated between the `anchors` among them; () without such an anchor."""
    by_size = {int(n): float(r) for n, r in zip(sizes, ratio)}
    at = sorted(n for n in anchors if n in by_size)
    if not at:
        return ()
    at_ratio = np.array([by_size[n] for n in at])
    return tuple(round(by_size[n] / float(np.interp(n, at, at_ratio)), 4) if n in by_size
                 else 1.0 for n in range(1, max(by_size) + 1))


def fit_size_factors(prof: Profile, cm: CostModel, step_shapes: list[BatchShape]
                     ) -> tuple[dict[str, tuple[float, ...]], dict[str, Any]]:
    """({CostParams field: table}, report) from `prof`'s op rows and the fitted `cm`."""
    tables: dict[str, tuple[float, ...]] = {}
    report: dict[str, Any] = {}
    cases = (("linear_token_factors", "linear", "num_tokens", linear_seconds,
              {s.num_tokens for s in step_shapes}),
             ("lm_head_row_factors", "lm_head", "num_reqs", lm_head_seconds,
              {s.num_reqs for s in step_shapes}))
    for field, kind, size_col, model_seconds, anchors in cases:
        m = prof.mask(kind)
        if not m.any():
            continue
        sizes = prof.columns[size_col][m].astype(int)
        measured = prof.columns["median_s"][m].astype(float)
        ratio = measured / np.array([model_seconds(cm, int(n)) for n in sizes])
        table = size_factors(sizes, ratio, anchors)
        if not table:
            report[field] = {"error": f"no {kind} size is a step point's size"}
            continue
        tables[field] = table
        report[field] = {"sizes": [int(sizes.min()), int(sizes.max())],
                         "anchors": sorted(int(n) for n in anchors if n in set(sizes.tolist())),
                         "min": min(table), "max": max(table)}
    return tables, report
