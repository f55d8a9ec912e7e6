"""Dense GEMM kernels at decode batches on CDNA: the catalog's `gemm_kernel_s` and
`weight_stream_efficiency` are the least-squares fit over the published tuned-kernel tables
(bench/diagnostics/gemm_kernels.py), the layer floor prices each layer's dense GEMM kernels
at `gemm_kernel_s` (MoE, shared-expert and MLA layers counted), NVIDIA parts keep their
floor, and bad `layer_floor` entries are refused."""

from __future__ import annotations

import statistics

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_accelerator
from simulator.cost.kernels import _layer_floor, kernel_profile
from simulator.cost.models import get_model
from tests.bench_helpers import load_diagnostic

DIAG = load_diagnostic("gemm_kernels")


@pytest.mark.parametrize("table", DIAG.TABLES[:DIAG.FITTED], ids=lambda t: t[1])
def test_catalog_figures_are_the_fit_of_the_published_tables(table):
    _, part, elem_bytes, _, rows = table
    acc = get_accelerator(part)
    k = kernel_profile(acc)
    c, e = DIAG.fit(rows, elem_bytes, acc.mem_bw_bytes_per_s / 1e12)
    assert k.gemm_kernel_s == pytest.approx(c, abs=0.05e-6)
    assert k.weight_stream_efficiency == pytest.approx(e, abs=0.005)
    ratios = [DIAG.kvpd_us(part, r, elem_bytes) / r[3] for r in rows]
    assert statistics.median(ratios) == pytest.approx(1.0, abs=0.1)


@pytest.mark.parametrize("table", DIAG.TABLES[DIAG.FITTED:], ids=lambda t: t[1])
def test_nvidia_gemv_pricing_stays_within_the_check_tables(table):
    _, part, elem_bytes, _, rows = table
    assert kernel_profile(get_accelerator(part)).gemm_kernel_s is None
    for r in rows:
        assert 0.9 <= DIAG.kvpd_us(part, r, elem_bytes) / r[3] <= 1.25


@pytest.mark.parametrize("row", DIAG.COMPUTE, ids=lambda r: r[1])
def test_compute_bound_gemms_follow_the_tables_short_k_fit(row):
    e, k = DIAG.fitted_compute(row)
    kvpd_e, kvpd_k = DIAG.kvpd_compute_efficiency(row[1], row[2])
    assert kvpd_e == pytest.approx(e, abs=0.003)
    assert kvpd_k == pytest.approx(k, rel=0.015)


def test_short_k_gemms_pay_the_tile_fixed_time_and_explain_says_so():
    from simulator.cost.linear_cost import LinearCost

    acc = get_accelerator("h100-sxm")
    prof = kernel_profile(acc)
    bf16 = acc.peak_flops("bf16") * acc.matmul_efficiency
    k_half = prof.k_half(bf16, acc.sm_count)  # the tile time in elements of K at that rate
    assert k_half == pytest.approx(prof.gemm_tile_fixed_s * bf16 / acc.sm_count / (2 * 128 * 128))
    assert k_half == pytest.approx(407, rel=0.01)
    args = ([(8192, 1024)], 1, acc.peak_flops("bf16"), 0.8, (128, 128), acc.sm_count)
    short = LinearCost(*args, k_half=k_half).seconds(4096)
    assert short / LinearCost(*args).seconds(4096) == pytest.approx((1024 + k_half) / 1024)
    cm = CostModel("llama-3-70b", "h100-sxm", "bf16", tp=8)  # o_proj: K = 8192 / 8
    ops = {o.name: o for o in explain_step(cm, BatchShape.from_lists([4096], [0])).ops}
    assert f"K/(K+{k_half:.0f})" in ops["o_proj"].source
    # the same time per tile is more K for the faster FP8 loop; an A100's slower SMs cover less
    fp8 = acc.peak_flops("fp8") * acc.matmul_efficiency * prof.relative("fp8")
    assert prof.k_half(fp8, acc.sm_count) == pytest.approx(746, rel=0.01)
    a100 = get_accelerator("a100-80gb-sxm")
    assert kernel_profile(a100).k_half(a100.peak_flops("bf16") * a100.matmul_efficiency,
                                       a100.sm_count) == pytest.approx(170, rel=0.02)


def _floor_us_per_layer(model: str, hw: str, dtype: str, tp: int) -> float:
    cm = CostModel(model, hw, dtype, tp=tp)
    shape = BatchShape(num_reqs=1, num_tokens=1, num_decode_reqs=1, decode_context_tokens=128,
                       max_context=128, max_decode_context=128)
    op = next(o for o in explain_step(cm, shape).ops if o.name == "layer_overhead")
    return op.time_s / get_model(model).num_layers * 1e6


def test_dense_layer_floor_prices_its_four_gemms_at_the_gemm_kernel_time():
    # 5 other kernels at kernel_s, QKV / O / gate-up / down at gemm_kernel_s
    assert _floor_us_per_layer("llama-3-70b", "mi300x", "fp8", 8) == pytest.approx(
        5 * 2.5 + 4 * 5.6, rel=1e-6)
    assert _floor_us_per_layer("llama-3-70b", "mi355x", "fp8", 8) == pytest.approx(
        5 * 2.5 + 4 * 6.6, rel=1e-6)
    assert _floor_us_per_layer("llama-3-70b", "h100-sxm", "fp8", 8) == pytest.approx(
        9 * 2.5, rel=1e-6)  # no GEMM kernel tables: unchanged


def test_moe_and_mla_layers_count_their_own_dense_gemms():
    k = kernel_profile(get_accelerator("mi300x"))
    ds = get_model("deepseek-v3")  # MLA, shared expert, 3 dense layers before the MoE ones
    step = (k.gemm_kernel_s - k.kernel_s)
    # dense layer: 4 + MLA's 4 more; MoE layer: 4 - 1 (router for gate/up, down) + 2 shared + 4
    assert k.layer_gemm_extra_s(ds, False) == pytest.approx(8 * step)
    assert k.layer_gemm_extra_s(ds, True) == pytest.approx(9 * step)
    mixtral = get_model("mixtral-8x7b")
    assert k.layer_gemm_extra_s(mixtral, True) == pytest.approx(3 * step)
    assert kernel_profile(get_accelerator("h100-sxm")).layer_gemm_extra_s(ds, True) == 0.0


@pytest.mark.parametrize("entry,match", [
    ({"kernels": 9, "kernel_s": 2.5e-6, "gemm_kernel_s": 5e-6}, "gemm_kernels must be a whole"),
    ({"kernels": 9, "kernel_s": 2.5e-6, "gemm_kernel_s": 5e-6, "gemm_kernels": 12},
     "gemm_kernels must be a whole"),
    ({"kernels": 9, "kernel_s": 2.5e-6, "gemm_kernel_s": -1e-6, "gemm_kernels": 4},
     "gemm_kernel_s must be a number >= 0"),
])
def test_bad_layer_floor_entries_are_refused(entry, match):
    with pytest.raises(ValueError, match=match):
        _layer_floor("cdna9", entry)


def test_moe_models_dense_gemms_pay_the_short_k_term_too():
    from simulator.cost.grouped_gemm import ExpertShape, MoELinearCost

    prof = kernel_profile(get_accelerator("h100-sxm"))
    experts = ExpertShape(((384.0, 4096.0), (4096.0, 192.0)), 10, 8, 128, 1)
    dense = [(4096.0, 1024.0)]  # e.g. a shared expert's down projection at high TP

    def seconds(k_half):
        return MoELinearCost(dense, experts, prof.grouped_gemm, 989e12, 0.8,
                             dense_k_half=k_half).compute(64)

    extra = seconds(400.0) - seconds(0.0)
    assert extra == pytest.approx(64 * 2 * 4096 * 400 / (989e12 * 0.8), rel=1e-9)
