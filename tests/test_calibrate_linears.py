"""GEMM size factors (`kvpd calibrate`, simulator/calibrate/linears.py): the measured curve
relative to its median, nothing invented for sizes not timed; a synthetic profile's known
factors come back."""

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
from simulator.cost.costmodel import CostModel
from simulator.cost.params import CostParams


def test_factors_are_the_measured_curve_relative_to_its_median() -> None:
    sizes = np.array([1, 2, 3, 4, 6, 8])
    ratio = np.array([2.0, 2.0, 3.0, 2.0, 3.3, 2.4])  # median 2.2
    got = size_factors(sizes, ratio)
    # 5 and 7 were not timed: 1
    assert got == pytest.approx((2 / 2.2, 2 / 2.2, 3 / 2.2, 2 / 2.2, 1.0, 1.5, 1.0, 2.4 / 2.2),
                                abs=1e-4)
    assert size_factors(np.array([], dtype=int), np.array([])) == ()


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
    tables, report = fit_size_factors(_profile(rows), cm)
    assert tables["linear_token_factors"] == pytest.approx(
        tuple(true_lin[n] for n in range(1, 33)), abs=1e-4)
    assert tables["lm_head_row_factors"] == pytest.approx(
        tuple(true_head[n] for n in range(1, 17)), abs=1e-4)
    assert report["linear_token_factors"]["sizes"] == [1, 32]
    assert report["lm_head_row_factors"]["max"] == pytest.approx(1.2)
    # with the tables, the model reproduces the measured curve (up to the constant)
    fitted = CostModel("gpt2", "cpu", "fp32", params=CostParams(gemm_row_passes_below=4, **tables))
    for n in (3, 7, 13, 31):
        assert linear_seconds(fitted, n) == pytest.approx(linear_seconds(cm, n) * true_lin[n])


def test_no_op_rows_no_tables_and_one_size_is_factor_one() -> None:
    cm = CostModel("gpt2", "cpu", "fp32")
    assert fit_size_factors(_profile([]), cm) == ({}, {})
    tables, _ = fit_size_factors(_profile([("linear", 3, 1e-3)]), cm)
    assert tables == {"linear_token_factors": (1.0, 1.0, 1.0)}
    with pytest.raises(ValueError, match="without size tables"):
        fit_size_factors(_profile([]), CostModel("gpt2", "cpu", "fp32", params=CostParams(
            linear_token_factors=(1.0, 1.2))))
