"""Does this machine slow down under sustained load (burst credits), or only with its neighbours?

    python bench/machine_drift.py OUT.csv [--busy-s 480 --idle-s 180 --busy2-s 120]

Times a fixed one-thread GEMM (64 x 512 @ 512 x 1536, fp32) and a 64 MB streaming sum for
0.5 s each, back to back while "busy", once every 30 s while "idle", then busy again; writes
one CSV row per probe and prints each phase's median, min and max. A burst-credit machine
slows through the first busy phase and recovers after the idle one.

2026-11-30, this 2-core VM: busy 8 min GEMM median 813/s (min 491, max 915), idle 3 min 697/s,
busy again 2 min 777/s; streams 354, 343, 348/s. No slowing over 8 busy minutes and no
recovery after idling: the speed swings by -40% to +13% from second to second, which is
the other tenants of the host, not a credit budget.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def probe(a: torch.Tensor, w: torch.Tensor, big: torch.Tensor) -> tuple[float, float]:
    """(GEMMs per s, streaming sums per s), each over 0.5 s."""
    rates = []
    for op in (lambda: a @ w, big.sum):
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < 0.5:
            op()
            n += 1
        rates.append(n / (time.perf_counter() - t0))
    return rates[0], rates[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--busy-s", type=float, default=480)
    ap.add_argument("--idle-s", type=float, default=180)
    ap.add_argument("--busy2-s", type=float, default=120)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    a, w, big = torch.randn(64, 512), torch.randn(512, 1536), torch.randn(16 * 2**20)
    rows: list[tuple[float, str, float, float]] = []
    t_start = time.time()
    with open(args.out, "w") as f:
        f.write("t_s,phase,gemm_per_s,stream_per_s\n")
        for phase, dur, gap in (("busy", args.busy_s, 0.0), ("idle", args.idle_s, 29.0),
                                ("busy2", args.busy2_s, 0.0)):
            end = time.time() + dur
            while time.time() < end:
                g, s = probe(a, w, big)
                rows.append((time.time() - t_start, phase, g, s))
                f.write(f"{rows[-1][0]:.1f},{phase},{g:.1f},{s:.2f}\n")
                f.flush()
                if gap:
                    time.sleep(gap)
    for phase in ("busy", "idle", "busy2"):
        g = [r[2] for r in rows if r[1] == phase]
        s = [r[3] for r in rows if r[1] == phase]
        if g:
            print(f"{phase:6s} {len(g):4d} probes: GEMM/s median {statistics.median(g):.0f} "
                  f"(min {min(g):.0f}, max {max(g):.0f}); stream/s median "
                  f"{statistics.median(s):.0f} (min {min(s):.0f}, max {max(s):.0f})")


if __name__ == "__main__":
    main()
