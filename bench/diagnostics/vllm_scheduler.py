"""kvpd's scheduler against vLLM's own scheduler, step by step, on the CPU.

Both run the same burst with no model: every request waits at t = 0, and a request whose
tokens are all computed after a step samples one token. vLLM's side is the `Scheduler` class
of a released vLLM wheel, run under an interpreter that can import it: the V1 scheduler
(`vllm_v1_driver.py`) from 0.8 on, the V0 one (`vllm_v0_driver.py`) before. kvpd's side is
`simulator.core.Scheduler` with what `engine: {name: vllm, version: ...}` sets (scheduler
limits, chunked prefill, prefix caching, V0's whole-prompt allocation and watermark) and the
KV pool kvpd plans for the model and GPU. vLLM V1's block pool keeps one block back (its null
block), so V1 is given kvpd's count + 1. Each case prints both sides' steps, scheduled tokens
and preemptions, and the first step whose (scheduled tokens, scheduled requests, preemptions
so far) differ, if any.

    # once: vLLM's wheel unpacked, and an interpreter with its pure-Python dependencies
    pip download --no-deps vllm==0.11.0 -d /tmp/w && unzip -q /tmp/w/vllm-0.11.0-*.whl -d /tmp/vllm-0.11.0
    python -m venv --system-site-packages /tmp/vv && /tmp/vv/bin/pip install cachetools \
        msgspec blake3 cbor2 psutil setproctitle aiohttp openai-harmony pybase64 diskcache
    python bench/diagnostics/vllm_scheduler.py --vllm /tmp/vllm-0.11.0 --python /tmp/vv/bin/python
    # V0: the same with vllm==0.7.3 and --version 0.7.3 (0.6.x also wants mistral-common and
    # opencv-python-headless; 0.17 gguf, llguidance and xgrammar)

Checked (2026-12-03): V1 0.10.2, 0.11.0 and 0.17.0 identical at every step in every case (0.17.0
with async scheduling: within 1%); V0 0.6.6 and 0.7.3 identical at every step in every case.
Checked (2026-12-05) under V1 0.11.0, and 0.17.0 with --no-async-scheduling: all 18 V1 cases
identical at every step on both, preemptions included: the seven above, five with vLLM V1's
hybrid KV cache manager (gpt-oss, Gemma 3: one full-attention and one or six sliding-window
groups), two of those with shared prefixes and
prefix caching, two of Mistral-7B-v0.1 (every layer sliding), one with shared prefixes, and
two of Qwen3.5-27B (Gated DeltaNet: three groups of linear layers, one state page per request
each, in vLLM's 784-token attention blocks), one starved into 46 preemptions.
The check found that blocks slid out of a window must be freed latest first, as vLLM frees
them (the all-sliding shared-prefix run differed from step 311 before). Both sides sample
token id 1, so blocks holding outputs hash alike on both. `--case TEXT` runs the cases whose
label has it.

The V1 cases are the published suite's GPUStack burst shapes (Qwen3-14B on one H100 and one
A100, vLLM 0.11.0's limits for each), a KV-starved decode-heavy run without prefix caching
that preempts hundreds of times, models mixing sliding-window and full-attention layers
(gpt-oss-120b, Gemma 3 27B), whose KV cache config holds the hybrid manager's groups,
Mistral-7B-v0.1, whose one group slides, and Qwen3.5-27B, whose linear layers' groups hold
each request's state (vLLM's MambaSpec). The V0 cases are dstack's DeepSeek-R1 shape (3,200 / 800)
and others, with the long-context default (chunked prefill) and with max_model_len 8,192
(whole prompts in steps of their own).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from simulator.cluster.cluster import plan_pool, pool_cache_config
from simulator.core import (
    CacheConfig,
    EngineCore,
    IdealExecutor,
    Request,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
)
from simulator.cost.models import get_model
from simulator.engines.presets import VLLM_V1_FROM, version3
from simulator.scenario import PoolSpec, scenario_from_dict

DRIVERS = {"v1": Path(__file__).with_name("vllm_v1_driver.py"),
           "v0": Path(__file__).with_name("vllm_v0_driver.py")}
BLOCK = 16
VLLM_ASYNC_FROM = (0, 14, 0)  # SchedulerConfig.async_scheduling None (on where supported) from here
# (label, model, hardware, requests, prompt tokens, output tokens, max_model_len or None for
# the model's, prefix caching or None for the engine's default, pool blocks or None for kvpd's
# plan)
V1_CASES = [
    ("Qwen3-14B 1 x H100, 32000/100 x 100", "qwen3-14b", "h100-sxm", 100, 32000, 100, None,
     None, None),
    ("Qwen3-14B 1 x H100, 4000/200 x 500", "qwen3-14b", "h100-sxm", 500, 4000, 200, None, None,
     None),
    ("Qwen3-14B 1 x H100, 2000/100 x 500", "qwen3-14b", "h100-sxm", 500, 2000, 100, None, None,
     None),
    ("Qwen3-14B 1 x H100, 128/4 x 1000", "qwen3-14b", "h100-sxm", 1000, 128, 4, None, None, None),
    ("Qwen3-14B 1 x A100, 32000/100 x 100", "qwen3-14b", "a100-80gb-sxm", 100, 32000, 100, None,
     None, None),
    ("Qwen3-14B 1 x A100, 4000/200 x 500", "qwen3-14b", "a100-80gb-sxm", 500, 4000, 200, None,
     None, None),
    ("KV-starved, 512/1000 x 300, no prefix caching, 3000 blocks", "qwen3-14b", "a100-80gb-sxm",
     300, 512, 1000, None, False, 3000),
    # gpt-oss: 18 sliding-window (128 tokens) and 18 full-attention layers, so the hybrid KV
    # cache manager's two groups (GPUStack's burst shapes on one H100, then a KV-starved run)
    ("gpt-oss-120b 1 x H100 (KV groups), 32000/100 x 100", "gpt-oss-120b", "h100-sxm", 100,
     32000, 100, None, None, None),
    ("gpt-oss-120b 1 x H100 (KV groups), 4000/200 x 500", "gpt-oss-120b", "h100-sxm", 500, 4000,
     200, None, None, None),
    ("gpt-oss-120b (KV groups), 2000/1000 x 300, 3000 blocks", "gpt-oss-120b", "h100-sxm", 300,
     2000, 1000, None, False, 3000),
    # Gemma 3 27B: 52 sliding-window (1,024 tokens) and 10 full-attention layers, so one full
    # and six sliding groups of 10 layers
    ("gemma-3-27b 1 x H100 (KV groups), 8000/500 x 200", "gemma-3-27b", "h100-sxm", 200, 8000,
     500, None, None, None),
    ("gemma-3-27b (KV groups), 3000/1500 x 200, 2500 blocks", "gemma-3-27b", "h100-sxm", 200,
     3000, 1500, None, False, 2500),
    # shared prefixes with prefix caching: a hit needs every sliding group's window before it
    ("gpt-oss-120b (KV groups), 3000/300 x 300 sharing 2000, caching, 3000 blocks",
     "gpt-oss-120b", "h100-sxm", 300, 3000, 300, None, True, 3000, 2000),
    ("gemma-3-27b (KV groups), 4000/300 x 200 sharing 3000, caching, 4000 blocks",
     "gemma-3-27b", "h100-sxm", 200, 4000, 300, None, True, 4000, 3000),
    # every layer sliding (Mistral-7B-v0.1, 4,096 tokens): one table whose blocks slide out
    ("mistral-7b (sliding), 12000/300 x 100 sharing 8000, caching, 3000 blocks",
     "mistral-7b", "h100-sxm", 100, 12000, 300, None, True, 3000, 8000),
    ("mistral-7b (sliding), 6000/1000 x 200, 1500 blocks", "mistral-7b", "h100-sxm", 200,
     6000, 1000, None, False, 1500),
    # Gated DeltaNet (Qwen3.5-27B: 16 softmax and 48 linear layers): each request's state is
    # one block per group of 16 layers, in vLLM's 784-token attention blocks
    ("qwen3.5-27b 1 x H100 (linear state), 4000/500 x 300", "qwen3.5-27b", "h100-sxm", 300,
     4000, 500, None, None, None),
    ("qwen3.5-27b (linear state), 2000/1500 x 200, 120 blocks", "qwen3.5-27b", "h100-sxm", 200,
     2000, 1500, None, None, 120),
]
V0_CASES = [
    (f"Qwen3-14B 1 x H100, {p}/{o} x {n}{', max_model_len 8192' if ml else ''}", "qwen3-14b",
     "h100-sxm", n, p, o, ml, None, None)
    for ml in (None, 8192) for n, p, o in ((100, 3200, 800), (500, 4000, 200), (1024, 3200, 800))
] + [("KV-starved, 512/1000 x 300, 3000 blocks", "qwen3-14b", "h100-sxm", 300, 512, 1000, None,
      None, 3000)]


def prompt_ids(i: int, n: int, shared: int = 0) -> list[int]:
    """Request i's prompt (the driver's `prompt_ids`): distinct per request, but for its first
    `shared` tokens, which requests i, i + 3, i + 6, ... share."""
    return [((i % 3 + 100003 if j < shared else i) * 7919 + j * 104729) % 150000 + 1
            for j in range(n)]


def kvpd_setup(model: str, hardware: str, version: str, max_model_len: int | None = None
               ) -> tuple[SchedulerConfig, bool, int, dict[str, int]]:
    """kvpd's scheduler config, prefix-caching default, planned KV blocks and the `CacheConfig`
    keys of its layout (sliding windows, KV cache groups, linear-attention state and block
    size; {} for none) for `model` on one `hardware` under vLLM `version`'s preset."""
    data = {"model": model, "hardware": hardware, "engine": {"name": "vllm", "version": version}}
    if get_model(model).checkpoint_quant_method == "mxfp4":  # (as released: MXFP4 experts)
        data.update(dtype="fp4", quantization={"method": "mxfp4", "scope": "experts"})
    if max_model_len:
        data["scheduler"] = {"max_model_len": max_model_len}
    sc = scenario_from_dict(data)
    s = sc.scheduler
    cfg = SchedulerConfig(max_num_seqs=s.max_num_seqs,
                          max_num_batched_tokens=s.max_num_batched_tokens,
                          max_model_len=s.max_model_len or sc.model_spec().max_position_embeddings,
                          enable_chunked_prefill=s.enable_chunked_prefill,
                          long_prefill_token_threshold=s.long_prefill_token_threshold,
                          capacity_policy=s.capacity_policy, mixed_batches=s.mixed_batches,
                          prompt_allocation=s.prompt_allocation,
                          admission_watermark=s.admission_watermark,
                          append_needs_free_block=s.append_needs_free_block)
    pool = plan_pool(sc, sc.model_spec(), PoolSpec(), "colocated")
    cache = pool_cache_config(sc, sc.model_spec(), pool)  # (the simulator's own, per replica)
    window: dict = {}
    if cache.sliding_groups:  # the hybrid KV cache manager's groups
        window = {"sliding_window": cache.sliding_window, "sliding_groups": cache.sliding_groups}
    elif cache.free_outside_window:  # every layer slides: one table whose blocks slide out
        window = {"sliding_window": cache.sliding_window, "free_outside_window": True}
    elif cache.state_blocks:  # linear attention: each request's state, one block per group of
        # layers, in blocks of vLLM's size for the model (the preset's cache.block_size)
        window = {"state_blocks": cache.state_blocks, "block_size": cache.block_size}
    return cfg, cache.enable_prefix_caching, pool.num_gpu_blocks, window


def kvpd_trace(cfg: SchedulerConfig, blocks: int, prefix: bool, n: int, prompt: int,
               out: int, window: dict[str, int], shared: int = 0) -> list[list[int]]:
    """[scheduled tokens, scheduled requests, preemptions so far] of every kvpd step."""
    extra = dict(window)
    block = extra.pop("block_size", BLOCK)
    sched = Scheduler(cfg, CacheConfig(num_gpu_blocks=blocks, block_size=block,
                                       enable_prefix_caching=prefix, **extra))
    # every sampled token is id 1, as the vLLM side samples (so output blocks hash alike)
    engine = EngineCore(sched, IdealExecutor(step_s=0.01, token_id=1))
    for i in range(n):
        engine.add_request(Request(str(i), prompt_token_ids=prompt_ids(i, prompt, shared),
                                   sampling_params=SamplingParams(max_tokens=out,
                                                                  ignore_eos=True)), 0.0)
    trace, preempted, now = [], 0, 0.0
    while engine.has_unfinished_requests():
        step = engine.step(now)
        so = step.scheduler_output
        preempted += len(so.preempted_req_ids)
        if so.num_new_tokens:
            trace.append([sum(so.num_new_tokens), len(so.reqs), preempted])
        now = step.end_time
    return trace


def vllm_trace(python: str, vllm_dir: str, engine: str, args: dict) -> list[list[int]]:
    env = {**os.environ, "PYTHONPATH": vllm_dir, "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([python, str(DRIVERS[engine]), json.dumps(args)], env=env, text=True,
                          capture_output=True, check=False)
    if done.returncode:
        sys.exit(f"vLLM's side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["trace"]


def first_difference(a: list[list[int]], b: list[list[int]]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", required=True, help="folder holding an unpacked vLLM wheel")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter that can import that vLLM (default: this one)")
    ap.add_argument("--version", default="0.11.0", help="that vLLM's version, for kvpd's preset")
    ap.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                    help="V1: schedule each step before the one in flight has finished (vLLM's "
                         "default from 0.14; kvpd schedules after it)")
    ap.add_argument("--case", default="", help="only the cases whose label contains this")
    a = ap.parse_args()
    v = version3(a.version)
    if v is None:
        sys.exit(f"--version {a.version!r}: not a vLLM version")
    engine = "v1" if v[:2] >= VLLM_V1_FROM else "v0"
    asynchronous = engine == "v1" and (a.async_scheduling or (a.async_scheduling is None
                                                               and v >= VLLM_ASYNC_FROM))
    print(f"vLLM {a.version} ({engine.upper()} scheduler"
          f"{', async scheduling' if asynchronous else ''})")
    print(f"{'case':58s} {'side':5s} {'steps':>6s} {'tokens':>9s} {'preempt':>7s}  agreement")
    for label, model, hw, n, prompt, out, max_len, prefix, blocks, *rest in (
            V1_CASES if engine == "v1" else V0_CASES):
        if a.case not in label:
            continue
        shared = rest[0] if rest else 0  # prompt tokens every third request shares
        cfg, default_prefix, planned, window = kvpd_setup(model, hw, a.version, max_len)
        prefix = default_prefix if prefix is None else prefix
        blocks = planned if blocks is None else blocks
        t0 = time.perf_counter()
        ours = kvpd_trace(cfg, blocks, prefix, n, prompt, out, window, shared)
        t1 = time.perf_counter()
        args = {"num_blocks": blocks + (engine == "v1"), "n": n, "prompt": prompt, "out": out,
                "budget": cfg.max_num_batched_tokens, "seqs": cfg.max_num_seqs,
                "prefix": prefix, "block": window.get("block_size", BLOCK),
                "max_len": cfg.max_model_len}
        if window.get("sliding_groups"):  # the hybrid KV cache manager's groups
            args.update(window=window["sliding_window"], sliding_groups=window["sliding_groups"])
        elif window.get("state_blocks"):  # linear-attention layers: their state's groups
            args["mamba_groups"] = window["state_blocks"]
        elif window:  # one sliding-window group
            args.update(window=window["sliding_window"], all_sliding=True)
        if shared:
            args["shared"] = shared
        if engine == "v0":
            args["chunked"] = cfg.enable_chunked_prefill
        elif a.async_scheduling or (a.async_scheduling is None and v >= VLLM_ASYNC_FROM):
            args["async_scheduling"] = True
        theirs = vllm_trace(a.python, a.vllm, engine, args)
        t2 = time.perf_counter()
        where = first_difference(ours, theirs)
        tokens = [sum(s[0] for s in tr) for tr in (ours, theirs)]
        verdict = ("identical, step for step" if where is None
                   else f"first differs at step {where} (kvpd {ours[where:where + 1]}, vLLM "
                        f"{theirs[where:where + 1]}); tokens {tokens[0] / tokens[1] - 1:+.2%}")
        for side, tr, secs in (("kvpd", ours, t1 - t0), ("vLLM", theirs, t2 - t1)):
            print(f"{label if side == 'kvpd' else '':58s} {side:5s} {len(tr):6d} "
                  f"{sum(s[0] for s in tr):9d} {tr[-1][2] if tr else 0:7d}  "
                  f"{verdict if side == 'kvpd' else f'({secs:.1f} s)'}")
        print(f"{'':58s} {'':5s} (limits {cfg.max_num_seqs} seqs / {cfg.max_num_batched_tokens} "
              f"tokens, chunked prefill {'on' if cfg.enable_chunked_prefill else 'off'}, "
              f"{blocks} blocks, prefix caching {'on' if prefix else 'off'}"
              + (f", {window['sliding_groups']} sliding group(s) of window "
                 f"{window['sliding_window']}" if window.get("sliding_groups") else
                 f", {window['state_blocks']} state blocks of {window['block_size']} tokens"
                 if window.get("state_blocks") else
                 f", every layer sliding by {window['sliding_window']}" if window else "") + ")")


if __name__ == "__main__":
    main()
