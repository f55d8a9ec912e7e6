"""Where does a slow served step spend its time? Follows bench/diagnostics/gpu_step_modes.py.

gpu_step_modes.py showed (H200, Llama-3-8B bf16) decode steps of one fixed load switching
between ~18 ms and ~55 ms, in-process as well as in a worker process, with the GPU at full
clocks and mostly idle and the engine thread on a CPU all the time. This replays the same
load through an in-process engine and times the parts of every step (scheduling, metadata,
forward, logits, sampling; the device synchronized around each) attention within the forward, and Python's garbage
collections, then profiles a short replay with torch.profiler. Printed, and written to
OUT/breakdown.txt.

    python bench/diagnostics/gpu_step_breakdown.py --out DIR [--model llama-3-8b --dtype bf16 --device cuda]
"""

from __future__ import annotations

import argparse
import gc
import time
from collections import defaultdict

import numpy as np
from gpu_step_modes import engine_args, engine_setup  # bench/ is on sys.path as a script


def main() -> None:
    ap = engine_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    ap.add_argument("--profile-requests", type=int, default=12)
    args = ap.parse_args()

    import torch

    import realexec.engine.runner as runner_mod
    from realexec.engine.device import synchronize
    from realexec.fidelity.validate.backends import ColocatedBackend
    from realexec.fidelity.validate.speed_probe import serving_probe_trace

    args.out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def emit(s: str) -> None:
        print(s, flush=True)
        lines.append(s)
        (args.out / "breakdown.txt").write_text("\n".join(lines) + "\n")

    cfg, kwargs = engine_setup(args)
    t0 = time.time()
    be = ColocatedBackend(cfg, kwargs, args.out / "engine.steps.jsonl")
    llm = be.llm
    emit(f"engine built in {time.time() - t0:.1f} s; torch threads {torch.get_num_threads()}")
    trace = serving_probe_trace(args.requests, 2048, seed=0)
    be.replay(trace, seed=1)  # warm-up
    emit(f"warm-up replay done at {time.time() - t0:.1f} s")

    # ---- per-part timing: wrap the parts of a step, the device synchronized around each
    dev = llm.runner.device
    cur: dict[str, float] = defaultdict(float)
    steps: list[dict[str, float]] = []

    def timed(name, fn, sync):
        def wrapper(*a, **kw):
            if sync:
                synchronize(dev)
            t = time.perf_counter()
            out = fn(*a, **kw)
            if sync:
                synchronize(dev)
            cur[name] += time.perf_counter() - t
            return out
        return wrapper

    gc_start = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            cur["gc"] += time.perf_counter() - gc_start[0]
            cur[f"gc{info['generation']}"] += 1

    orig = (llm.scheduler.schedule, runner_mod.build_metadata, llm.runner.model.forward,
            llm.runner.model.compute_logits, llm.runner.sampler.sample, llm.step)
    llm.scheduler.schedule = timed("schedule", orig[0], False)
    runner_mod.build_metadata = timed("metadata", orig[1], True)
    llm.runner.model.forward = timed("forward", orig[2], True)
    llm.runner.model.compute_logits = timed("logits", orig[3], True)
    llm.runner.sampler.sample = timed("sample", orig[4], True)
    import realexec.engine.attention as attention_mod

    orig_attend = attention_mod.PagedAttention.attend
    attention_mod.PagedAttention.attend = timed("attend", orig_attend, True)

    def step():
        cur.clear()
        t = time.perf_counter()
        out = orig[5]()
        rec = dict(cur)
        rec["step"] = time.perf_counter() - t
        rec["decode"] = float(out.scheduler_output.shape.num_prefill_reqs == 0)
        rec["reqs"] = out.scheduler_output.shape.num_reqs
        if rec["reqs"]:
            steps.append(rec)
        return out

    llm.step = step
    gc.callbacks.append(on_gc)
    be.replay(trace, seed=2)
    gc.callbacks.remove(on_gc)
    llm.step = orig[5]
    (llm.scheduler.schedule, runner_mod.build_metadata, llm.runner.model.forward,
     llm.runner.model.compute_logits, llm.runner.sampler.sample) = orig[:5]
    attention_mod.PagedAttention.attend = orig_attend

    dec = [s for s in steps if s["decode"]]
    if dec:
        st = np.array([s["step"] for s in dec])
        lo = float(np.percentile(st, 10))
        groups = {"fast": [s for s in dec if s["step"] <= 1.8 * lo],
                  "slow": [s for s in dec if s["step"] > 1.8 * lo]}
        parts = ["step", "schedule", "metadata", "forward", "attend", "logits", "sample", "gc"]
        emit(f"{len(dec)} decode steps (sync around each part), p10 {lo * 1e3:.1f} ms; "
             "median ms per part:")
        emit("group  steps  " + "  ".join(f"{p:>8}" for p in parts) + "   gc0/gc1/gc2 per step")
        for g, ss in groups.items():
            if not ss:
                continue
            med = [np.median([s.get(p, 0.0) for s in ss]) * 1e3 for p in parts]
            gcn = [np.mean([s.get(f"gc{k}", 0) for s in ss]) for k in range(3)]
            emit(f"{g:5} {len(ss):6d}  " + "  ".join(f"{m:8.2f}" for m in med)
                 + "   " + "/".join(f"{x:.2f}" for x in gcn))
        emit("sequence (ms: step = forward + rest):")
        emit(" ".join(f"{s['step'] * 1e3:.0f}={s.get('forward', 0) * 1e3:.0f}" for s in dec[:150]))

    # ---- torch.profiler over a short replay: which ops take the CPU time
    short = serving_probe_trace(args.profile_requests, 2048, seed=3)
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    t = time.time()
    with profile(activities=acts) as prof:
        be.replay(short, seed=4)
    emit(f"profiled replay of {args.profile_requests} requests: {time.time() - t:.1f} s")
    ka = prof.key_averages()
    emit(ka.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
    be.close()


if __name__ == "__main__":
    main()
