"""GEMM size factors from a profile's `linear` and `lm_head` rows (`kvpd calibrate`).

The step fit prices the linears with a roofline, smooth in the number of rows, while a BLAS
kernel's time jumps with the row count (on the CPU executor, 8 rows cost what 16 did, and
15 rows 30% more than 16). For every profiled size n, r(n) = measured time / the model's
time of that operator (the model without size factors); the factor is r(n) / the median of
r over the sizes timed, so the table keeps the measured curve's shape and leaves its level to
the step fit, which `kvpd calibrate` runs again with the tables in place (the step points at
a slow or fast size then no longer pull the fitted efficiencies). Sizes the profile did not
time get 1. Results: `CostParams.linear_token_factors` (by the step's tokens) and
`lm_head_row_factors` (by its requests).

Before 2026-12-02 the factors were 1 at the step points' sizes (anchors) and the fit was
not rerun: a full CPU validation run then found served decode batches of 5-16 priced 11-20%
low, because the 8-request step points (slow in the profile: 8 rows ran as slowly as 16)
sat 17% above the fitted curve with factor 1 there, and every size interpolated from them
inherited it (docs/validation-runs.md).
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


def size_factors(sizes: np.ndarray, ratio: np.ndarray) -> tuple[float, ...]:
    """Factors for sizes 1 .. max(sizes) from measured / model `ratio` at `sizes`, relative
    to the median ratio; 1 at sizes not timed; () without sizes."""
    by_size = {int(n): float(r) for n, r in zip(sizes, ratio)}
    if not by_size:
        return ()
    level = float(np.median(list(by_size.values())))
    return tuple(round(by_size[n] / level, 4) if n in by_size else 1.0
                 for n in range(1, max(by_size) + 1))



def fit_size_factors(prof: Profile, cm: CostModel
                     ) -> tuple[dict[str, tuple[float, ...]], dict[str, Any]]:
    """({CostParams field: table}, report) from `prof`'s op rows and the fitted `cm`, a model
    without size tables (the timings are compared with the plain roofline)."""
    if cm.params.linear_token_factors or cm.params.lm_head_row_factors:
        raise ValueError("size factors are measured against a cost model without size tables")
    tables: dict[str, tuple[float, ...]] = {}
    report: dict[str, Any] = {}
    cases = (("linear_token_factors", "linear", "num_tokens", linear_seconds),
             ("lm_head_row_factors", "lm_head", "num_reqs", lm_head_seconds))
    for field, kind, size_col, model_seconds in cases:
        m = prof.mask(kind)
        if not m.any():
            continue
        sizes = prof.columns[size_col][m].astype(int)
        measured = prof.columns["median_s"][m].astype(float)
        ratio = measured / np.array([model_seconds(cm, int(n)) for n in sizes])
        table = size_factors(sizes, ratio)
        tables[field] = table
        report[field] = {"sizes": [int(sizes.min()), int(sizes.max())],
                         "min": min(table), "max": max(table)}
    return tables, report
