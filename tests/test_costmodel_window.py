"""Sliding-window layers in the cost model: prefill pairs, KV reads and decode contexts are
capped at the window (Mistral-7B-v0.1: every layer, 4096 tokens), `explain` agrees with
`step_time`, and decode runs equal step-by-step pricing."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.models import get_model
from simulator.cost.params import CostParams

W = 4096


def _models():
    m = get_model("mistral-7b")
    full = dataclasses.replace(m, sliding_window=0, num_sliding_layers=0)
    half = dataclasses.replace(m, num_sliding_layers=m.num_layers // 2)
    return m, full, half


def shape_of(reqs: list[tuple[int, int]], window: int = W) -> BatchShape:
    """A shape from (new tokens, context before) pairs, tracking `window`."""
    return BatchShape.from_lists([q for q, _ in reqs], [c for _, c in reqs], window)


def test_window_sums_of_a_shape():
    s = shape_of([(6, 0), (4, 5), (4, 12), (1, 20), (1, 3)], window=8)
    # query at position p sees min(p + 1, 8) keys
    assert s.prefill_window_pairs == sum(min(p + 1, 8) for p in [*range(6), *range(5, 9),
                                                                 *range(12, 16)])
    assert s.prefill_window_context_tokens == 6 + 9 + 11  # keys 0..5, 0..8, 5..15
    assert s.decode_window_tokens == 8 + 4
    assert (s.num_decodes_below_window, s.min_window_gap) == (1, 4)


def test_short_contexts_cost_as_full_attention_long_ones_less():
    m, full, _ = _models()
    cm, cf = CostModel(m, "h100-sxm"), CostModel(full, "h100-sxm")
    short = [(512, 0), (1, 1000), (1, 3000)]
    assert cm.step_time(shape_of(short)) == pytest.approx(cf.step_time(shape_of(short, 0)))
    long_prefill = [(8192, 24_000)]
    long_decode = [(1, 30_000)] * 64
    for reqs in (long_prefill, long_decode):
        assert cm.step_time(shape_of(reqs)) < 0.9 * cf.step_time(shape_of(reqs, 0))
    # a decode past the window costs what one at the window does
    assert cm.step_time(shape_of([(1, 30_000)] * 64)) == pytest.approx(
        cm.step_time(shape_of([(1, W - 1)] * 64)))


def test_explain_agrees_and_prices_the_window():
    m, full, half = _models()
    reqs = [(2048, 6000), (300, 0), (1, 9000), (1, 100), (1, 5000)]
    for model in (m, half):
        for pp in (1, 2):
            cm = CostModel(model, "h100-sxm", tp=2, pp=pp)
            s = shape_of(reqs)
            assert cm.explain(s).total_s == pytest.approx(cm.step_time(s), rel=1e-12)
    cm = CostModel(m, "h100-sxm")
    cf = CostModel(full, "h100-sxm")
    ops = {o.name: o for o in cm.explain(shape_of(reqs)).ops}
    ops_full = {o.name: o for o in cf.explain(shape_of(reqs, 0)).ops}
    s = shape_of(reqs)
    ratio = s.prefill_window_pairs / s.prefill_attn_pairs
    assert ops["attn_prefill"].flops == pytest.approx(ops_full["attn_prefill"].flops * ratio)
    assert ops["attn_decode"].flops == pytest.approx(
        ops_full["attn_decode"].flops * s.decode_window_tokens / s.decode_context_tokens)
    # half the layers slide: halfway between
    ch = CostModel(half, "h100-sxm")
    op_h = {o.name: o for o in ch.explain(s).ops}["attn_prefill"]
    assert op_h.flops == pytest.approx((ops["attn_prefill"].flops + ops_full["attn_prefill"].flops) / 2)


@pytest.mark.parametrize("padding", [0.0, 0.5])
def test_decode_runs_equal_steps_with_a_window(padding):
    m, _, half = _models()
    params = dataclasses.replace(CostParams(), decode_padding=padding)
    for model in (m, half):
        cm = CostModel(model, "h100-sxm", params=params)
        for reqs in ([(1, 4000), (1, 100), (1, 9000)], [(1, 1000), (1, 2000)]):
            s = shape_of(reqs)
            k = min(s.min_window_gap, 40) if s.num_decodes_below_window else 40
            run = cm.decode_run_times(s, k)
            for j in range(k):
                assert run[j] == pytest.approx(cm.step_time(s.advanced(j)), rel=1e-12)


def test_a_shape_for_another_window_is_refused():
    cm = CostModel(get_model("mistral-7b"), "h100-sxm")
    with pytest.raises(ValueError, match="8-token window but mistral-7b slides 4096"):
        cm.step_time(shape_of([(100, 0)], window=8))
    with pytest.raises(ValueError, match="reaches the sliding window"):
        shape_of([(1, 4000)]).advanced(100)


@pytest.mark.parametrize("padding", [0.0, 0.5])
def test_decode_runs_are_bit_identical_to_decode_steps(padding):
    m, _, half = _models()
    params = dataclasses.replace(CostParams(), decode_padding=padding)
    for model in (m, half):
        cm = CostModel(model, "h100-sxm", params=params, tp=2, pp=2)
        for reqs in ([(1, 4000), (1, 100), (1, 9000)], [(1, 1000), (1, 2000)], [(1, 5000)] * 3):
            s = shape_of(reqs)
            k = min(s.min_window_gap, 40) if s.num_decodes_below_window else 40
            run = cm.decode_run_times(s, k)
            assert [cm.decode_step_time(s.advanced(j)) for j in range(k)] == run.tolist()
