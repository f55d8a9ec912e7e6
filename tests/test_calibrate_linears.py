"""GEMM size factors (`kvpd calibrate`, simulator/calibrate/linears.py): 1 at the sizes the
step fit saw, the measured curve relative to the anchors between them, nothing invented
for sizes not timed; a synthetic profile's known factors come back."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.calibrate.linears import (
    fit_size_factors,
    linear_seconds,
    lm_head_seconds,
    size_factors,
)
from simulator.calibrate.profile_io import Profile
from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.params import CostParams


def test_factors_are_one_at_anchors_and_relative_to_them_between() -> None:
    sizes = np.array([1, 2, 3, 4, 6, 8])
    ratio = np.array([2.0, 2.0, 3.0, 2.0, 3.3, 2.4])  # anchors 2, 4, 8
    got = size_factors(sizes, ratio, {2, 4, 8, 100})
    # 1: nearest anchor (2); 3: between 2 and 4 (2.0); 5, 7: not timed; 6: between 4 and 8
    assert got == pytest.approx((1.0, 1.0, 1.5, 1.0, 1.0, 1.5, 1.0, 1.0))
    assert size_factors(sizes, ratio, {100}) == ()


def _profile(rows: list[tuple[str, int, float]]) -> Profile:
    cols = {"kind": np.array([k for k, _, _ in rows], dtype=object),
            "num_tokens": np.array([n for _, n, _ in rows]),
            "num_reqs": np.array([n if k == "lm_head" else 0 for k, n, _ in rows]),
            "median_s": np.array([t for _, _, t in rows])}
    return Profile(cols, {})


def test_a_synthetic_profile_gives_its_factors_back() -> None:
    cm = CostModel("gpt2", "cpu", "fp32", params=CostParams(gemm_row_passes_below=4))
    true_lin = {n: (1.3 if n % 4 == 3 else 0.9 if n % 4 == 1 and n > 1 else 1.0)
                for n in range(1, 33)}
    true_head = {n: (1.2 if n % 2 else 1.0) if n > 1 else 1.0 for n in range(1, 17)}
    rows = [("linear", n, 1.7 * linear_seconds(cm, n) * f) for n, f in true_lin.items()]
    rows += [("lm_head", n, 0.6 * lm_head_seconds(cm, n) * f) for n, f in true_head.items()]
    # step points at 1, 2, 4, 8, 16, 32 tokens (decodes) and a 64-token prompt
    steps = [BatchShape.from_lists([1] * b, [50] * b) for b in (1, 2, 4, 8, 16, 32)]
    steps.append(BatchShape.from_lists([64], [0]))
    tables, report = fit_size_factors(_profile(rows), cm, steps)
    assert tables["linear_token_factors"] == pytest.approx(
        tuple(true_lin[n] for n in range(1, 33)), abs=1e-4)
    assert tables["lm_head_row_factors"] == pytest.approx(
        tuple(true_head[n] for n in range(1, 17)), abs=1e-4)
    assert report["linear_token_factors"]["anchors"] == [1, 2, 4, 8, 16, 32]
    assert report["lm_head_row_factors"]["max"] == pytest.approx(1.2)
    # with the tables, the model reproduces the measured curve (up to the constant)
    fitted = CostModel("gpt2", "cpu", "fp32", params=CostParams(gemm_row_passes_below=4, **tables))
    for n in (3, 7, 13, 31):
        assert linear_seconds(fitted, n) == pytest.approx(linear_seconds(cm, n) * true_lin[n])


def test_no_op_rows_no_tables_and_no_anchor_is_reported() -> None:
    cm = CostModel("gpt2", "cpu", "fp32")
    steps = [BatchShape.from_lists([1] * 8, [50] * 8)]
    assert fit_size_factors(_profile([]), cm, steps) == ({}, {})
    tables, report = fit_size_factors(_profile([("linear", 3, 1e-3)]), cm, steps)
    assert tables == {} and "no linear size is a step point's size" in \
        report["linear_token_factors"]["error"]
