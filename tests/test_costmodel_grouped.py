"""MoE routed experts priced as a grouped GEMM (simulator/cost/grouped_gemm.py): rows per
expert, BLOCK_SIZE_M padding, short-K pipeline fill, a ceiling below dense GEMMs."""

from __future__ import annotations

import math
import statistics

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.grouped_gemm import ExpertShape, MoELinearCost, block_m, padded_rows
from simulator.cost.hardware import get_accelerator
from simulator.cost.kernels import GroupedGemm, kernel_profile
from simulator.cost.params import CostParams
from tests.bench_helpers import load_diagnostic

G = GroupedGemm(relative=0.73, block_m=(16, 128), k_half=128.0)


def test_block_m_grows_with_rows_per_expert_within_bounds():
    assert [block_m(m, 16, 128) for m in (1, 15, 16, 40, 64, 100, 512, 9999)] == \
        [16, 16, 16, 32, 64, 64, 128, 128]


def test_padding_whole_tile_below_block_half_tile_above():
    ex = ExpertShape(((384, 4096), (4096, 192)), 1, 8, 128, 1)
    # decode: 8 tokens hit ~60 experts with ~1 row each, every one padded to 16 rows
    p = padded_rows(8, ex, G)
    assert p > 8 * 8 * 10
    # prefill: 8192 tokens -> 512 rows per expert, half a 128-row tile wasted per expert
    assert padded_rows(8192, ex, G) == pytest.approx(8192 * 8 + 128 * 64, rel=1e-6)
    # expert parallelism: pairs and experts split alike, rows per expert unchanged
    ex2 = ExpertShape(ex.gemms, 1, 8, 128, 2)
    assert padded_rows(8192, ex2, G) == pytest.approx(padded_rows(8192, ex, G) / 2, rel=1e-6)


def test_short_reduction_costs_more_per_flop():
    long_k = MoELinearCost([], ExpertShape(((4096, 4096),), 1, 8, 128, 1), G, 1e15, 0.8,
                           table_rows=8)
    short_k = MoELinearCost([], ExpertShape(((4096 * 4096 / 192, 192),), 1, 8, 128, 1), G,
                            1e15, 0.8, table_rows=8)
    assert long_k.flops_per_row == pytest.approx(short_k.flops_per_row)
    assert short_k.compute(4096) / long_k.compute(4096) == pytest.approx(
        (192 + 128) / 192 * 4096 / (4096 + 128), rel=1e-9)


def test_table_equals_formula_and_is_monotone():
    ex = ExpertShape(((384, 4096), (4096, 192)), 94, 8, 128, 1)
    lc = MoELinearCost([(12032, 4096)], ex, G, 989e12, 0.803, table_rows=4096)
    for r in (1, 7, 64, 513, 4096):
        assert lc.seconds(r) == pytest.approx(lc.compute(r), rel=1e-12)
    assert all(b >= a for a, b in zip(lc.table, lc.table[1:]))


@pytest.mark.parametrize("hw, d, f, E, k, M, measured_us", [
    # vLLM PR #24700: Mixtral-8x7B TP2 bf16 on H100, tuned config (benchmark_moe.py)
    ("h100-sxm", 4096, 7168, 8, 2, 1536, 1122.93),
    # vLLM PR #40542: E=64, N=1408, hidden 2048, top-6 bf16 on A100-SXM4-80GB, tuned
    ("a100-80gb-sxm", 2048, 1408, 64, 6, 4096, 2636.6),
])
def test_rule_reproduces_the_published_kernel_times(hw, d, f, E, k, M, measured_us):
    acc = get_accelerator(hw)
    g = kernel_profile(acc).grouped_gemm
    eff = CostParams.default_for(acc, "bf16").gemm_compute_efficiency
    lc = MoELinearCost([], ExpertShape(((2 * f, d), (d, f)), 1, k, E, 1), g,
                       acc.peak_flops("bf16"), eff, table_rows=8)
    assert lc.compute(M) * 1e6 == pytest.approx(measured_us, rel=0.05)


def test_moe_prefill_slower_than_dense_pricing_and_explained():
    cm = CostModel("qwen3-235b-a22b", "h100-sxm", "bf16", tp=8)
    shape = BatchShape.from_lists([8192], [0])
    br = cm.explain(shape)
    assert br.total_s == pytest.approx(cm.step_time(shape), rel=1e-9)
    op = next(o for o in br.ops if o.name == "moe_experts")
    assert "grouped GEMM" in op.source and "padded rows" in op.source
    # the expert GEMMs run below the dense efficiency (narrow per-rank experts at TP8)
    assert op.efficiency < 0.6 * cm.params.gemm_compute_efficiency


@pytest.mark.parametrize("model, hw, tp, dtype, M, measured_us", [
    # whole fused_experts call (align, both GEMMs, activation, sum) per MoE layer, M tokens
    ("mixtral-8x7b", "h100-sxm", 2, "bf16", 1, 144.03),  # vLLM PR #24700, tuned
    ("mixtral-8x7b", "h100-sxm", 2, "bf16", 16, 471.49),
    ("qwen3-30b-a3b", "a100-40gb-sxm", 1, "bf16", 1, 109.21),  # SGLang PR #6825 (A100-PCIe-40GB)
    ("qwen3-30b-a3b", "a100-40gb-sxm", 1, "bf16", 16, 611.19),
    ("qwen3-30b-a3b", "h100-sxm", 1, "fp8", 1, 40.44),  # vLLM PR #24700, Qwen3 MoE FP8
    ("qwen3-30b-a3b", "h100-sxm", 1, "fp8", 16, 164.64),
    ("qwen3-235b-a22b", "h200-sxm", 8, "fp8", 1, 31.70),  # SGLang PR #11730, default config
    ("qwen3-235b-a22b", "h200-sxm", 8, "fp8", 16, 92.36),
    # ROCm/aiter qwen3_235b_bf16_tuned_fmoe.csv (MI300X, CK 2-stage, tuned)
    ("qwen3-235b-a22b", "mi300x", 4, "bf16", 1, 34.06),
    ("qwen3-235b-a22b", "mi300x", 4, "bf16", 16, 218.24),
    ("qwen3-235b-a22b", "mi300x", 8, "bf16", 16, 116.72),
    ("qwen3-235b-a22b", "mi300x", 8, "bf16", 256, 194.35),
    # ROCm/aiter a8w8_blockscale_tuned_fmoe_ds_v3.csv (MI355X, CK 2-stage, shared expert fused)
    ("deepseek-v3", "mi355x", 4, "fp8", 16, 211.27),
    ("deepseek-v3", "mi355x", 4, "fp8", 256, 515.70),
])
def test_decode_experts_reproduce_the_published_kernel_times(model, hw, tp, dtype, M, measured_us):
    """Memory-bound routed experts: a fixed time per fused_experts call plus each GEMM's weights
    streamed at stream_efficiency x K/(K+k_half) (kernels.yaml grouped_gemm); the same tables
    by batch in bench/diagnostics/moe_kernels.py."""
    from simulator.core.batch_shape import BatchShape
    from simulator.cost.costmodel import CostModel

    cm = CostModel(model, hw, dtype, tp=tp)
    ops = {o.name: o for o in cm.explain(BatchShape.from_lists([1] * M, [64] * M)).ops}
    per_layer = ops["moe_experts"].time_s / cm.model.num_moe_layers + cm.kernels.grouped_gemm.call_s
    assert per_layer * 1e6 == pytest.approx(measured_us, rel=0.12)


def test_cdna_compute_bound_experts_follow_amds_tables():
    """From COMPUTE_BOUND_M tokens on, each CDNA arch's grouped_gemm.relative is the fit of its
    own BF16 fused-MoE tables (aiter CK kernels): the geometric mean of kvpd / measured is 1
    there, and no row is off by more than 15%."""
    diag = load_diagnostic("moe_kernels")
    for part in ("mi300x", "mi355x"):
        relative, ratios = diag.fit_relative(part)
        assert kernel_profile(get_accelerator(part)).grouped_gemm.relative == pytest.approx(
            relative, abs=0.005)
        assert math.exp(statistics.fmean(math.log(r) for r in ratios)) == pytest.approx(1, abs=0.01)
        assert all(0.85 <= r <= 1.15 for r in ratios), (part, ratios)
