"""Does this machine slow down under sustained load (burst credits), or only with its neighbours?

    python bench/diagnostics/machine_drift.py OUT.csv [--busy-s 480 --idle-s 180 --busy2-s 120]
    python bench/diagnostics/machine_drift.py --from-csv OUT.csv    # summarise an earlier run again

Times a fixed one-thread GEMM (64 x 512 @ 512 x 1536, fp32) and a 64 MB streaming sum for
0.5 s each, back to back while "busy", once every 30 s while "idle", then busy again; writes
one CSV row per probe and prints each phase's median, min and max. A burst-credit machine
slows through the first busy phase and recovers after the idle one.

2026-11-30, this 2-core VM: busy 8 min GEMM median 813/s (min 491, max 915), idle 3 min 697/s,
busy again 2 min 777/s; streams 354, 343, 348/s. No slowing over 8 busy minutes and no
recovery after idling: the speed swings by -40% to +13% from second to second, which is
the other tenants of the host, not a credit budget.

It also says on what time scale the speed moves (first busy phase, ~1 s per probe): the
GEMM rate's autocorrelation at a few lags and the spread (std / mean) of its means over
windows of 10, 30 and 60 probes. On the run above: autocorrelation 0.54 at 1 probe, 0.27
at 10, about 0 from 30 on; spread 6.7%, 5.5% and 3.6% over 10, 30 and 60 s windows. So a
probe of a few seconds before a run can foretell a 3-minute run's mean speed only to a
few per cent, whatever it measures.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time

import numpy as np
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


def time_scales(rates: list[float]) -> str:
    """Autocorrelation at lags of 1-60 probes and the spread of window means of `rates`."""
    x = np.asarray(rates, dtype=float)
    d = x - x.mean()
    parts = []
    for lag in (1, 5, 10, 30, 60):
        if x.size > lag + 10:
            parts.append(f"lag {lag}: {np.corrcoef(d[:-lag], d[lag:])[0, 1]:+.2f}")
    spreads = []
    for w in (10, 30, 60):
        k = x.size // w
        if k >= 3:
            means = x[:k * w].reshape(k, w).mean(axis=1)
            spreads.append(f"{w}: {means.std() / means.mean():.1%}")
    return ("autocorrelation " + ", ".join(parts) + "; spread of window means "
            + ", ".join(spreads))


def summarise(rows: list[tuple[float, str, float, float]]) -> None:
    for phase in ("busy", "idle", "busy2"):
        g = [r[2] for r in rows if r[1] == phase]
        s = [r[3] for r in rows if r[1] == phase]
        if g:
            print(f"{phase:6s} {len(g):4d} probes: GEMM/s median {statistics.median(g):.0f} "
                  f"(min {min(g):.0f}, max {max(g):.0f}); stream/s median "
                  f"{statistics.median(s):.0f} (min {min(s):.0f}, max {max(s):.0f})")
    busy = [r[2] for r in rows if r[1] == "busy"]
    if len(busy) > 20:
        print(f"busy GEMM/s time scales: {time_scales(busy)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--busy-s", type=float, default=480)
    ap.add_argument("--idle-s", type=float, default=180)
    ap.add_argument("--busy2-s", type=float, default=120)
    ap.add_argument("--from-csv", action="store_true", help="summarise OUT, written earlier")
    args = ap.parse_args()
    if args.from_csv:
        with open(args.out) as f:
            summarise([(float(r["t_s"]), r["phase"], float(r["gemm_per_s"]),
                        float(r["stream_per_s"])) for r in csv.DictReader(f)])
        return
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
    summarise(rows)


if __name__ == "__main__":
    main()
