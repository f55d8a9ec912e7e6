"""Compute seconds of an MoE stage's MLP on one rank, with the routed experts priced as the
grouped GEMM the engines run (vLLM/SGLang's Triton `fused_moe`), not as one dense GEMM:

- rows per expert: a step of T tokens routes T x k/ep token-expert pairs on a rank, spread
  over the `hit` experts of its E/ep that the tokens touch (moe_cost.expected_experts_hit),
  m = pairs / hit rows each;
- tile padding: `moe_align_block_size` pads each expert's rows to the kernel's BLOCK_SIZE_M,
  which the tuned configs grow with the rows per expert (16 at decode, up to 128 at
  prefill); on average each hit expert runs max(BM, m + BM/2) rows (half a tile wasted per
  expert once m >= BM, a whole tile when m < BM);
- short reduction: each output tile first fills its software pipeline ((num_stages - 1) x
  BLOCK_SIZE_K of K) before the first MMA, and the non-persistent kernel does not hide it,
  so a GEMM of reduction length K runs at K / (K + k_half) of its long-K rate; with TP the
  down projection's K is moe_intermediate / tp (192 for Qwen3-235B at TP8);
- vLLM before v0.17 ran shapes without a tuned config file on a fallback config
  (`CostModel(fused_moe_config="legacy_default")`: BLOCK_SIZE_M 16 while the step's tokens
  are at most the experts, else 64, BLOCK_SIZE_K 32, no warps or stages set; its own
  `relative`, `grouped_gemm.legacy_default` in kernels.yaml);
- a ceiling below dense GEMMs (`grouped_gemm.relative` x the part's dense efficiency);
  W8A8 (FP8/INT8) kernels run `grouped_gemm.fp8_speedup` x the BF16 kernel's rate
  (`CostModel._grouped_for_compute`), not the dense FP8 GEMMs' share of the doubled peak.

The router, shared experts and dense first layers stay dense GEMMs (no tile model, as
before). Tabled per row count like `LinearCost`; kernels.yaml `grouped_gemm` cites each
constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.cost.kernels import GroupedGemm, WeightOnly
from simulator.cost.linear_cost import TABLE_ROWS, LinearCost


@dataclass(frozen=True)
class ExpertShape:
    """The routed experts of one rank: GEMMs of one token-expert pair and how tokens route."""

    gemms: tuple[tuple[float, float], ...]  # (N, K) of one expert's GEMMs on this rank
    moe_layers: int
    top_k: int  # experts per token
    num_experts: int  # E (all ranks)
    ep: int  # expert-parallel ranks (1: every rank holds a 1/tp slice of every expert)


def expert_stream_factor(gemms: tuple[tuple[float, float], ...], k_half: float,
                         stream_efficiency: float, weight_stream_efficiency: float) -> float:
    """Seconds to stream one expert's weights over the seconds at the part's
    `weight_stream_efficiency`: each GEMM's (N x K) weights at `stream_efficiency` x K / (K +
    `k_half`) of the bandwidth, the same per-tile pipeline fill its compute pays (short K:
    the down projection at high TP). Fitted by hand to published fused_moe kernel tables
    (docs/gpu-runs.md, `bench/diagnostics/moe_kernels.py`)."""
    total = sum(n * k for n, k in gemms)
    slowed = sum(n * (k + k_half) for n, k in gemms)  # n k x (k + k_half) / k
    return weight_stream_efficiency / stream_efficiency * slowed / total


def block_m(m: float, lo: int, hi: int) -> int:
    """BLOCK_SIZE_M for `m` rows per expert: the largest power of two <= m within [lo, hi]."""
    if m < lo:
        return lo
    return max(lo, min(hi, 1 << int(math.floor(math.log2(m)))))


def padded_rows(tokens: float, ex: ExpertShape, g: GroupedGemm) -> float:
    """Rows the grouped GEMM runs on one rank for `tokens` tokens (pairs + tile padding)."""
    if tokens <= 0:
        return 0.0
    E, k = ex.num_experts, ex.top_k
    pairs = tokens * k / ex.ep
    hit = (E / ex.ep) * (1.0 - (1.0 - k / E) ** tokens)
    m = pairs / hit
    if g.block_m_by_tokens:  # vLLM's fallback: BLOCK_SIZE_M by the step's tokens vs E
        bm = g.block_m[0] if tokens <= E / ex.ep else g.block_m[1]
    else:
        bm = block_m(m, *g.block_m)
    return max(hit * bm, pairs + hit * bm / 2.0)


class MoELinearCost(LinearCost):
    """`LinearCost` of an MoE stage's MLP: `dense` GEMMs (router, shared experts, dense
    layers; linear in the rows) plus the routed experts as a grouped GEMM (see the module
    doc). Nominal FLOPs per row count k/ep expert pairs per token, so `efficiency_factor`
    reports the padding, short-K and grouped-kernel losses against the dense rate."""

    def __init__(self, dense: list[tuple[float, float]], experts: ExpertShape, grouped: GroupedGemm,
                 peak_flops: float, efficiency: float, weight_only: WeightOnly | None = None,
                 alu_flops: float | None = None, table_rows: int = TABLE_ROWS,
                 dense_k_half: float = 0.0, dense_rate: float | None = None,
                 dense_dequant: bool = True) -> None:
        """`dense_rate`: seconds per FLOP of the dense GEMMs when they run in another precision
        than the experts (quantization scope `experts`; default the experts' rate);
        `dense_dequant`: whether the dense GEMMs' weights pay the weight-only dequantization."""
        self.experts, self.grouped = experts, grouped
        copies = experts.moe_layers * experts.top_k / experts.ep  # expert GEMMs per token
        folded = [(n * copies, kk) for n, kk in experts.gemms]
        # seconds per padded row at the dense rate, short-K weighted, over the grouped ceiling
        self._pair_s = (experts.moe_layers * sum(2.0 * n * kk * (kk + grouped.k_half) / kk
                                                 for n, kk in experts.gemms)
                        / (peak_flops * efficiency * grouped.relative))
        # the dense GEMMs' FLOPs per row, with their short-K term (KernelProfile.k_half)
        self._dense_flops = sum(2.0 * n * (kk + dense_k_half) for n, kk in dense)
        self._dense_rate = 1.0 / (peak_flops * efficiency) if dense_rate is None else dense_rate
        super().__init__(dense + folded, 1, peak_flops, efficiency, None, None, weight_only,
                         alu_flops, table_rows)
        self.per_row += self._dense_flops * (self._dense_rate - self.rate)
        if weight_only is not None and not dense_dequant:
            self.dequant_s *= sum(n * k for n, k in folded) / sum(n * k for n, k in dense + folded)
        self.shaped = True  # (LinearCost tables only shaped costs; this one always is)
        self.table = self._table(table_rows)

    def _table(self, max_rows: int) -> list[float]:
        r = np.arange(1, max_rows + 1, dtype=np.float64)
        ex, g = self.experts, self.grouped
        pairs = r * ex.top_k / ex.ep
        hit = (ex.num_experts / ex.ep) * (1.0 - (1.0 - ex.top_k / ex.num_experts) ** r)
        m = pairs / hit
        lo, hi = g.block_m
        if g.block_m_by_tokens:  # vLLM's fallback: BLOCK_SIZE_M by the step's tokens vs E
            bm = np.where(r <= ex.num_experts / ex.ep, lo, hi)
        else:
            bm = np.where(m < lo, lo,
                          np.clip(2.0 ** np.floor(np.log2(np.maximum(m, 1.0))), lo, hi))
        padded = np.maximum(hit * bm, pairs + hit * bm / 2.0)
        t = r * self._dense_flops * self._dense_rate + padded * self._pair_s
        if self.weight_only is not None:
            t += np.ceil(r / self.weight_only.rows_per_pass) * self.dequant_s
        return [0.0, *t.tolist()]

    def padded(self, rows: float) -> float:
        """Rows (token-expert pairs plus tile padding) the grouped GEMM runs for `rows` tokens."""
        return padded_rows(rows, self.experts, self.grouped)

    def compute(self, rows: float) -> float:
        if rows <= 0:
            return 0.0
        t = (rows * self._dense_flops * self._dense_rate
             + padded_rows(rows, self.experts, self.grouped) * self._pair_s)
        if self.weight_only is not None:
            t += math.ceil(rows / self.weight_only.rows_per_pass) * self.dequant_s
        return t
