"""Dense GEMM kernel time at decode-sized batches (M <= 16 token rows) against published kernel
tables: kvpd prices a memory-bound GEMM at `layer_floor.gemm_kernel_s` (else `kernel_s`, its
share of the layer floor) + its weight bytes / (`weight_stream_efficiency` x HBM bandwidth).

The CDNA 3 and CDNA 4 tables are AMD's own tuned kernel times (the fastest kernel the aiter
tuner found per shape, the same weights every repeat); `kernels.yaml`'s cdna3 / cdna4
`gemm_kernel_s` and `weight_stream_efficiency` are the least-squares fit t = c + weight bytes
/ (e x peak) over every row (FP8 / INT8: one byte per weight; the activations and outputs,
a few percent of the bytes at M <= 16, are left out). The NVIDIA rows are shown as a check,
not fitted to: kvpd's Hopper and Blackwell figures stay as they are (BF16 and FP8 at M = 1,
within 1.01-1.23 of them, kvpd the slower).

The compute-bound end (M >= 4096, COMPUTE): full-wave GEMM efficiency against the reduction
length K on H800 (DeepGEMM) and MI300X / MI355X (aiter), fitted e x K / (K + k): kernels.yaml's
`gemm.tile_fixed_s` (k as a time per tile) and long-K `fp8_relative` / `fp4_relative`. B200's
NVFP4 GEMMs (CHECK_COMPUTE) are shown against kvpd's price, not fitted.

    python bench/diagnostics/gemm_kernels.py
"""

from __future__ import annotations

import statistics

import numpy as np

from simulator.cost.hardware import get_accelerator
from simulator.cost.kernels import kernel_profile, wave_utilization

AITER = "ROCm/aiter e4048607a5, aiter/configs/"
# (label, part, weight bytes per element, source, [(M, N, K, measured us)])
TABLES = [
    ("MI300X FP8 block-scale GEMMs (aiter tuned, gfx942, 304 CUs)", "mi300x", 1,
     AITER + "model_configs/a8w8_blockscale_tuned_gemm_{ds_v3,glm5_1,qwen36_27b,qwen3_vl_235b}.csv, "
     "rows gfx942 cu_num 304, M <= 16, the fastest per shape",
     [
        (1, 512, 6144, 6.23), (1, 2048, 2048, 5.22), (1, 2624, 6144, 11.82),
        (1, 3072, 1536, 6.62), (1, 3072, 6144, 12.18), (1, 4096, 2048, 6.95),
        (1, 6144, 256, 3.04), (1, 6144, 1536, 7.38), (1, 6144, 2048, 8.40), (2, 512, 6144, 4.96),
        (2, 2048, 2048, 4.22), (2, 2624, 6144, 11.82), (2, 3072, 1536, 6.62),
        (2, 3072, 6144, 12.06), (2, 4096, 512, 3.49), (2, 4096, 2048, 8.22), (2, 6144, 256, 3.01),
        (2, 6144, 1536, 7.29), (2, 6144, 2048, 8.44), (2, 7168, 2048, 8.10), (4, 512, 6144, 6.07),
        (4, 2048, 2048, 6.55), (4, 2624, 6144, 11.90), (4, 3072, 1536, 6.69),
        (4, 3072, 6144, 12.12), (4, 4096, 512, 3.55), (4, 4096, 2048, 8.15), (4, 6144, 256, 3.56),
        (4, 6144, 1536, 7.54), (4, 6144, 2048, 8.52), (4, 7168, 2048, 8.11), (8, 512, 6144, 4.99),
        (8, 2048, 2048, 6.08), (8, 2624, 6144, 11.89), (8, 3072, 1536, 6.73),
        (8, 3072, 6144, 12.33), (8, 4096, 2048, 8.46), (8, 6144, 256, 3.08),
        (8, 6144, 1536, 7.44), (8, 6144, 2048, 8.57), (8, 7168, 2048, 7.95),
        (16, 256, 7168, 10.82), (16, 512, 6144, 5.19), (16, 512, 7168, 11.08),
        (16, 576, 7168, 11.58), (16, 1280, 4096, 14.66), (16, 1536, 7168, 11.54),
        (16, 2048, 2048, 6.73), (16, 2048, 5120, 17.31), (16, 2112, 7168, 11.93),
        (16, 2304, 4096, 15.04), (16, 2624, 6144, 11.95), (16, 3072, 1536, 6.77),
        (16, 3072, 6144, 12.48), (16, 3584, 5120, 17.66), (16, 4096, 512, 3.60),
        (16, 4096, 1024, 6.24), (16, 4096, 2048, 8.37), (16, 4096, 4096, 15.54),
        (16, 4096, 5120, 17.74), (16, 4352, 5120, 17.60), (16, 4608, 4096, 15.49),
        (16, 4608, 7168, 14.21), (16, 5120, 768, 5.13), (16, 5120, 1536, 7.71),
        (16, 5120, 2176, 11.23), (16, 5120, 3072, 11.75), (16, 5120, 4352, 14.56),
        (16, 5120, 8704, 28.84), (16, 6144, 256, 3.15), (16, 6144, 1536, 7.37),
        (16, 6144, 2048, 8.67), (16, 7168, 256, 3.22), (16, 7168, 2048, 8.37),
        (16, 7168, 2304, 8.89), (16, 7168, 5120, 18.64), (16, 8192, 1536, 7.64),
        (16, 8192, 5120, 19.17), (16, 8704, 5120, 19.09), (16, 17408, 5120, 27.35),
     ]),
    ("MI355X INT8/FP8 row-wise GEMMs (aiter tuned, gfx950, 256 CUs)", "mi355x", 1,
     AITER + "a8w8_tuned_gemm.csv, rows gfx950 cu_num 256, M <= 16, the fastest per shape",
     [
        (1, 100, 5120, 8.75), (1, 200, 5120, 9.02), (1, 800, 5120, 11.55), (1, 1280, 8192, 7.68),
        (1, 2304, 16384, 28.79), (1, 2560, 8192, 17.47), (1, 4608, 16384, 30.49),
        (1, 5120, 640, 4.32), (1, 5120, 1280, 6.10), (1, 5120, 3200, 9.81),
        (1, 5120, 5120, 12.32), (1, 5120, 6400, 14.58), (1, 5120, 25600, 47.14),
        (1, 6400, 5120, 12.75), (1, 7168, 8192, 19.02), (1, 8192, 1024, 5.72),
        (1, 8192, 2048, 7.16), (1, 8192, 3584, 11.25), (1, 8192, 7168, 16.94),
        (1, 8192, 8192, 19.47), (1, 8192, 28672, 59.83), (1, 9216, 16384, 34.12),
        (1, 10240, 8192, 20.56), (1, 12800, 5120, 14.70), (1, 13312, 16384, 43.98),
        (1, 16384, 2048, 8.22), (1, 16384, 4096, 15.91), (1, 16384, 6656, 22.40),
        (1, 16384, 8192, 29.39), (1, 16384, 13312, 39.09), (1, 16384, 26624, 73.98),
        (1, 26624, 16384, 88.26), (1, 51200, 5120, 50.04), (1, 53248, 16384, 170.12),
        (1, 57344, 8192, 88.90), (16, 100, 5120, 8.74), (16, 200, 5120, 10.47),
        (16, 800, 5120, 11.72), (16, 1024, 8192, 8.20), (16, 1280, 8192, 8.90),
        (16, 2304, 16384, 23.50), (16, 2560, 8192, 14.82), (16, 3584, 8192, 10.69),
        (16, 4608, 16384, 25.71), (16, 5120, 640, 4.38), (16, 5120, 1280, 6.10),
        (16, 5120, 3200, 9.13), (16, 5120, 5120, 11.14), (16, 5120, 6400, 14.88),
        (16, 5120, 25600, 38.76), (16, 6400, 5120, 11.55), (16, 7168, 8192, 15.54),
        (16, 7424, 8192, 16.17), (16, 8192, 1024, 5.46), (16, 8192, 2048, 7.26),
        (16, 8192, 3584, 10.65), (16, 8192, 7168, 15.21), (16, 8192, 8192, 17.23),
        (16, 8192, 28672, 55.95), (16, 9216, 16384, 33.17), (16, 10240, 8192, 18.61),
        (16, 12800, 5120, 14.26), (16, 13312, 16384, 45.46), (16, 16384, 2048, 8.21),
        (16, 16384, 4096, 16.22), (16, 16384, 6656, 21.74), (16, 16384, 8192, 29.65),
        (16, 16384, 13312, 38.68), (16, 16384, 26624, 73.77), (16, 26624, 16384, 86.89),
        (16, 28672, 8192, 46.94), (16, 51200, 5120, 51.73), (16, 53248, 16384, 180.79),
        (16, 57344, 8192, 90.92),
     ]),
    ("H100 SXM BF16 torch.nn.functional.linear (cuBLAS), M = 1 (not fitted)", "h100-sxm", 2,
     "vLLM PR #17126 (Llama-3.1-8B N=6144 K=4096: 2.513 TFLOP/s) and PR #49363 (gemma-4-31B "
     "N=12288 / 43008, K=5376: 2.870 / 3.072 TFLOP/s), benchmarks/kernels/bench_fp8_gemm.py",
     [(1, 6144, 4096, 20.03), (1, 12288, 5376, 46.03), (1, 43008, 5376, 150.52)]),
    ("B200 BF16 torch.nn.functional.linear (cuBLAS), M = 1 (not fitted)", "b200", 2,
     "vLLM PR #18778 (Llama-3.1-8B N=6144 K=4096: 5.910 TFLOP/s), bench_fp8_gemm.py",
     [(1, 6144, 4096, 8.52)]),
    ("H100 SXM FP8 GEMMs (vLLM's CUTLASS, activations already quantized), M = 1 (not fitted)",
     "h100-sxm", 1,
     "vLLM PR #17126 (Llama-3.1-8B N=6144 K=4096, fp8-tensor-w-tensor-a-noquant: 5.445 TFLOP/s) "
     "and PR #49363 (gemma-4-31B N=43008 K=5376, the same column: 6.077 TFLOP/s), "
     "bench_fp8_gemm.py",
     [(1, 6144, 4096, 9.24), (1, 43008, 5376, 76.09)]),
    ("B200 FP8 GEMMs (vLLM's CUTLASS, activations already quantized), M = 1 (not fitted)",
     "b200", 1,
     "vLLM PR #19566 (Llama-3.1-8B N=6144 K=4096, fp8-tensor-w-tensor-a-noquant: 8.431 TFLOP/s), "
     "bench_fp8_gemm.py",
     [(1, 6144, 4096, 5.97)]),
]
FITTED = 2  # the first FITTED tables set kernels.yaml's cdna3 / cdna4 figures

# Compute-bound (large M) GEMMs: the fraction of the part's peak the kernels reach at full
# waves (efficiency 2 M N K / time / peak / wave utilization of 128 x 128 tiles), against the
# reduction length K. kernels.yaml's `gemm.tile_fixed_s` (k elements of K at the fit's rate per
# SM) and `fp8_relative` / `fp4_relative` come from the least-squares fit e x K / (K + k) of these
# rows (`fit_k`).
# The MI300X / MI355X rows are per-K medians of the tuned kernels with M >= 4096, N >= 1024 in
# the named files (too many to keep here; the rule reproduces them).
# (label, part, precision, source, [(K, GEMMs, full-wave efficiency)], k fixed or None)
COMPUTE = [
    ("H800 FP8 DeepGEMM, M = 4096 (H100 SXM compute)", "h100-sxm", "fp8",
     "deepseek-ai/DeepGEMM README (2025-02), 'Normal GEMMs for dense models': N x K = 2112 x "
     "7168, 24576 x 1536, 32768 x 512, 7168 x 16384, 4096 x 7168, 7168 x 2048 at 1058, 990, 590, "
     "1358, 1304, 1025 TFLOP/s",
     [(7168, 1, 0.649), (1536, 1, 0.505), (512, 1, 0.298), (16384, 1, 0.707), (7168, 1, 0.679),
      (2048, 1, 0.534)], None),
    ("MI300X FP8 block-scale, M >= 4096 (gfx942, 304 CUs)", "mi300x", "fp8",
     AITER + "model_configs/a8w8_blockscale_tuned_gemm_{ds_v3,glm5_1,qwen36_27b,qwen3_vl_235b}"
     ".csv: 11,802 GEMMs",
     [(256, 101, 0.156), (512, 5, 0.197), (768, 594, 0.250), (1024, 594, 0.263),
      (1536, 700, 0.295), (2048, 795, 0.317), (2176, 594, 0.321), (2304, 3, 0.390),
      (3072, 594, 0.322), (4096, 2376, 0.323), (4352, 594, 0.337), (5120, 4752, 0.316),
      (6144, 196, 0.379), (7168, 10, 0.380), (8704, 594, 0.307)], None),
    ("MI355X BF16, M >= 4096 (gfx950, 256 CUs; tile time from cdna3)", "mi355x", "bf16",
     AITER + "bf16_tuned_gemm.csv and model_configs/*_bf16_tuned_gemm.csv: 258 GEMMs",
     [(512, 5, 0.326), (640, 4, 0.343), (768, 1, 0.378), (1024, 4, 0.455), (1280, 4, 0.433),
      (1536, 3, 0.467), (2048, 13, 0.531), (2880, 6, 0.427), (3072, 4, 0.534), (3200, 4, 0.526),
      (3584, 5, 0.566), (4096, 43, 0.544), (4224, 1, 0.558), (4608, 4, 0.581), (5120, 16, 0.568),
      (6144, 27, 0.541), (6400, 4, 0.570), (6656, 4, 0.606), (7168, 24, 0.560),
      (8192, 34, 0.588), (12288, 4, 0.607), (13312, 4, 0.600), (16384, 24, 0.568),
      (18432, 4, 0.610), (25600, 4, 0.584), (26624, 4, 0.593), (28672, 4, 0.612)],
     "tile_fixed_s"),
    ("MI355X FP8 block-scale, M >= 4096 (gfx950, 256 CUs; tile time from cdna3)", "mi355x", "fp8",
     AITER + "a8w8_blockscale_tuned_gemm.csv and model_configs/a8w8_blockscale_tuned_gemm_*.csv "
     "(not the bpreshuffle ones): 9,341 GEMMs",
     [(128, 34, 0.046), (256, 11, 0.101), (384, 8, 0.124), (512, 2289, 0.159), (1024, 35, 0.174),
      (1536, 376, 0.232), (2048, 530, 0.242), (2304, 10, 0.239), (3072, 4631, 0.273),
      (4096, 171, 0.282), (4608, 104, 0.300), (6144, 936, 0.295), (7168, 177, 0.306),
      (8192, 4, 0.377), (9216, 3, 0.452), (16384, 11, 0.447), (18432, 11, 0.458)],
     "tile_fixed_s"),
    ("MI355X MXFP4 block-scale, M >= 4096 (gfx950, 256 CUs; tile time from cdna3)", "mi355x",
     "fp4",
     AITER + "a4w4_blockscale_tuned_gemm.csv: 292 GEMMs",
     [(512, 13, 0.158), (768, 1, 0.160), (1024, 6, 0.244), (1280, 5, 0.252), (1536, 12, 0.288),
      (1792, 1, 0.306), (2048, 12, 0.327), (2304, 5, 0.186), (3072, 8, 0.321), (3328, 1, 0.313),
      (3584, 5, 0.400), (4096, 24, 0.430), (4608, 1, 0.404), (5120, 16, 0.417),
      (5376, 3, 0.392), (5632, 1, 0.356), (5888, 1, 0.384), (6144, 12, 0.431),
      (6400, 5, 0.413), (6656, 4, 0.488), (7168, 23, 0.391), (7680, 1, 0.454),
      (8192, 44, 0.497), (8704, 1, 0.479), (10240, 1, 0.512), (10752, 1, 0.511),
      (12288, 4, 0.518), (12544, 1, 0.451), (12800, 1, 0.466), (13312, 4, 0.541),
      (13824, 1, 0.523), (14336, 4, 0.515), (15360, 1, 0.530), (16384, 45, 0.541),
      (17920, 1, 0.515), (18432, 4, 0.528), (25600, 4, 0.510), (26624, 4, 0.570),
      (28672, 4, 0.574), (53248, 4, 0.572), (60672, 1, 0.505), (61696, 1, 0.503),
      (68096, 1, 0.530)], "tile_fixed_s"),
]

# Compute-bound GEMMs shown as a check, not fitted: (label, part, precision, source,
# [(M, N, K, measured TFLOP/s)]); kvpd's time is its long-K efficiency x K / (K + k_half) x the
# wave utilization of its tiles.
CHECK_COMPUTE = [
    ("B200 NVFP4 dense GEMMs (CUTLASS, the activations already quantized)", "b200", "fp4",
     "vLLM PR #20646 ('Before' table, benchmarks/kernels/bench_nvfp4_gemm.py, Llama-3.1-8B "
     "N=6144 K=4096, nvfp4-noquant column); FlashInfer PR #1979 (flashinfer_benchmark.py mm_fp4 "
     "--m 1024 --n 7168 --k 4608 --use_nvfp4 on SM100, cutlass backend)",
     [(2048, 6144, 4096, 3411.5), (4096, 6144, 4096, 3645.6), (8192, 6144, 4096, 3778.8),
      (16384, 6144, 4096, 3904.3), (1024, 7168, 4608, 3370.4)]),
]


def kvpd_tflops(part: str, precision: str, m: int, n: int, k: int) -> float:
    """kvpd's TFLOP/s of one compute-bound GEMM (catalog defaults, no layer floor)."""
    acc = get_accelerator(part)
    e, k_half = kvpd_compute_efficiency(part, precision)
    u = wave_utilization(m, n, kernel_profile(acc).tile, acc.sm_count)
    return acc.peak_flops(precision) * e * k / (k + k_half) * u / 1e12


def fit_k(rows, k_of_e=None) -> tuple[float, float]:
    """Least squares of log(e K / (K + k)) against the rows' log efficiencies, weighted by
    their GEMM counts: (e, k). `k_of_e`: k as a function of e (a fixed tile time), else k is
    fitted (a 1-element-of-K grid)."""
    K = np.array([r[0] for r in rows], dtype=np.float64)
    w = np.array([r[1] for r in rows], dtype=np.float64)
    y = np.log([r[2] for r in rows])

    def best_e(k):
        return float(np.exp(np.sum(w * (y - np.log(K / (K + k)))) / w.sum()))

    def loss(k):
        e = best_e(k)
        return float(np.sum(w * (np.log(e * K / (K + k)) - y) ** 2))

    if k_of_e is not None:  # e and k together: iterate to the fixed point
        e = float(np.exp(y.mean()))
        for _ in range(50):
            e = best_e(k_of_e(e))
        return e, k_of_e(e)
    k = min(range(1, 4001), key=loss)
    return best_e(k), float(k)


def kvpd_compute_efficiency(part: str, precision: str) -> tuple[float, float]:
    """kvpd's long-K GEMM efficiency of `precision` on `part` (fraction of its peak) and its
    k_half (elements of K)."""
    acc = get_accelerator(part)
    k = kernel_profile(acc)
    e = (acc.matmul_efficiency or k.bf16_efficiency) * k.relative(precision)
    return e, k.k_half(acc.peak_flops(precision) * e, acc.sm_count)


def fitted_compute(row) -> tuple[float, float]:
    """`fit_k` of a COMPUTE row (k from the part's tile time where the row says so)."""
    _, part, precision, _, rows, fixed = row
    if fixed is None:
        return fit_k(rows)
    acc = get_accelerator(part)
    k = kernel_profile(acc)
    return fit_k(rows, lambda e: k.k_half(acc.peak_flops(precision) * e, acc.sm_count))


def weight_mb(row: tuple[int, int, int, float], elem_bytes: int) -> float:
    _, n, k, _ = row
    return n * k * elem_bytes / 1e6


def fit(rows, elem_bytes: int, peak_tbps: float) -> tuple[float, float]:
    """Least squares t = c + MB / (e x peak): (c in s, e)."""
    mb = np.array([weight_mb(r, elem_bytes) for r in rows])
    t = np.array([r[3] for r in rows])
    (c, per_mb), *_ = np.linalg.lstsq(np.vstack([np.ones_like(mb), mb]).T, t, rcond=None)
    return c * 1e-6, 1.0 / per_mb / peak_tbps


def kvpd_us(part: str, row, elem_bytes: int) -> float:
    """kvpd's seconds (us) of one memory-bound GEMM of `row` on `part` (catalog defaults)."""
    acc = get_accelerator(part)
    k = kernel_profile(acc)
    return (k.dense_gemm_kernel_s + weight_mb(row, elem_bytes) * 1e6
            / (k.weight_stream_efficiency * acc.mem_bw_bytes_per_s)) * 1e6


def main() -> None:
    for i, (label, part, eb, source, rows) in enumerate(TABLES):
        acc = get_accelerator(part)
        k = kernel_profile(acc)
        peak = acc.mem_bw_bytes_per_s / 1e12
        print(f"{label}\n  source: {source}")
        ratios = [kvpd_us(part, r, eb) / r[3] for r in rows]
        if i < FITTED:
            c, e = fit(rows, eb, peak)
            print(f"  fit over {len(rows)} GEMMs ({min(weight_mb(r, eb) for r in rows):.1f}-"
                  f"{max(weight_mb(r, eb) for r in rows):.0f} MB of weights): t = {c * 1e6:.2f} us "
                  f"+ bytes / ({e:.3f} x {peak:.1f} TB/s)")
        fixed = k.dense_gemm_kernel_s
        print(f"  kvpd ({k.arch}): {fixed * 1e6:.2f} us + bytes / ({k.weight_stream_efficiency} x "
              f"{peak:.1f} TB/s); kvpd / measured: median {statistics.median(ratios):.2f}, "
              f"range {min(ratios):.2f}-{max(ratios):.2f}")
        if len(rows) <= 6:
            for r, q in zip(rows, ratios):
                print(f"    M={r[0]} N={r[1]} K={r[2]}: measured {r[3]:.1f} us, kvpd "
                      f"{q * r[3]:.1f} us ({q:.2f})")
        print()
    for row in COMPUTE:
        label, part, precision, source, rows, _ = row
        e, k = fitted_compute(row)
        ke, kk = kvpd_compute_efficiency(part, precision)
        print(f"{label}\n  source: {source}\n  fit: {e:.3f} x K / (K + {k:.0f}) over "
              f"{sum(r[1] for r in rows)} GEMMs at K = {min(r[0] for r in rows)}-"
              f"{max(r[0] for r in rows)}; kvpd: {ke:.3f} x K / (K + {kk:.0f})\n")
    for label, part, precision, source, rows in CHECK_COMPUTE:
        print(f"{label} (a check, not fitted)\n  source: {source}")
        for m, n, k, measured in rows:
            ours = kvpd_tflops(part, precision, m, n, k)
            print(f"    M={m} N={n} K={k}: measured {measured:.0f} TFLOP/s, kvpd {ours:.0f} "
                  f"({ours / measured:.2f})")
        print()

if __name__ == "__main__":
    main()
