"""FlashAttention forward efficiency against published kernel tables, non-causal and causal:
kvpd prices a prefill query's attention at efficiency x k / (k + half_keys + causal keys),
k the keys it attends to on average (kernels.yaml attn_prefill: `efficiency`, `half_keys`,
`causal_tile_s`, the causal diagonal's extra time per 128-query tile).

Each table gives the fit e x k / (k + h) of its non-causal rows and the extra keys per query its
causal rows need (k = (S + 1) / 2), as a time per tile at the fit's rate per SM; then kvpd's
efficiency for the same rows where kvpd models that kernel (FA3 on Hopper, FA4 on Blackwell,
AMD's asm kernels on MI300X and MI355X).

    python bench/diagnostics/attention.py
"""

from __future__ import annotations

from functools import cache

import numpy as np
from gemm_kernels import fit_k  # bench/diagnostics is on sys.path as a script

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_accelerator
from simulator.cost.kernels import ATTN_QUERY_TILE, kernel_profile

HEAD_DIM = 128
# AMD's asm FlashAttention forward (aiter), bf16, hd128, 8 or 4 KV heads: (batch, query heads,
# S, causal, MI300X TFLOP/s, MI355X TFLOP/s); ROCm/aiter ce08b75719, op_tests/cpp/mha/README.md
AITER_FA = [
    (1, 32, 1024, 0, 338.07, 613.48), (1, 32, 2048, 0, 513.45, 1194.46),
    (1, 32, 4096, 0, 527.73, 1177.11), (1, 32, 8192, 0, 558.17, 1396),
    (1, 32, 10240, 0, 549.73, 1421.77), (4, 32, 1024, 0, 458.41, 956.51),
    (4, 32, 2048, 0, 504.8, 1092.82), (4, 32, 4096, 0, 577.16, 1343.02),
    (4, 32, 8192, 0, 574.62, 1407.46), (4, 32, 10240, 0, 584.66, 1414.26),
    (8, 32, 1024, 0, 459.43, 891.28), (8, 32, 2048, 0, 543.77, 1175.5),
    (8, 32, 4096, 0, 567.82, 1351.12), (8, 32, 8192, 0, 585.29, 1406.47),
    (8, 32, 10240, 0, 577.5, 1366.47), (1, 64, 1024, 0, 418.36, 1003.73),
    (1, 64, 2048, 0, 485.45, 1018.07), (1, 64, 4096, 0, 546.34, 1305.83),
    (1, 64, 8192, 0, 591.37, 1412.91), (1, 64, 10240, 0, 572.09, 1417.43),
    (4, 64, 1024, 0, 440.07, 914.7), (4, 64, 2048, 0, 554.8, 1201.6),
    (4, 64, 4096, 0, 573.6, 1360.79), (4, 64, 8192, 0, 592.16, 1407.58),
    (4, 64, 10240, 0, 578.93, 1358.41), (8, 64, 1024, 0, 466.21, 979.93),
    (8, 64, 2048, 0, 556.35, 1250.96), (8, 64, 4096, 0, 578.99, 1361.66),
    (8, 64, 8192, 0, 577.45, 1322.77), (8, 64, 10240, 0, 571.39, 1326.91),
    (1, 64, 1024, 0, 383.85, 1017.04), (1, 64, 2048, 0, 506.89, 1077.21),
    (1, 64, 4096, 0, 549.2, 1299.05), (1, 64, 8192, 0, 591.77, 1406.35),
    (1, 64, 10240, 0, 571.59, 1429.39), (4, 64, 1024, 0, 460.34, 923.01),
    (4, 64, 2048, 0, 556.35, 1224.58), (4, 64, 4096, 0, 575.69, 1360.36),
    (4, 64, 8192, 0, 590.93, 1411.19), (4, 64, 10240, 0, 582.64, 1356.52),
    (8, 64, 1024, 0, 497.15, 1016.32), (8, 64, 2048, 0, 556.22, 1262.85),
    (8, 64, 4096, 0, 581.34, 1362.68), (8, 64, 8192, 0, 583.23, 1324),
    (8, 64, 10240, 0, 566.17, 1325.23), (1, 64, 16384, 0, 547.78, 1437.62),
    (1, 64, 16384, 0, 549.09, 1432.94), (1, 32, 1024, 1, 130.62, 233.12),
    (1, 32, 2048, 1, 255.105, 577.28), (1, 32, 4096, 1, 467.805, 949.325),
    (1, 32, 8192, 1, 522.68, 1247.73), (1, 32, 10240, 1, 440.12, 1200.64),
    (4, 32, 1024, 1, 334.005, 720.995), (4, 32, 2048, 1, 419.435, 809.835),
    (4, 32, 4096, 1, 486.73, 1130.12), (4, 32, 8192, 1, 547.09, 1318.92),
    (4, 32, 10240, 1, 527.705, 1342.99), (8, 32, 1024, 1, 311.385, 623.93),
    (8, 32, 2048, 1, 412.99, 894.45), (8, 32, 4096, 1, 513.1, 1166.88),
    (8, 32, 8192, 1, 537.36, 1316.81), (8, 32, 10240, 1, 556.045, 1334.87),
    (1, 64, 1024, 1, 228.54, 432.565), (1, 64, 2048, 1, 392.425, 936.435),
    (1, 64, 4096, 1, 474.385, 1046.09), (1, 64, 8192, 1, 518.29, 1300.11),
    (1, 64, 10240, 1, 510.895, 1338.01), (4, 64, 1024, 1, 326.51, 638.705),
    (4, 64, 2048, 1, 425.735, 899.845), (4, 64, 4096, 1, 513.79, 1174.92),
    (4, 64, 8192, 1, 540.515, 1319.22), (4, 64, 10240, 1, 557.475, 1337.96),
    (8, 64, 1024, 1, 321.865, 626.57), (8, 64, 2048, 1, 452.03, 963.165),
    (8, 64, 4096, 1, 509.255, 1190.3), (8, 64, 8192, 1, 550.67, 1311.95),
    (8, 64, 10240, 1, 547.05, 1313.69), (1, 64, 1024, 1, 229.09, 421.615),
    (1, 64, 2048, 1, 407.525, 949.635), (1, 64, 4096, 1, 476.26, 1058.9),
    (1, 64, 8192, 1, 519.32, 1318.15), (1, 64, 10240, 1, 515.275, 1348.15),
    (4, 64, 1024, 1, 314.82, 661.045), (4, 64, 2048, 1, 426.77, 896.095),
    (4, 64, 4096, 1, 524.585, 1182.87), (4, 64, 8192, 1, 540.935, 1324.28),
    (4, 64, 10240, 1, 560.63, 1346.46), (8, 64, 1024, 1, 348.76, 663.48),
    (8, 64, 2048, 1, 461.89, 983.355), (8, 64, 4096, 1, 513.795, 1196.67),
    (8, 64, 8192, 1, 552.78, 1318.92), (8, 64, 10240, 1, 548.65, 1313.94),
    (1, 64, 16384, 1, 541.55, 1392.48), (1, 64, 16384, 1, 544.1, 1398.14),
]
WAVES = 2  # rows whose 128-query tiles fill the GPU at least this many times are fitted


def aiter_rows(column: int, sm_count: int):
    """(non-causal, causal) [(S, TFLOP/s)] of AITER_FA's `column` (4: MI300X, 5: MI355X), the
    rows with batch x heads x S / 128 >= WAVES x the part's CUs (fewer leave CUs idle, which
    kvpd's attention model does not price)."""
    full = [r for r in AITER_FA if r[0] * r[1] * r[2] / 128 >= WAVES * sm_count]
    return ([(r[2], r[column]) for r in full if not r[3]],
            [(r[2], r[column]) for r in full if r[3]])
# (label, part, kvpd models this kernel, source, non-causal [(S, TFLOP/s)], causal [(S, TFLOP/s)])
# (causal TFLOP/s count the causal half of the pairs, as the FlashAttention benchmarks do)
TABLES = [
    ("H100 FlashAttention-3, hd128, non-causal", "h100-sxm", True,
     "pytorch/benchmark PR #2391 (B x S = 16k, 16 heads)",
     [(512, 430.32), (1024, 517.10), (2048, 565.54), (4096, 590.23), (8192, 614.23),
      (16384, 620.73)], []),
    ("H100 FlashAttention-2, hd128 (the causal tile time of the hopper entry)", "h100-sxm",
     False, "pytorch/benchmark PR #2443, flash_v2 latencies (B x S = 16k, 16 heads) as TFLOP/s",
     [(512, 290.2), (1024, 327.5), (2048, 344.2), (4096, 352.7), (8192, 356.2),
      (16384, 357.9)],
     [(512, 183.3), (1024, 247.1)]),
    ("B200 FlashAttention-4, hd128", "b200", True,
     "Dao-AILab/flash-attention PR #2605, FA4 column",
     [(1024, 1540), (2048, 1706), (4096, 1796), (8192, 1837), (16384, 1882)],
     [(1024, 829), (2048, 1172), (4096, 1431)]),
    ("MI300X aiter asm FlashAttention, hd128", "mi300x", True,
     "ROCm/aiter op_tests/cpp/mha/README.md (AMD), rows filling >= 2 waves", *aiter_rows(4, 304)),
    ("MI355X aiter asm FlashAttention, hd128", "mi355x", True,
     "ROCm/aiter op_tests/cpp/mha/README.md (AMD), rows filling >= 2 waves", *aiter_rows(5, 256)),
]
# the largest |kvpd / measured - 1| of any row, per modelled table (the aiter rows mix batch and
# head counts the one-curve model does not separate)
ROW_TOLERANCE = {"h100-sxm": 0.02, "b200": 0.02, "mi300x": 0.3, "mi355x": 0.55}


def fit_noncausal(rows, peak: float) -> tuple[float, float]:
    """Least squares of log(e S / (S + h)) over non-causal (S, TFLOP/s) rows: (e, h)
    (`gemm_kernels.fit_k`, every row weighted alike)."""
    return fit_k([(S, 1, tf * 1e12 / peak) for S, tf in rows])


def fit_causal_keys(rows, peak: float, e: float, h: float) -> float:
    """Extra keys per query the causal rows need beyond e k / (k + h), k = (S + 1) / 2."""
    k = np.array([(r[0] + 1) / 2 for r in rows], dtype=np.float64)
    y = np.log([r[1] * 1e12 / peak for r in rows])
    return float(min(range(0, 3001),
                     key=lambda c: float(np.sum((np.log(e * k / (k + h + c)) - y) ** 2))))


def tile_seconds(keys: float, e: float, peak: float, sm_count: int) -> float:
    """`keys` extra keys per query as time per 128-query tile at e x peak over the SMs."""
    return keys * ATTN_QUERY_TILE * 4.0 * HEAD_DIM / (e * peak / sm_count)


@cache
def _cost_model(part: str) -> CostModel:
    return CostModel("llama-3-8b", part, "bf16")  # a head-dim-128 model


def kvpd_efficiency(part: str, S: int, causal: bool) -> float:
    """kvpd's FlashAttention efficiency for one prompt of S tokens (fraction of BF16 peak):
    causal, the cost model's own (the `attn_prefill` op of a one-prompt step); non-causal,
    which kvpd never prices, the curve of the part's `efficiency` and `half_keys`."""
    if causal:
        step = explain_step(_cost_model(part), BatchShape.from_lists([S], [0]))
        return next(op for op in step.ops if op.name == "attn_prefill").efficiency
    k = kernel_profile(get_accelerator(part))
    return k.attn_prefill_efficiency * S / (S + k.attn_half_keys)


def main() -> None:
    for label, part, modelled, source, nc, ca in TABLES:
        acc = get_accelerator(part)
        peak = acc.peak_flops("bf16")
        e, h = fit_noncausal(nc, peak)
        print(f"{label}\n  source: {source}\n  non-causal fit: {e:.3f} x S / (S + {h:.0f})")
        if ca:
            c = fit_causal_keys(ca, peak, e, h)
            print(f"  causal: {c:.0f} more keys per query = "
                  f"{tile_seconds(c, e, peak, acc.sm_count) * 1e6:.2f} us per 128-query tile")
        if modelled and len(nc) + len(ca) > 12:
            for causal, rows in ((False, nc), (True, ca)):
                r = [kvpd_efficiency(part, S, causal) * peak / 1e12 / tf for S, tf in rows]
                print(f"    {'causal' if causal else 'non-causal':10s} {len(r)} rows: kvpd / "
                      f"measured median {float(np.median(r)):.2f}, range {min(r):.2f}-{max(r):.2f}")
        elif modelled:
            for causal, rows in ((False, nc), (True, ca)):
                for S, tf in rows:
                    got = kvpd_efficiency(part, S, causal) * peak / 1e12
                    print(f"    {'causal' if causal else 'non-causal':10s} S={S:6d}: measured "
                          f"{tf:7.1f} TFLOP/s, kvpd {got:7.1f} ({got / tf:.2f})")
        print()


if __name__ == "__main__":
    main()
