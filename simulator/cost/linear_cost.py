"""Compute seconds of a stage's linear layers against the rows (tokens) they multiply, with
the kernel shape terms: tile and wave quantization over the part's SMs, and the per-pass
dequantization of weight-only (AWQ/GPTQ) kernels. Tabled per row count in `__init__`, so
the cost model's hot path only indexes a list.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.cost.kernels import WeightOnly, wave_utilization

# Rows tabled up front: covers every step of a `max_num_batched_tokens` <= 16,384 scheduler;
# larger steps are computed when asked (same formula).
TABLE_ROWS = 16384


class LinearCost:
    """Seconds of the tensor-core work of a set of GEMMs (one operator, all its layers).

    gemms: (N outputs, K inputs) of each GEMM one row goes through; `layers` repeats them.
    `seconds(rows)` = layers x sum over GEMMs of 2 rows N (K + k_half) / (peak x efficiency x
    wave utilization(rows, N)) + the dequantization passes of weight-only kernels. `k_half`:
    each output tile's fixed work (pipeline fill, epilogue) in elements of K, so a GEMM of
    reduction length K runs at K / (K + k_half) of the long-K efficiency (kernels.yaml
    gemm.tile_fixed_s, `KernelProfile.k_half`).
    """

    def __init__(self, gemms: list[tuple[int, int]], layers: int, peak_flops: float,
                 efficiency: float, tile: tuple[int, int] | None, sm_count: int | None,
                 weight_only: WeightOnly | None = None, alu_flops: float | None = None,
                 table_rows: int = TABLE_ROWS, k_half: float = 0.0) -> None:
        self.gemms, self.layers = gemms, layers
        self.k_half = k_half
        self.efficiency = efficiency  # of the peak, at full waves (explain reports it)
        self.rate = 1.0 / (peak_flops * efficiency)  # seconds per FLOP at full waves
        self.tile, self.sm_count = tile, sm_count
        self.weight_only = weight_only
        self.dequant_s = 0.0  # seconds of one dequantization pass over all the weights
        if weight_only is not None:
            if not alu_flops:
                raise ValueError("weight-only GEMMs need the part's fp32_tflops (dequantization)")
            nk = sum(n * k for n, k in gemms)
            self.dequant_s = layers * nk * weight_only.dequant_flops_per_weight / alu_flops
        self.flops_per_row = layers * sum(2.0 * n * k for n, k in gemms)
        # seconds per row at full waves (the short-K term included)
        self.per_row = layers * sum(2.0 * n * (k + k_half) for n, k in gemms) * self.rate
        # without shape terms the seconds are linear in the rows: no table
        self.shaped = bool(tile and sm_count) or weight_only is not None or k_half > 0
        self.table: list[float] | None = self._table(table_rows) if self.shaped else None

    def _table(self, max_rows: int) -> list[float]:
        """`compute(r)` for r = 0 .. max_rows, vectorised."""
        r = np.arange(1, max_rows + 1, dtype=np.float64)
        t = np.zeros_like(r)
        for n, k in self.gemms:
            if self.tile and self.sm_count:
                tm0, tn = self.tile
                tm = np.where(r < tm0, np.maximum(16.0, 2.0 ** np.ceil(np.log2(r))), tm0)
                tiles = np.ceil(r / tm) * math.ceil(n / tn)
                slots = np.where(tiles <= self.sm_count, tiles,
                                 np.ceil(tiles / self.sm_count) * self.sm_count)
                u = r * n / (slots * tm * tn)
            else:
                u = 1.0
            t += 2.0 * n * (k + self.k_half) / u
        t *= self.layers * r * self.rate
        if self.weight_only is not None:
            t += np.ceil(r / self.weight_only.rows_per_pass) * self.dequant_s
        return [0.0, *t.tolist()]

    def compute(self, rows: float) -> float:
        """Seconds of `rows` rows (the formula the table holds)."""
        if rows <= 0:
            return 0.0
        r = math.ceil(rows)
        t = 0.0
        for n, k in self.gemms:
            u = (wave_utilization(r, n, self.tile, self.sm_count)
                 if self.tile and self.sm_count else 1.0)
            t += 2.0 * n * (k + self.k_half) / u
        t *= self.layers * rows * self.rate
        if self.weight_only is not None:
            t += math.ceil(rows / self.weight_only.rows_per_pass) * self.dequant_s
        return t

    def seconds(self, rows: float) -> float:
        """`compute(rows)`, from the table when `rows` is a whole number inside it."""
        if self.table is None:
            return rows * self.per_row
        i = int(rows)
        if i == rows and i < len(self.table):
            return self.table[i]
        return self.compute(rows)

    def efficiency_factor(self, rows: float) -> float:
        """The shape's share of full-wave, long-K speed (wave quantization, short K and
        dequantization): ideal seconds / seconds."""
        t = self.seconds(rows)
        return rows * self.flops_per_row * self.rate / t if t > 0 else 1.0


class SummedLinearCost:
    """GEMMs of one operator that run at different rates, one after another: the routed
    experts and the matrices a quantization scope leaves out (shared experts, dense layers'
    MLPs) on parts without grouped-GEMM terms. Seconds and FLOPs add; `efficiency` and the
    shape factor are against the first part's rate, so the slower part reads as a loss."""

    def __init__(self, parts: list[LinearCost]) -> None:
        if not parts:
            raise ValueError("SummedLinearCost needs at least one LinearCost")
        self.parts = parts
        first = parts[0]
        self.efficiency, self.rate = first.efficiency, first.rate
        self.tile, self.sm_count, self.k_half = first.tile, first.sm_count, first.k_half
        self.weight_only = next((p.weight_only for p in parts if p.weight_only), None)
        self.flops_per_row = sum(p.flops_per_row for p in parts)
        self.per_row = sum(p.per_row for p in parts)
        self.shaped = any(p.shaped for p in parts)

    def compute(self, rows: float) -> float:
        """Seconds of `rows` rows: the parts' seconds added."""
        return sum(p.compute(rows) for p in self.parts)

    def seconds(self, rows: float) -> float:
        """The parts' `seconds(rows)` added (each from its own table)."""
        return sum(p.seconds(rows) for p in self.parts)

    def efficiency_factor(self, rows: float) -> float:
        """Ideal seconds at the first part's full-wave rate / seconds."""
        t = self.seconds(rows)
        return rows * self.flops_per_row * self.rate / t if t > 0 else 1.0
