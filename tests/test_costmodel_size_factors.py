"""Measured GEMM size factors (`CostParams.linear_token_factors`, `lm_head_row_factors`):
they scale exactly the linears of a step of T tokens and the LM head of a step of R requests,
leave every other size and operator alone, agree across step_time / explain /
decode_run_times, and survive a calibration file."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import size_factor
from simulator.cost.costmodel import CostModel
from simulator.cost.params import CostParams

CONFIGS = [("gpt2", "cpu", "fp32", 1, 1), ("llama-3-8b", "h100-sxm", "bf16", 1, 1),
           ("llama-3-70b", "h100-sxm", "bf16", 4, 2), ("mixtral-8x7b", "mi300x", "fp8", 1, 2)]
LINEARS = ("qkv_proj", "o_proj", "mlp")


def _cm(params: CostParams, cfg=CONFIGS[0]) -> CostModel:
    model, hw, dtype, tp, pp = cfg
    return CostModel(model, hw, dtype=dtype, tp=tp, pp=pp, params=params)


def _ops(cm: CostModel, shape: BatchShape) -> dict[str, float]:
    return {o.name: o.time_s for o in cm.explain(shape).ops}


@pytest.mark.parametrize("below", [0, 4])
def test_linear_factor_scales_the_linears_of_that_token_count_only(below: int) -> None:
    table = (1.0, 1.0, 1.25, 1.0, 1.0, 1.0, 1.5)  # 3 and 7 tokens
    on = _cm(CostParams(linear_token_factors=table, gemm_row_passes_below=below))
    off = _cm(CostParams(gemm_row_passes_below=below))
    for tokens, k in ((7, 1.5), (3, 1.25), (6, 1.0), (8, 1.0), (40, 1.0)):
        shape = BatchShape.from_lists([1] * tokens, [100 + 9 * i for i in range(tokens)])
        a, b = _ops(on, shape), _ops(off, shape)
        for name, t in b.items():
            assert a[name] == pytest.approx(t * (k if name in LINEARS else 1.0), rel=1e-12)
        assert on.step_time(shape) == pytest.approx(on.explain(shape).total_s, rel=1e-12)
    # one 7-token prompt is 7 tokens too
    prompt = BatchShape.from_lists([7], [0])
    assert _ops(on, prompt)["mlp"] == pytest.approx(1.5 * _ops(off, prompt)["mlp"], rel=1e-12)


def test_lm_head_factor_scales_the_head_of_that_request_count_only() -> None:
    on = _cm(CostParams(lm_head_row_factors=(1.0, 1.0, 1.0, 1.0, 0.8)))
    off = _cm(CostParams())
    five = BatchShape.from_lists([1, 1, 1, 1, 30], [50, 60, 70, 80, 0])  # 5 requests, 34 tokens
    a, b = _ops(on, five), _ops(off, five)
    assert a["lm_head"] == pytest.approx(0.8 * b["lm_head"], rel=1e-12)
    assert {k: v for k, v in a.items() if k != "lm_head"} == \
        {k: v for k, v in b.items() if k != "lm_head"}
    six = BatchShape.from_lists([1] * 6, [50] * 6)
    assert on.step_time(six) == off.step_time(six)


def test_size_factor_lookup() -> None:
    assert size_factor((), 3) == 1.0
    assert size_factor((2.0, 3.0), 2) == 3.0 and size_factor((2.0, 3.0), 3) == 1.0
    assert size_factor((2.0, 3.0), 1.5) == 1.0  # a fractional micro-batch share


_tables = st.lists(st.floats(0.5, 2.0), max_size=48).map(tuple)


@settings(max_examples=40, deadline=None)
@given(news=st.lists(st.one_of(st.just(1), st.integers(1, 60)), min_size=1, max_size=30),
       ctxs=st.lists(st.integers(0, 3000), min_size=30, max_size=30), lin=_tables,
       head=_tables, below=st.sampled_from([0, 4]), cfg=st.sampled_from(CONFIGS))
def test_explain_equals_step_time_with_size_factors(news, ctxs, lin, head, below, cfg) -> None:
    cm = _cm(CostParams(linear_token_factors=lin, lm_head_row_factors=head,
                        gemm_row_passes_below=below, overlap=0.5), cfg)
    shape = BatchShape.from_lists(news, ctxs[: len(news)])
    assert cm.explain(shape).total_s == pytest.approx(cm.step_time(shape), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 60), ctx=st.integers(1, 3000), steps=st.integers(1, 50),
       lin=_tables, head=_tables, cfg=st.sampled_from(CONFIGS))
def test_decode_run_times_agree_with_size_factors(batch, ctx, steps, lin, head, cfg) -> None:
    cm = _cm(CostParams(linear_token_factors=lin, lm_head_row_factors=head), cfg)
    shape = BatchShape.from_lists([1] * batch, [ctx + (i * 31) % 200 for i in range(batch)])
    expected = np.array([cm.step_time(shape.advanced(k)) for k in range(steps)])
    np.testing.assert_allclose(cm.decode_run_times(shape, steps), expected, rtol=1e-12, atol=0)


def test_tables_round_trip_through_a_calibration_file(tmp_path) -> None:
    p = CostParams(linear_token_factors=(1.0, 0.9, 1.2), lm_head_row_factors=(1.1,),
                   device="cpu", model="gpt2")
    path = tmp_path / "cal.yaml"
    p.save(str(path))
    q = CostParams.load(str(path))
    assert q.linear_token_factors == (1.0, 0.9, 1.2) and q.lm_head_row_factors == (1.1,)
    assert "linear_token_factors" not in CostParams(device="cpu").to_dict()["params"]


@pytest.mark.parametrize("bad", [(1.0, 0.0), (1.0, -2.0), ("x",), (float("nan"),), (True,), 3.0])
def test_bad_tables_are_refused_by_name(bad) -> None:
    with pytest.raises(ValueError, match="linear_token_factors must be a list of factors > 0"):
        CostParams(linear_token_factors=bad)
