"""Benchmark: a 64-point sweep of the quickstart scenario, process pool vs serial, and one
capacity search.

Sweep: scheduler.max_num_batched_tokens x max_num_seqs x workload.target_rate (4 x 4 x 4)
on the quickstart scenario (Llama-3-8B, 1x H100, 5 minutes of the Azure conversation
trace), run once in this process (`serial`) and once in the local process pool (one
worker per CPU); both write their own results folder, and the tables must agree on every
simulated metric. Prints wall time, points per second and the speed-up.

Capacity: `kvpd capacity scenarios/quickstart.yaml --slo ttft_p90=0.5 --slo tpot_p90=0.05`
with 3 replays of other 5-minute windows; prints the number of simulations, wall time and
the answer.

Usage: python bench/sweep.py [--workers N] [--skip-capacity]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
AXES = {
    "scheduler.max_num_batched_tokens": [512, 1024, 2048, 8192],
    "scheduler.max_num_seqs": [32, 64, 128, 256],
    "workload.target_rate": [4.0, 6.0, 8.0, 12.0],
}


def same_tables(a: list[dict], b: list[dict]) -> bool:
    from simulator.plan.worker import WALL_CLOCK_METRICS

    skip = {"point_wall_s", *WALL_CLOCK_METRICS}

    def clean(row: dict) -> dict:
        return {k: v for k, v in row.items() if k not in skip
                and not (isinstance(v, float) and math.isnan(v))}

    return len(a) == len(b) and all(clean(x) == clean(y) for x, y in zip(a, b))


def bench_sweep(workers: int | None) -> None:
    from simulator.plan.sweep import run_sweep
    from simulator.plan.sweep_spec import sweep_from_dict

    load_before = os.getloadavg()[0]
    spec = sweep_from_dict({"name": "bench-64", "base": str(QUICKSTART), "axes": AXES},
                           "bench/sweep.py")
    assert len(spec.points) == 64
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for backend in ("serial", "process"):
            t0 = time.perf_counter()
            out = run_sweep(spec, Path(tmp) / backend, backend=backend, workers=workers,
                            progress=False)
            runs[backend] = (time.perf_counter() - t0, out)
    serial_s, serial = runs["serial"]
    pool_s, pool = runs["process"]
    print(f"sweep: 64 points of {QUICKSTART.name} (5 min of Azure conv, "
          f"{serial.rows[0]['requests.total']} requests each), {os.cpu_count()} CPUs, "
          f"load average {load_before:.1f} before / {os.getloadavg()[0]:.1f} after "
          f"(other work on the machine slows both runs)")
    # concurrency: the points' own wall times over the sweep's wall time (1.0 = one at a time)
    print(f"  {'backend':10s} {'workers':>7s} {'wall s':>8s} {'points/s':>9s} {'s/point':>8s} "
          f"{'concurrency':>11s} {'failed':>6s}")
    for name, (wall, out) in runs.items():
        busy = sum(r["point_wall_s"] for r in out.rows)
        print(f"  {name:10s} {out.workers:7d} {wall:8.2f} {64 / wall:9.2f} {busy / 64:8.3f} "
              f"{busy / wall:11.2f} {out.failed:6d}")
    print(f"  speed-up (serial / pool): {serial_s / pool_s:.2f}x; identical tables: "
          f"{same_tables(serial.rows, pool.rows)}")


def bench_capacity() -> None:
    from simulator.plan.candidates import plan_capacity
    from simulator.plan.slo import SLOSet, parse_slo

    slos = SLOSet((parse_slo("ttft_p90=0.5"), parse_slo("tpot_p90=0.05")))
    t0 = time.perf_counter()
    res = plan_capacity(QUICKSTART, slos, repeats=3)
    wall = time.perf_counter() - t0
    c = res["candidates"][0]
    base = sum(1 for e in c["evaluations"] if e["variant"] == 0)
    print(f"capacity: {QUICKSTART.name}, {res['slo_text']}")
    print(f"  answer {c['max_rate_rps']:.4g} req/s per replica (fails at {c['fail_rate_rps']:.4g}); "
          f"{c['num_simulations']} simulations ({base} for the search, "
          f"{c['num_simulations'] - base} for 3 confidence replays) in {wall:.1f} s")
    print(f"  {c['confidence']['note']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, help="pool size (default: CPU count)")
    ap.add_argument("--skip-capacity", action="store_true")
    args = ap.parse_args()
    bench_sweep(args.workers)
    if not args.skip_capacity:
        bench_capacity()
    return 0


if __name__ == "__main__":
    sys.exit(main())
