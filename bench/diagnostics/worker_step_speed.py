"""Are serving workers' steps slower than the same steps in process? (CPU)

    python bench/diagnostics/worker_step_speed.py [--calibration FILE] [--requests 8] [--output-len 300]

One decode-only phase (`--requests` prompts of 64 tokens submitted together, then
`--output-len` tokens each) runs in process, in a colocated engine worker and in a 1P1D
PD decode worker, then in process again, one after another in this run. The workers log
their steps (`ServeConfig.step_log_dir`). It prints the median full-batch decode step
and each backend's ratio to the in-process median. With a calibration it also prints the
cost model's error on each backend's own steps.

`kvpd validate` found PD workers' steps 3-27% slower than calibrated under real traffic.
This isolates one question: is a worker process slower in itself, with no KV traffic, no
prefills beside it and no front-end load? Not beyond this VM's noise (2026-11-29, two
runs): the PD decode worker's median step was 33.4 ms and 40.6 ms; the in-process medians
around it were 35.2-38.7 ms and 34.8-37.8 ms.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

import numpy as np
import torch

from realexec.engine.llm import LLM
from realexec.serving.client import EngineClient
from realexec.serving.config import ServeConfig
from realexec.serving.step_log import read_step_log

KW = dict(num_gpu_blocks=512, block_size=16, max_num_seqs=32, max_num_batched_tokens=512,
          max_model_len=2048, dtype="fp32", seed=0, model_seed=0)
PROMPT_LEN = 64


def _cost_model(path: str | None):
    if not path:
        return None
    from realexec.fidelity.profile.facts import model_identity
    from simulator.calibrate.calibrated import calibrated_cost_model

    cfg, name = model_identity("llama-50m")
    return calibrated_cost_model(path, cfg, name, "fp32")


def _full_batch(steps: list, n: int) -> list:
    return [s for s in steps if s.shape.num_decode_reqs == n and s.shape.num_prefill_reqs == 0]


def in_process(prompts: list[list[int]], sampling: dict) -> list:
    torch.set_num_threads(1)
    llm = LLM("llama-50m", record_steps=True, **KW)
    for i, p in enumerate(prompts):
        llm.add_request(f"r{i}", p, sampling)
    while llm.has_unfinished_requests():
        llm.step()
    return list(llm.runner.steps)


def served(prompts: list[list[int]], sampling: dict, pd: tuple[int, int] | None) -> list:
    logs = tempfile.mkdtemp(prefix="kvpd-steps-")
    cfg = ServeConfig(model="llama-50m", llm_kwargs=KW, pd=pd, num_threads=1, step_log_dir=logs)
    with EngineClient(cfg) as client:
        reqs = [client.submit(p, sampling) for p in prompts]
        for r in reqs:
            if not r.done.wait(600):
                raise RuntimeError(f"{r.request_id} did not finish within 600 s")
        time.sleep(0.5)  # idle workers flush their logs
    name = "decode-0" if pd else "engine-0"
    return read_step_log(os.path.join(logs, f"{name}.steps.jsonl"))[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", help="calibration YAML of llama-50m on this CPU (optional)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=300)
    args = ap.parse_args()
    cm = _cost_model(args.calibration)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 30000) for _ in range(PROMPT_LEN)] for _ in range(args.requests)]
    sampling = {"temperature": 0.0, "max_tokens": args.output_len, "ignore_eos": True}
    runs = [("in process", lambda: in_process(prompts, sampling)),
            ("engine worker", lambda: served(prompts, sampling, None)),
            ("PD decode worker", lambda: served(prompts, sampling, (1, 1))),
            ("in process again", lambda: in_process(prompts, sampling))]
    base = None
    print(f"{'backend':18s} {'steps':>6s} {'median ms':>10s} {'vs in process':>14s}"
          + (f" {'cost model':>11s}" if cm else ""))
    for label, run in runs:
        steps = _full_batch(run(), args.requests)
        med = float(np.median([s.duration_s for s in steps]))
        base = base or med
        line = f"{label:18s} {len(steps):6d} {med * 1e3:10.1f} {med / base:13.2f}x"
        if cm:
            pred = sum(cm.step_time(s.shape) for s in steps)
            line += f" {pred / sum(s.duration_s for s in steps) - 1:+10.1%}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
