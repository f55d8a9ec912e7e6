"""Simulator speed: wall time and peak memory (tracemalloc-free: ru_maxrss of a child process).

(a) the whole Azure conversation trace (19,366 requests), Llama-3-8B on one H100, ORCA;
(b) the same trace repeated to 100,000 requests at 8x its rate, across 8 replicas;
(c) a 1P1D PD run of (a).
Targets (issue "The simulator"): (a) < 10 s, (b) < 60 s and < 2 GB. Vidur, measured on this
kind of machine: ~190 simulated requests per wall second.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO.parent / "shared" / "data" / "traces" / "azure2023_AzureLLMInferenceTrace_conv.csv"


def _scenario(case: str) -> dict:
    base = {
        "name": case,
        "model": "llama-3-8b",
        "hardware": "h100-sxm",
        "workload": {"trace": str(TRACE)},
        "output": {"timeseries": False, "plots": False},
    }
    if case == "b":
        base["cluster"] = {"replicas": 8, "router": "least_outstanding_tokens"}
    if case == "c":
        base["cluster"] = {"pd": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}, "link": "ib-ndr"}}
    return base


def _child(case: str, conn) -> None:
    sys.path.insert(0, str(REPO))
    import workloads
    from simulator import run as run_mod
    from simulator.scenario import scenario_from_dict

    sc = scenario_from_dict(_scenario(case))
    if case == "b":
        real_build = run_mod.build_trace

        def tiled(scenario, max_model_len=None):
            # the trace repeated back to back until 100,000 requests, then arrivals
            # rescaled so each of the 8 replicas sees the original trace's mean rate
            t = real_build(scenario, max_model_len)
            span = float(t.arrival_s[-1]) + 1.0
            copies = [t.replace(arrival_s=t.arrival_s + k * span) for k in range(6)]
            merged = workloads.first_n(workloads.merge_traces(copies), 100_000)
            return workloads.rescale_rate(merged, 8 * workloads.mean_rate(t))

        run_mod.build_trace = tiled
    t0 = time.perf_counter()
    res = run_mod.run_scenario(sc)
    wall = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s = res.summary
    conn.send({
        "requests": s["requests"]["total"], "wall_s": wall, "peak_mb": peak_mb,
        "req_per_s": s["requests"]["total"] / wall, "steps": s["sim"]["num_steps"],
        "ttft_p50_ms": s["ttft_s"]["p50"] * 1e3, "tpot_p50_ms": s["tpot_s"]["p50"] * 1e3,
        "simulated_s": s["sim"]["simulated_s"],
    })


def main() -> None:
    if not TRACE.is_file():
        sys.exit(f"trace not found: {TRACE}")
    ctx = mp.get_context("spawn")
    rows = {}
    labels = {"a": "(a) Azure conv, 1x H100, ORCA", "b": "(b) 100k requests, 8 replicas",
              "c": "(c) Azure conv, 1P1D PD"}
    print(f"{'case':34s} {'requests':>9s} {'wall s':>8s} {'peak MB':>8s} {'req/wall-s':>11s} "
          f"{'x Vidur':>8s} {'steps':>9s} {'TTFT p50 ms':>12s} {'TPOT p50 ms':>12s}", flush=True)
    for case in ("a", "b", "c"):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_child, args=(case, child))
        p.start()
        child.close()
        try:
            rows[case] = r = parent.recv()
        except EOFError:
            p.join()
            print(f"{labels[case]:34s} FAILED (exit code {p.exitcode})", flush=True)
            continue
        p.join()
        print(f"{labels[case]:34s} {r['requests']:9d} {r['wall_s']:8.2f} {r['peak_mb']:8.0f} "
              f"{r['req_per_s']:11.0f} {r['req_per_s'] / 190:8.1f} {r['steps']:9d} "
              f"{r['ttft_p50_ms']:12.1f} {r['tpot_p50_ms']:12.2f}", flush=True)
    print("targets: (a) < 10 s; (b) < 60 s and < 2048 MB")
    Path("bench_sim_speed.json").write_text(json.dumps(rows, indent=2)) if "--json" in sys.argv else None


if __name__ == "__main__":
    main()
