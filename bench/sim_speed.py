"""Simulator speed: wall time and peak memory, each case in a fresh child process.

(a) the whole Azure conversation trace (19,366 requests), Llama-3-8B on one H100, ORCA;
(b) the same trace repeated to 100,000 requests at 8x its rate, across 8 replicas
    (least_outstanding_tokens router);
(c) a 1P1D PD run of (a);
(d) 1,000,000 requests: the Azure conversation trace's (prompt, output) pairs resampled, Poisson
    arrivals at 8x the trace's mean rate (what one H100 sustains for it, per replica), 8 H100
    replicas behind round_robin, `sim.processes` = the machine's cores (at most 8);
(e) A/B: case (a) in this checkout and in a checkout of `--base` (default: the commit before
    the issue-35 speed work), alternately, `--ab N` times each: wall and CPU seconds and ratios;
(f) every summary figure of the fast paths (decode bursts, streamed records, several processes)
    against a step-by-step run that keeps every request: colocated, PD and prefix caching;
(g) a least_kv_usage router (it reads each replica's KV usage, mid-burst too) over 4 H100s,
    6,000 Azure conv requests at 4x their rate: decode bursts against step by step, alternately,
    wall seconds, their ratio and whether every summary figure is the same.

Peak memory is ru_maxrss: of the child, and with (d)'s worker processes the largest of them
(the total is at most child + workers). Targets (issue 35): (d) < 60 s and < 2 GB; (e) >= 3x.
Vidur, measured on this kind of machine: ~190 simulated requests per wall second.

    python bench/sim_speed.py [--cases abcdefg] [--ab 3] [--base REV] [--json]

With `KVPD_NATIVE=1` (after `kvpd native build`) this checkout's runs use the core compiled
with mypyc; the printout says which core ran.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "data" / "traces"
TRACE = TRACES / "azure2023_AzureLLMInferenceTrace_conv.csv"
MOONCAKE = TRACES / "mooncake_synthetic_trace.jsonl"
BASE_REV = "e8f88a6"  # the branch point of the issue-35 work (30-core merged, no speed change)
LABELS = {"a": "(a) Azure conv, 1x H100, ORCA", "b": "(b) 100k requests, 8 replicas",
          "c": "(c) Azure conv, 1P1D PD", "d": "(d) 1M requests, 8x H100, rr"}


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
    if case == "d":
        import workloads

        rate = 8 * workloads.mean_rate(workloads.load_trace(TRACE))
        pair = {"dist": "trace", "path": str(TRACE)}
        base["workload"] = {"synthetic": {
            "num_requests": 1_000_000, "arrival": {"process": "poisson", "rate": rate},
            "prompt_len": pair, "output_len": dict(pair)}}
        base["cluster"] = {"replicas": 8, "router": "round_robin"}
        base["sim"] = {"processes": max(1, min(8, os.cpu_count() or 1))}
    return base


def _child(case: str, conn) -> None:
    sys.path.insert(0, str(REPO))
    import workloads
    from simulator import native
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
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_mod.run_scenario(sc)
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)  # (d)'s worker processes
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0 + workers.ru_utime + workers.ru_stime
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    workers_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    s = res.summary
    conn.send({
        "requests": s["requests"]["total"], "wall_s": wall, "cpu_s": cpu, "peak_mb": peak_mb,
        "workers_peak_mb": workers_mb, "req_per_s": s["requests"]["total"] / wall,
        "steps": s["sim"]["num_steps"], "ttft_p50_ms": s["ttft_s"]["p50"] * 1e3,
        "tpot_p50_ms": s["tpot_s"]["p50"] * 1e3, "simulated_s": s["sim"]["simulated_s"],
        "busy": max(s["replica_busy_fraction"].values()),
        "native": native.active(),
    })


def cases(which: str, rows: dict) -> None:
    ctx = mp.get_context("spawn")
    print(f"{'case':34s} {'requests':>9s} {'wall s':>8s} {'cpu s':>7s} {'peak MB':>8s} "
          f"{'req/wall-s':>11s} {'x Vidur':>8s} {'steps':>9s} {'TTFT p50 ms':>12s} "
          f"{'TPOT p50 ms':>12s} {'busy':>5s}", flush=True)
    for case in (c for c in "abcd" if c in which):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_child, args=(case, child))
        p.start()
        child.close()
        try:
            rows[case] = r = parent.recv()
        except EOFError:
            p.join()
            print(f"{LABELS[case]:34s} FAILED (exit code {p.exitcode})", flush=True)
            continue
        p.join()
        peak = f"{r['peak_mb']:.0f}" + (f"+{r['workers_peak_mb']:.0f}" if case == "d" else "")
        print(f"{LABELS[case]:34s} {r['requests']:9d} {r['wall_s']:8.2f} {r['cpu_s']:7.2f} "
              f"{peak:>8s} {r['req_per_s']:11.0f} {r['req_per_s'] / 190:8.1f} {r['steps']:9d} "
              f"{r['ttft_p50_ms']:12.1f} {r['tpot_p50_ms']:12.2f} {r['busy']:5.2f}", flush=True)
    native_cases = [c for c, r in rows.items() if r.get("native")]
    print("core: " + (f"native (KVPD_NATIVE=1, `kvpd native build`) in {''.join(native_cases)}"
                      if native_cases else "pure Python"))
    print("targets: (a) < 10 s; (b) < 60 s and < 2048 MB; (d) < 60 s and < 2048 MB "
          "(peak: the run's process + its largest worker)")


_AB = ("import sys, time; sys.path.insert(0, '.'); "
       "from simulator.scenario import scenario_from_dict; from simulator.run import run_scenario; "
       "sc = scenario_from_dict({'name': 'a', 'model': 'llama-3-8b', 'hardware': 'h100-sxm', "
       "'workload': {'trace': %r}, 'output': {'timeseries': False, 'plots': False}}); "
       "t, c = time.perf_counter(), time.process_time(); r = run_scenario(sc); "
       "print(time.perf_counter() - t, time.process_time() - c, r.summary['ttft_s']['p99'])")


def ab(n: int, base_rev: str, rows: dict) -> None:
    """Case (a) in a worktree of `base_rev` and in this checkout, alternately."""
    tmp = Path(tempfile.mkdtemp(prefix="kvpd-base-"))
    wt = tmp / "base"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(wt), base_rev],
                   check=True, capture_output=True)
    try:
        times: dict[str, list[tuple[float, float]]] = {"base": [], "new": []}
        for _ in range(n):
            for name, root in (("base", wt), ("new", REPO)):
                out = subprocess.run([sys.executable, "-c", _AB % str(TRACE)], cwd=root,
                                     env=dict(os.environ, PYTHONPATH=str(root)),
                                     capture_output=True, text=True, check=True)
                wall, cpu, _ = out.stdout.split()
                times[name].append((float(wall), float(cpu)))
        sys.path.insert(0, str(REPO))
        from simulator import native

        print(f"\n(e) Azure conv 19,366 requests, 1x H100: {base_rev} vs this checkout, "
              f"alternating, {n} runs each; this checkout's core: "
              f"{'native (KVPD_NATIVE=1)' if native.wanted() else 'pure Python'}")
        for i, (b, w) in enumerate(zip(times["base"], times["new"])):
            print(f"  run {i + 1}: base wall {b[0]:6.2f} s cpu {b[1]:6.2f} s | new wall {w[0]:6.2f} s "
                  f"cpu {w[1]:6.2f} s | ratio wall {b[0] / w[0]:5.2f} cpu {b[1] / w[1]:5.2f}")
        for k, what in ((0, "wall"), (1, "cpu")):
            r = [b[k] / w[k] for b, w in zip(times["base"], times["new"])]
            print(f"  speed-up ({what}): median {statistics.median(r):.2f}x, "
                  f"min {min(r):.2f}x, max {max(r):.2f}x")
        rows["ab"] = times
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(wt)],
                       capture_output=True)


def same(rows: dict) -> None:
    """(f): fast paths vs step by step keeping every request, on three small scenarios."""
    sys.path.insert(0, str(REPO))
    from simulator.run import run_scenario
    from simulator.scenario import scenario_from_dict

    def comparable(s: dict) -> dict:
        s = json.loads(json.dumps(s))
        s.pop("wall_s")
        s["sim"].pop("requests_per_wall_s")
        return s

    small = {"limit": 3000}
    scenarios = {
        "colocated (3,000 Azure conv, 4 H100, rr, 2 processes)": dict(
            _scenario("a"), cluster={"replicas": 4, "router": "round_robin"},
            workload={"trace": str(TRACE), **small, "rate_scale": 4}),
        "PD 1P1D (3,000 Azure conv)": dict(_scenario("c"), workload={"trace": str(TRACE), **small}),
        "prefix caching (300 Mooncake, Qwen2.5-7B, H200)": dict(
            _scenario("a"), model="qwen2.5-7b", hardware="h200-sxm",
            scheduler={"max_model_len": 131072}, cache={"enable_prefix_caching": True},
            workload={"trace": str(MOONCAKE), "limit": 300, "target_rate": 1.0}),
    }
    print("\n(f) summary of the fast paths vs step by step (max_decode_burst 1, keep_requests)")
    for name, d in scenarios.items():
        fast = dict(d, sim={"processes": 2} if "processes" in name else {})
        slow = dict(d, sim={"max_decode_burst": 1, "keep_requests": True})
        a = comparable(run_scenario(scenario_from_dict(fast)).summary)
        b = comparable(run_scenario(scenario_from_dict(slow)).summary)
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        print(f"  {name:55s} identical: {not diff}" + (f" (differ: {diff})" if diff else ""))
        rows.setdefault("same", {})[name] = not diff


def least_kv(n: int, rows: dict) -> None:
    """(g): a least_kv_usage router, decode bursts vs step by step, `n` runs of each."""
    sys.path.insert(0, str(REPO))
    from simulator.run import run_scenario
    from simulator.scenario import scenario_from_dict

    d = dict(_scenario("a"), cluster={"replicas": 4, "router": "least_kv_usage"},
             workload={"trace": str(TRACE), "limit": 6000, "rate_scale": 4})
    walls: dict[int, list[float]] = {1024: [], 1: []}
    summaries = {}
    for _ in range(n):
        for burst in (1024, 1):
            t = time.perf_counter()
            res = run_scenario(scenario_from_dict(dict(d, sim={"max_decode_burst": burst})))
            walls[burst].append(time.perf_counter() - t)
            s = json.loads(json.dumps(res.summary))
            s.pop("wall_s")
            s["sim"].pop("requests_per_wall_s")
            summaries[burst] = s
    fast, slow = statistics.median(walls[1024]), statistics.median(walls[1])
    same_summary = summaries[1024] == summaries[1]
    print(f"\n(g) least_kv_usage, 4 x H100, 6,000 Azure conv at 4x: bursts {fast:.2f} s, step by "
          f"step {slow:.2f} s (medians of {n}; {', '.join(f'{w:.2f}' for w in walls[1024])} / "
          f"{', '.join(f'{w:.2f}' for w in walls[1])}): {slow / fast:.2f}x; summaries identical: "
          f"{same_summary}")
    rows["least_kv_usage"] = {"bursts_s": walls[1024], "step_by_step_s": walls[1],
                              "ratio": slow / fast, "identical": same_summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="abcdefg", help="which of a-g to run (default all)")
    ap.add_argument("--ab", type=int, default=3, help="runs of each side in (e)")
    ap.add_argument("--base", default=BASE_REV, help="the commit (e) compares against")
    ap.add_argument("--json", action="store_true", help="also write bench_sim_speed.json")
    args = ap.parse_args()
    if not TRACE.is_file():
        sys.exit(f"trace not found: {TRACE}")
    rows: dict = {}
    if set(args.cases) & set("abcd"):
        cases(args.cases, rows)
    if "e" in args.cases:
        ab(args.ab, args.base, rows)
    if "f" in args.cases:
        same(rows)
    if "g" in args.cases:
        least_kv(args.ab, rows)
    if args.json:
        Path("bench_sim_speed.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
