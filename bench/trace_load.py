"""Benchmark: load a 1,000,000-row Azure-format CSV with `workloads.load_trace`.

Targets (issue 3): load time < 3 s and peak memory < 300 MB.
The CSV is generated first (seeded, Azure 2023 layout: TIMESTAMP with 7 fractional
digits, ContextTokens, GeneratedTokens). The load runs in a fresh child process so
its memory is measured alone: peak RSS (VmHWM, or ru_maxrss off Linux) of the whole
process and its rise over the post-import baseline, the peak of pyarrow's memory
pool, and the tracemalloc peak (numpy/Python allocations) of a second load.

Usage: python bench/trace_load.py [--rows N] [--keep FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 3.0
TARGET_MB = 300.0


def generate(path: Path, rows: int, seed: int = 0) -> None:
    """Azure-format CSV: Poisson arrivals at 5.5 req/s (the 2023 conv trace's mean rate)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    rng = np.random.default_rng(seed)
    start = np.datetime64("2023-11-16T18:15:46", "ns").astype(np.int64)
    gaps_ns = rng.exponential(1e9 / 5.5, rows).astype(np.int64)
    ts = pa.array(start + np.cumsum(gaps_ns), type=pa.timestamp("ns"))
    text = pc.utf8_slice_codeunits(pc.strftime(ts, format="%Y-%m-%d %H:%M:%S"), 0, 27)
    table = pa.table(
        {
            "TIMESTAMP": text,
            "ContextTokens": rng.integers(2, 14050, rows),
            "GeneratedTokens": rng.integers(7, 1000, rows),
        }
    )
    with open(path, "wb") as fh:  # unquoted header, as in the published Azure files
        fh.write(b"TIMESTAMP,ContextTokens,GeneratedTokens\n")
        pcsv.write_csv(
            table, fh, write_options=pcsv.WriteOptions(include_header=False, quoting_style="none")
        )


def _maxrss_mb() -> float:
    """Peak resident memory of this process so far, MB.

    Linux: VmHWM from /proc/self/status (ru_maxrss would carry over the parent's peak
    across fork+exec). Elsewhere: resource.getrusage ru_maxrss (bytes on macOS).
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1e6


def child(path: str) -> None:
    """Load `path` once timed, once under tracemalloc; print one JSON line of figures."""
    import tracemalloc

    import pyarrow as pa

    import workloads

    base_mb = _maxrss_mb()
    t0 = time.perf_counter()
    trace = workloads.load_trace(path)
    load_s = time.perf_counter() - t0
    peak_mb = _maxrss_mb()
    arrow_peak_mb = pa.default_memory_pool().max_memory() / 1e6
    rows, nbytes = len(trace), trace.nbytes
    del trace
    tracemalloc.start()
    trace = workloads.load_trace(path)
    traced_peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    print(
        json.dumps(
            {
                "rows": rows,
                "load_s": load_s,
                "rss_base_mb": base_mb,
                "rss_peak_mb": peak_mb,
                "arrow_pool_peak_mb": arrow_peak_mb,
                "tracemalloc_peak_mb": traced_peak_mb,
                "trace_mb": nbytes / 1e6,
                "span_s": trace.duration_s,
            }
        )
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--keep", help="write the generated CSV here and keep it")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep or Path(tmp) / "azure_1m.csv")
        t0 = time.perf_counter()
        generate(path, args.rows)
        gen_s = time.perf_counter() - t0
        size_mb = path.stat().st_size / 1e6
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(path)],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
    rise = r["rss_peak_mb"] - r["rss_base_mb"]
    print(f"generated {args.rows:,} Azure-format rows ({size_mb:.1f} MB CSV) in {gen_s:.2f} s")
    print(
        f"load_trace: {r['rows']:,} rows, span {r['span_s']:.0f} s, columns {r['trace_mb']:.1f} MB"
    )
    print(
        f"  load time            {r['load_s']:.3f} s   (target < {TARGET_S:g} s: "
        f"{'PASS' if r['load_s'] < TARGET_S else 'FAIL'})"
    )
    print(
        f"  peak RSS, process    {r['rss_peak_mb']:.1f} MB (target < {TARGET_MB:g} MB: "
        f"{'PASS' if r['rss_peak_mb'] < TARGET_MB else 'FAIL'}; includes {r['rss_base_mb']:.1f} MB "
        "of interpreter + numpy + pyarrow)"
    )
    print(f"  peak RSS rise, load  {rise:.1f} MB")
    print(f"  pyarrow pool peak    {r['arrow_pool_peak_mb']:.1f} MB")
    print(f"  tracemalloc peak     {r['tracemalloc_peak_mb']:.1f} MB (numpy/Python allocations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
