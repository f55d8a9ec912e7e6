"""The executor-behaviour CostParams (decode_padding, overlap, gemv_memory_efficiency,
gemm_row_passes_below, decode_attn_overhead_s, request_overhead_s): each
does what its docstring says, defaults are the plain roofline, and the fast paths
(step_time, decode_run_times) agree with explain()."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.params import CostParams

CPU = CostParams(decode_padding=0.6, overlap=0.4, gemm_row_passes_below=4,
                 decode_attn_overhead_s=2e-4, request_overhead_s=5e-5)
CONFIGS = [("gpt2", "cpu", "fp32", 1, 1), ("llama-3-8b", "h100-sxm", "bf16", 1, 1),
           ("llama-3-70b", "h100-sxm", "bf16", 4, 2), ("mixtral-8x7b", "mi300x", "fp8", 1, 2)]


def _cm(params: CostParams, cfg=CONFIGS[0]) -> CostModel:
    model, hw, dtype, tp, pp = cfg
    return CostModel(model, hw, dtype=dtype, tp=tp, pp=pp, params=params)


def test_defaults_are_the_roofline() -> None:
    p = CostParams()
    assert (p.decode_padding, p.overlap, p.gemm_row_passes_below) == (0.0, 1.0, 0)
    assert p.decode_attn_overhead_s == 0.0
    shape = BatchShape.from_lists([1, 1, 1, 200], [10, 900, 50, 0])
    for cfg in CONFIGS:
        br = _cm(CostParams(), cfg).explain(shape)
        for op in br.ops:
            if op.bound in ("compute", "memory"):
                assert op.time_s == max(op.compute_s, op.memory_s)
        assert _cm(CostParams(), cfg).decode_attn_tokens(shape) == 963


def test_full_padding_reads_every_decode_at_the_longest_context() -> None:
    ragged = BatchShape.from_lists([1] * 3, [10, 900, 50])
    padded = BatchShape.from_lists([1] * 3, [900] * 3)
    cm = _cm(CostParams(decode_padding=1.0))
    assert cm.decode_attn_tokens(ragged) == 3 * 901
    assert cm.step_time(ragged) == pytest.approx(_cm(CostParams()).step_time(padded), rel=1e-12)
    half = _cm(CostParams(decode_padding=0.5)).decode_attn_tokens(ragged)
    assert half == 963 + 0.5 * (3 * 901 - 963)
    # a uniform batch has nothing to pad
    assert cm.step_time(padded) == _cm(CostParams()).step_time(padded)


def test_decode_attention_setup_is_paid_once_per_layer_by_steps_with_decodes() -> None:
    with_setup = _cm(CostParams(decode_attn_overhead_s=3e-4))
    plain = _cm(CostParams())
    layers = with_setup.model.num_layers
    for news, ctxs in (([1], [10]), ([1] * 40, [700] * 40), ([1, 1, 64], [5, 900, 0])):
        shape = BatchShape.from_lists(news, ctxs)
        assert with_setup.step_time(shape) == pytest.approx(
            plain.step_time(shape) + layers * 3e-4, rel=1e-12)
        setup = [op for op in with_setup.explain(shape).ops if op.name == "attn_decode_setup"]
        assert [op.time_s for op in setup] == [pytest.approx(layers * 3e-4)]
    for news, ctxs in (([64], [0]), ([32, 16], [100, 0])):  # prompts only: no decode call
        shape = BatchShape.from_lists(news, ctxs)
        assert with_setup.step_time(shape) == plain.step_time(shape)


def test_overlap_adds_the_hidden_share_of_each_operator() -> None:
    shape = BatchShape.from_lists([1] * 8 + [300], [400] * 8 + [0])
    base = _cm(CostParams()).explain(shape)
    for ov in (0.0, 0.3, 1.0):
        br = _cm(CostParams(overlap=ov)).explain(shape)
        extra = sum(min(o.compute_s, o.memory_s) for o in base.ops)
        assert br.total_s == pytest.approx(base.total_s + (1 - ov) * extra, rel=1e-12)
        assert _cm(CostParams(overlap=ov)).step_time(shape) == pytest.approx(br.total_s, rel=1e-12)


LINEARS = ("qkv_proj", "o_proj", "mlp")


def _op(cm: CostModel, shape: BatchShape, name: str):
    return next(o for o in cm.explain(shape).ops if o.name == name)


@pytest.mark.parametrize("rows, passes", [(1, 1), (2, 2), (3, 3), (4, 1), (16, 1)])
def test_small_row_linears_read_the_weights_once_per_row(rows: int, passes: int) -> None:
    shape = BatchShape.from_lists([1] * rows, [100] * rows)
    on, off = _cm(CostParams(gemm_row_passes_below=4)), _cm(CostParams())
    raw = on._stages[-1]["raw"]
    for name in LINEARS:
        wb = raw[name][1]
        assert _op(on, shape, name).bytes == pytest.approx(
            _op(off, shape, name).bytes + (passes - 1) * wb, rel=1e-12)
    # the executor pads the LM head's 2-3 rows to 4: one GEMM, never per-row passes
    assert _op(on, shape, "lm_head").bytes == _op(off, shape, "lm_head").bytes
    assert on.step_time(shape) == pytest.approx(on.explain(shape).total_s, rel=1e-12)
    assert (on.step_time(shape) > off.step_time(shape)) == (passes > 1)


def test_gemv_efficiency_prices_one_row_gemms_only() -> None:
    gemv, base = _cm(CostParams(gemv_memory_efficiency=0.425)), _cm(CostParams())
    one = BatchShape.from_lists([1], [100])  # one token: every linear and the LM head a GEMV
    assert gemv.step_time(one) > base.step_time(one)
    for name in (*LINEARS, "lm_head"):
        w = gemv._stages[-1]["raw"][name][1] * gemv._stages[-1]["rate"]["gemm_m"]
        assert _op(gemv, one, name).memory_s == pytest.approx(_op(base, one, name).memory_s + w,
                                                              rel=1e-9)
    # two decodes: GEMMs (no GEMV), so the GEMV efficiency does not enter
    two = BatchShape.from_lists([1, 1], [100, 100])
    assert gemv.step_time(two) == base.step_time(two)
    # one request with a 64-token chunk: GEMM linears, GEMV LM head
    chunk = BatchShape.from_lists([64], [0])
    assert _op(gemv, chunk, "mlp").time_s == _op(base, chunk, "mlp").time_s
    assert _op(gemv, chunk, "lm_head").time_s > _op(base, chunk, "lm_head").time_s


def test_older_calibration_files_read_gemv_as_gemm(tmp_path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("device: cpu\nmodel: gpt2\nparams: {gemm_memory_efficiency: 0.3}\n")
    assert CostParams.load(str(path)).gemv_memory_efficiency == 0.3


@settings(max_examples=40, deadline=None)
@given(news=st.lists(st.one_of(st.just(1), st.integers(1, 400)), min_size=1, max_size=30),
       ctxs=st.lists(st.integers(0, 5000), min_size=30, max_size=30),
       pad=st.floats(0, 1), ov=st.floats(0, 1), below=st.sampled_from([0, 4, 64]),
       gemv=st.floats(0.01, 1), setup=st.sampled_from([0.0, 1e-5, 3e-4]),
       per_req=st.sampled_from([0.0, 7e-5]), cfg=st.sampled_from(CONFIGS))
def test_explain_equals_step_time_with_the_terms(news, ctxs, pad, ov, below, gemv, setup,
                                                 per_req, cfg) -> None:
    cm = _cm(CostParams(decode_padding=pad, overlap=ov, gemm_row_passes_below=below,
                        gemv_memory_efficiency=gemv, decode_attn_overhead_s=setup,
                        request_overhead_s=per_req), cfg)
    shape = BatchShape.from_lists(news, ctxs[: len(news)])
    assert cm.explain(shape).total_s == pytest.approx(cm.step_time(shape), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 100), ctx=st.integers(1, 4000), steps=st.integers(1, 100),
       spread=st.integers(0, 500), cfg=st.sampled_from(CONFIGS))
def test_decode_run_times_equal_repeated_step_time_with_the_terms(batch, ctx, steps, spread,
                                                                  cfg) -> None:
    cm = _cm(CPU, cfg)
    shape = BatchShape.from_lists([1] * batch, [ctx + (i * 37) % (spread + 1) for i in range(batch)])
    run = cm.decode_run_times(shape, steps)
    expected = np.array([cm.step_time(shape.advanced(k)) for k in range(steps)])
    np.testing.assert_allclose(run, expected, rtol=1e-12, atol=0)


def test_the_terms_only_slow_a_step() -> None:
    shape = BatchShape.from_lists([1] * 3 + [64], [10, 700, 90, 0])
    base = _cm(CostParams()).step_time(shape)
    single = BatchShape.from_lists([1], [300])
    assert _cm(CostParams(gemv_memory_efficiency=0.5)).step_time(single) > \
        _cm(CostParams()).step_time(single)
    for change in ({"decode_padding": 1.0}, {"overlap": 0.0}, {"gemm_row_passes_below": 128},
                   {"decode_attn_overhead_s": 1e-4}, {"request_overhead_s": 1e-5}):
        assert _cm(dataclasses.replace(CostParams(), **change)).step_time(shape) > base


@pytest.mark.parametrize("cfg", CONFIGS)
def test_request_overhead_is_paid_once_per_scheduled_request(cfg) -> None:
    per_req = 8e-5
    plain, busy = _cm(CostParams(), cfg), _cm(CostParams(request_overhead_s=per_req), cfg)
    for news, ctxs in (([1] * 5, [100] * 5), ([300], [0]), ([1, 1, 40], [20, 900, 0])):
        shape = BatchShape.from_lists(news, ctxs)
        # per step, not per layer, stage or micro-batch: whatever the tokens
        assert busy.step_time(shape) - plain.step_time(shape) == pytest.approx(
            len(news) * per_req, rel=1e-9)
