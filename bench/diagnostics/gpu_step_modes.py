"""Why do served engine steps on a GPU run slower than the profile's? A diagnostic run.

On a lent H200 (Llama-3-8B bf16, 2026-11-30), the profile's decode steps took ~22 ms at
every batch size (host-bound: kernel launches), while the served engine's steps in
`kvpd validate` switched, for seconds at a time, between ~22 ms and ~62-67 ms for the same
request and batch. This script replays one fixed load several ways and records, beside
every engine step, what the GPU (nvidia-smi: clocks, utilisation, power, throttle reasons)
and the host (busy cores, steal time, the worker's threads and the CPU they ran on) were
doing, so the slow mode can be tied to a cause:

  served      the engine in a worker process behind the ZMQ front end (as validate runs it)
  served+gpu  the same, while this process also holds a second engine on the GPU (as
              validate's speed probe does)
  served-1t   a worker with one torch intra-op thread
  inproc      the engine in this process (ColocatedBackend)

    python bench/diagnostics/gpu_step_modes.py --out DIR [--model llama-3-8b --dtype bf16 --device cuda]

Writes DIR/steps-PHASE.jsonl, DIR/samples.jsonl and DIR/report.txt (printed too).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

SMI_FIELDS = "pstate,clocks.sm,clocks.mem,utilization.gpu,power.draw,clocks_throttle_reasons.active"


class Sampler:
    """Samples the GPU (nvidia-smi every 100 ms) and the host (/proc every 200 ms)."""

    def __init__(self) -> None:
        self.samples: list[dict] = []
        self.worker_pid: int | None = None
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.smi = None
        try:
            self.smi = subprocess.Popen(
                ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
                 "-lms", "100"], stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read_smi, daemon=True).start()
        except OSError:
            pass
        threading.Thread(target=self._read_proc, daemon=True).start()

    def _add(self, rec: dict) -> None:
        with self.lock:
            self.samples.append(rec)

    def _read_smi(self) -> None:
        for line in self.smi.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 6:
                self._add({"t": time.time(), "src": "gpu", "pstate": parts[0], "sm_mhz": parts[1],
                           "mem_mhz": parts[2], "util": parts[3], "power_w": parts[4],
                           "throttle": parts[5]})

    @staticmethod
    def _cpu_totals() -> list[int]:
        return [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]

    def _threads(self, pid: int) -> dict[str, tuple[int, int]]:
        out = {}
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                f = task.joinpath("stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[task.name] = (int(f[11]) + int(f[12]), int(f[36]))  # utime+stime ticks, cpu
        return out

    def _read_proc(self) -> None:
        hz = os.sysconf("SC_CLK_TCK")
        prev, prev_t, prev_thr = self._cpu_totals(), time.time(), {}
        while not self.stop.wait(0.2):
            cur, now = self._cpu_totals(), time.time()
            d = [c - p for c, p in zip(cur, prev)]
            dt = now - prev_t
            idle = d[3] + d[4]
            rec = {"t": now, "src": "host", "busy_cores": (sum(d[:8]) - idle) / hz / dt,
                   "steal_cores": d[7] / hz / dt}
            if self.worker_pid:
                try:
                    thr = self._threads(self.worker_pid)
                except OSError:
                    thr = {}
                busy = {k: (v[0] - prev_thr[k][0]) / hz / dt for k, v in thr.items() if k in prev_thr}
                rec["worker_busy_threads"] = sorted((round(b, 2) for b in busy.values() if b > 0.05),
                                                    reverse=True)
                main = thr.get(str(self.worker_pid))
                rec["worker_main_cpu"] = main[1] if main else None
                prev_thr = thr
            self._add(rec)
            prev, prev_t = cur, now

    def close(self) -> None:
        self.stop.set()
        if self.smi is not None:
            self.smi.terminate()


def as_dicts(steps) -> list[dict]:
    """Logged or runner steps as step-log dicts (t: epoch s, s: duration s, shape)."""
    return [{"t": s.t_start, "s": s.duration_s, "shape": dataclasses.asdict(s.shape)} for s in steps]


def phase_report(name: str, steps: list[dict], samples: list[dict]) -> list[str]:
    """Per second of the phase: decode steps (count, median ms), GPU and host samples."""
    dec = [s for s in steps if s["shape"]["num_prefill_reqs"] == 0]
    if not dec:
        return [f"{name}: no decode steps"]
    ms = np.array([s["s"] for s in dec]) * 1e3
    lo = float(np.percentile(ms, 10))
    slow = ms > 1.8 * lo
    lines = [f"{name}: {len(dec)} decode steps, median {np.median(ms):.1f} ms, p10 {lo:.1f}, "
             f"p90 {np.percentile(ms, 90):.1f}; slow (>1.8 x p10): {slow.mean():.0%}"]
    t0 = dec[0]["t"]
    gpu = [x for x in samples if x["src"] == "gpu"]
    host = [x for x in samples if x["src"] == "host"]
    lines.append("   s  steps  med_ms  slow  bs   sm_mhz mem_mhz util power  throttle     busy steal  worker threads (cores) main_cpu")
    for sec in range(int(dec[-1]["t"] - t0) + 1):
        a, b = t0 + sec, t0 + sec + 1
        idx = [i for i, s in enumerate(dec) if a <= s["t"] < b]
        if not idx:
            continue
        g = [x for x in gpu if a <= x["t"] < b]
        h = [x for x in host if a <= x["t"] < b]
        gl = g[len(g) // 2] if g else {}
        hl = h[len(h) // 2] if h else {}
        bs = int(np.median([dec[i]["shape"]["num_reqs"] for i in idx]))
        lines.append(
            f"{sec:4d} {len(idx):6d} {np.median(ms[idx]):7.1f} {slow[idx].mean():5.0%} {bs:3d}  "
            f"{gl.get('sm_mhz', '-'):>7} {gl.get('mem_mhz', '-'):>7} {gl.get('util', '-'):>4} "
            f"{gl.get('power_w', '-'):>6} {gl.get('throttle', '-'):>10} "
            f"{hl.get('busy_cores', float('nan')):6.2f} {hl.get('steal_cores', float('nan')):5.2f}  "
            f"{hl.get('worker_busy_threads', '-')} {hl.get('worker_main_cpu', '-')}")
    return lines


def engine_args(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options these GPU diagnostics share (model, device, load, output folder)."""
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--requests", type=int, default=60, help="requests per replay (4 req/s)")
    return ap


def engine_setup(args: argparse.Namespace) -> tuple[dict, dict]:
    """(model config, `LLM` keyword arguments) of the engine: bench/gpu_validate.sh's knobs."""
    from realexec.engine.configs import builtin_config
    from realexec.fidelity.validate.plan import RunKnobs

    knobs = RunKnobs(max_num_seqs=256, max_num_batched_tokens=2048, num_gpu_blocks=8192)
    return builtin_config(args.model), {**knobs.to_dict(), "dtype": args.dtype,
                                        "device": args.device, "seed": 0, "model_seed": 0}


def main() -> None:
    ap = engine_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    ap.add_argument("--phases", default="served,served+gpu,inproc,served-1t")
    args = ap.parse_args()

    import torch

    from realexec.fidelity.validate.backends import ColocatedBackend, ServedBackend
    from realexec.fidelity.validate.speed_probe import serving_probe_trace
    from realexec.serving.replay.runner import replay

    args.out.mkdir(parents=True, exist_ok=True)
    cfg, kwargs = engine_setup(args)
    trace = serving_probe_trace(args.requests, 2048, seed=0)
    threads = torch.get_num_threads()
    sampler = Sampler()
    report: list[str] = [f"torch threads {threads}; {args.requests} requests at 4 req/s per replay"]
    t_start = time.time()

    def served(name: str, nthreads: int, hold_second_engine: bool) -> None:
        logdir = args.out / f"log-{name}"
        be = ServedBackend(cfg, kwargs, nthreads, logdir, pd=None)
        second = None
        try:
            sampler.worker_pid = next(iter(be.client.workers_status().values())).get("pid")
            if hold_second_engine:
                from realexec.engine.llm import LLM

                second = LLM(cfg, dtype=args.dtype, device=args.device, num_gpu_blocks=64)
            replay(trace, be.target, client=be.client, seed=1)  # warm-up
            be.replay(trace, seed=2)
            steps = as_dicts(s for role in be.steps.values() for s in role)
        finally:
            be.close()
            sampler.worker_pid = None
            del second
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        finish(name, steps)

    def finish(name: str, steps: list[dict]) -> None:
        (args.out / f"steps-{name}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
        with sampler.lock:
            samples = list(sampler.samples)
        lines = phase_report(name, steps, samples)
        print("\n".join(lines), flush=True)
        report.extend(lines)
        (args.out / "report.txt").write_text("\n".join(report) + "\n")

    for phase in args.phases.split(","):
        print(f"[{time.time() - t_start:6.1f} s] phase {phase}", flush=True)
        try:
            if phase == "served":
                served(phase, threads, False)
            elif phase == "served+gpu":
                served(phase, threads, True)
            elif phase == "served-1t":
                served(phase, 1, False)
            elif phase == "inproc":
                be = ColocatedBackend(cfg, kwargs, args.out / "log-inproc" / "engine.steps.jsonl")
                try:
                    be.replay(trace, seed=1)
                    be.replay(trace, seed=2)
                    steps = as_dicts(s for s in be.steps["colocated"] if s.shape.num_reqs)
                finally:
                    be.close()
                finish(phase, steps)
        except Exception as exc:  # keep the other phases
            report.append(f"{phase}: failed: {type(exc).__name__}: {exc}")
            print(report[-1], flush=True)
        with sampler.lock:
            (args.out / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in sampler.samples))
    sampler.close()


if __name__ == "__main__":
    main()
