"""FlashAttention forward efficiency against published kernel tables, non-causal and causal:
kvpd prices a prefill query's attention at efficiency x k / (k + half_keys + causal keys),
k the keys it attends to on average (kernels.yaml attn_prefill: `efficiency`, `half_keys`,
`causal_tile_s`, the causal diagonal's extra time per 128-query tile).

Each table gives the fit e x k / (k + h) of its non-causal rows and the extra keys per query its
causal rows need (k = (S + 1) / 2), as a time per tile at the fit's rate per SM; then kvpd's
efficiency for the same rows where kvpd models that kernel (FA3 on Hopper, FA4 on Blackwell).

    python bench/diagnostics/attention.py
"""

from __future__ import annotations

import numpy as np

from simulator.cost.hardware import get_accelerator
from simulator.cost.kernels import ATTN_QUERY_TILE, kernel_profile

HEAD_DIM = 128
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
]


def _loss(k, e, h, y):
    return float(np.sum((np.log(e * k / (k + h)) - y) ** 2))


def fit_noncausal(rows, peak: float) -> tuple[float, float]:
    """Least squares of log(e S / (S + h)) over non-causal (S, TFLOP/s) rows: (e, h)."""
    S = np.array([r[0] for r in rows], dtype=np.float64)
    y = np.log([r[1] * 1e12 / peak for r in rows])

    def e_of(h):
        return float(np.exp(np.mean(y - np.log(S / (S + h)))))

    h = min(range(1, 3001), key=lambda h: _loss(S, e_of(h), h, y))
    return e_of(h), float(h)


def fit_causal_keys(rows, peak: float, e: float, h: float) -> float:
    """Extra keys per query the causal rows need beyond e k / (k + h), k = (S + 1) / 2."""
    k = np.array([(r[0] + 1) / 2 for r in rows], dtype=np.float64)
    y = np.log([r[1] * 1e12 / peak for r in rows])
    return float(min(range(0, 3001), key=lambda c: _loss(k, e, h + c, y)))


def tile_seconds(keys: float, e: float, peak: float, sm_count: int) -> float:
    """`keys` extra keys per query as time per 128-query tile at e x peak over the SMs."""
    return keys * ATTN_QUERY_TILE * 4.0 * HEAD_DIM / (e * peak / sm_count)


def kvpd_efficiency(part: str, S: int, causal: bool) -> float:
    """kvpd's FlashAttention efficiency for one prompt of S tokens (fraction of BF16 peak)."""
    acc = get_accelerator(part)
    k = kernel_profile(acc)
    e, h = k.attn_prefill_efficiency, k.attn_half_keys
    keys = (S + 1) / 2 if causal else S
    if causal:
        h += k.causal_keys(acc.peak_flops("bf16") * e, acc.sm_count, HEAD_DIM)
    return e * keys / (keys + h)


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
        if modelled:
            for causal, rows in ((False, nc), (True, ca)):
                for S, tf in rows:
                    got = kvpd_efficiency(part, S, causal) * peak / 1e12
                    print(f"    {'causal' if causal else 'non-causal':10s} S={S:6d}: measured "
                          f"{tf:7.1f} TFLOP/s, kvpd {got:7.1f} ({got / tf:.2f})")
        print()


if __name__ == "__main__":
    main()
