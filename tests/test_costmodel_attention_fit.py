"""FlashAttention prefill against published kernel tables (bench/diagnostics/attention.py): the
catalog's efficiency / half_keys are the non-causal fits, `causal_tile_s` the causal rows'
extra time per query tile, and kvpd's efficiency reproduces the tables it models."""

from __future__ import annotations

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_accelerator
from simulator.cost.kernels import kernel_profile
from tests.bench_helpers import load_diagnostic

DIAG = load_diagnostic("attention")


def _fits(table):
    _, part, _, _, nc, ca = table
    acc = get_accelerator(part)
    peak = acc.peak_flops("bf16")
    e, h = DIAG.fit_noncausal(nc, peak)
    t = (DIAG.tile_seconds(DIAG.fit_causal_keys(ca, peak, e, h), e, peak, acc.sm_count)
         if ca else None)
    return acc, e, h, t


def test_catalog_is_the_tables_fit():
    fa3, fa2, fa4, mi300x, mi355x = DIAG.TABLES
    _, e, h, _ = _fits(fa3)
    hopper = kernel_profile(get_accelerator("h100-sxm"))
    assert hopper.attn_prefill_efficiency == pytest.approx(e, abs=0.003)
    assert hopper.attn_half_keys == pytest.approx(h, abs=4)
    _, _, _, t = _fits(fa2)  # the same GPU's causal tile time (FA2's causal rows)
    assert hopper.attn_causal_tile_s == pytest.approx(t, abs=0.02e-6)
    for table, part in ((fa4, "b200"), (mi300x, "mi300x"), (mi355x, "mi355x")):
        _, e, h, t = _fits(table)
        prof = kernel_profile(get_accelerator(part))
        assert prof.attn_prefill_efficiency == pytest.approx(e, abs=0.003)
        assert prof.attn_half_keys == pytest.approx(h, abs=2)
        assert prof.attn_causal_tile_s == pytest.approx(t, abs=0.02e-6)


@pytest.mark.parametrize("table", [t for t in DIAG.TABLES if t[2]], ids=lambda t: t[1])
def test_kvpd_reproduces_the_kernels_it_models(table):
    _, part, _, _, nc, ca = table
    peak = get_accelerator(part).peak_flops("bf16") / 1e12
    ratios = [DIAG.kvpd_efficiency(part, S, causal) * peak / tflops
              for causal, rows in ((False, nc), (True, ca)) for S, tflops in rows]
    assert sorted(ratios)[len(ratios) // 2] == pytest.approx(1.0, abs=0.05)
    assert max(abs(r - 1) for r in ratios) <= DIAG.ROW_TOLERANCE[part]


def test_prefill_queries_pay_the_causal_diagonal_and_explain_says_so():
    acc = get_accelerator("h100-sxm")
    k = kernel_profile(acc)
    extra = k.causal_keys(acc.peak_flops("bf16") * k.attn_prefill_efficiency, acc.sm_count, 128)
    assert extra == pytest.approx(214, rel=0.01)
    cm = CostModel("llama-3-8b", "h100-sxm", "bf16")
    op = {o.name: o for o in explain_step(cm, BatchShape.from_lists([2048], [0])).ops}["attn_prefill"]
    assert f"keys/(keys+{k.attn_half_keys + extra:.0f})" in op.source
