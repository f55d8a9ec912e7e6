"""Serving benchmark (CPU): python bench/serving.py [--quick]

(a) ZeroMQ KV transfer between two processes (ipc:// and tcp loopback) of a 2,048-token
    request's KV of the ladder's default model, through the PD workers' own code
    (`pd_kv.kv_frames` -> `transport.encode` -> send -> `decode` -> `check_kv_message` ->
    `stage` -> `write_staged` into the receiver's pool), in GB/s.
(b) Replay of a 2-minute slice of the Azure conversation trace, colocated vs 1P1D, with
    lengths and time scaled so that one CPU worker is busy but not overloaded; client-side
    TTFT / TPOT / throughput side by side.
(c) Front-end overhead per token: client-side TPOT minus the engine's step time, for one
    request streamed alone and over the colocated replay.

Every worker runs one torch thread (on a shared 2-core machine more threads per process only
contend); 1P1D therefore uses two worker processes where colocated uses one.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = "llama-50m"  # the ladder's default model (realexec.engine.configs.DEFAULT_MODEL)
PROMPT_TOKENS = 2048
BLOCK_SIZE = 16
AZURE = REPO.parent / "shared" / "data" / "traces" / "azure2023_AzureLLMInferenceTrace_conv.csv"


def _spec():
    import torch

    from realexec.engine.configs import builtin_config
    from realexec.engine.kv_cache import KVCacheSpec

    c = builtin_config(MODEL)
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    return KVCacheSpec(c["num_hidden_layers"], c["num_key_value_heads"], head_dim, BLOCK_SIZE,
                       torch.float32)


def _receiver(endpoint: str, q: mp.Queue) -> None:
    """Receive `kv` messages into a pool exactly as a decode worker does; reply with times."""
    import torch

    torch.set_num_threads(1)
    from realexec.engine.kv_cache import PagedKVCache
    from realexec.serving.pd.kv_wire import StagedKV, check_kv_message, stage, write_staged
    from realexec.serving.transport import decode

    spec = _spec()
    nblocks = PROMPT_TOKENS // BLOCK_SIZE
    cache = PagedKVCache(spec, 2 * nblocks, torch.device("cpu"))
    cache.kv.zero_()  # touch the pages once, as a warm pool would have
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    q.put(sock.getsockopt(zmq.LAST_ENDPOINT).decode())
    dst_ids = list(range(nblocks, 2 * nblocks))
    staged: dict[str, StagedKV] = {}
    while True:
        frames = sock.recv_multipart(copy=False)
        if bytes(frames[1].buffer) == b"stop":
            break
        msg = decode(frames[1:])
        check_kv_message(msg, cache)
        rid = msg.body["request_id"]
        st = staged.setdefault(rid, StagedKV(rid, "bench", msg.body["num_tokens"], spec.num_layers))
        stage(st, msg)
        if st.complete:
            t_received = time.time()
            write_staged(cache, st, dst_ids, 0)
            t_written = time.time()
            del staged[rid]
            sock.send_multipart([frames[0].bytes, msgpack.packb([st.t_send, t_received, t_written, st.nbytes])])
    ctx.destroy(linger=0)


def bench_transfer(transport: str, mode: str, fragmented: bool, reps: int) -> dict[str, float]:
    import torch

    from realexec.engine.kv_cache import PagedKVCache
    from realexec.serving.pd.kv_wire import kv_frames
    from realexec.serving.transport import encode

    torch.set_num_threads(1)  # as a worker process runs
    tmp = tempfile.mkdtemp(prefix="kvpd-bench-")
    endpoint = "tcp://127.0.0.1:*" if transport == "tcp" else f"ipc://{tmp}/kv"
    ctx_mp = mp.get_context("spawn")
    q = ctx_mp.Queue()
    proc = ctx_mp.Process(target=_receiver, args=(endpoint, q), daemon=True)
    proc.start()
    endpoint = q.get(timeout=120)
    spec = _spec()
    nblocks = PROMPT_TOKENS // BLOCK_SIZE
    cache = PagedKVCache(spec, 2 * nblocks, torch.device("cpu"))
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=torch.Generator().manual_seed(0)))
    ids = list(range(2 * nblocks))
    if fragmented:  # a long-running pool: blocks scattered, no two neighbours consecutive
        ids = ids[::2]
        random.Random(0).shuffle(ids)
    ids = ids[:nblocks]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    layers = spec.num_layers
    groups = [range(i, i + 1) for i in range(layers)] if mode == "layerwise" else [range(layers)]
    gbps, total_gbps, rtts = [], [], []
    for rep in range(reps + 1):  # the first is a warm-up
        t0 = time.time()
        for k, g in enumerate(groups):
            runs, tensors = kv_frames(cache, ids, PROMPT_TOKENS, g)
            body = {"request_id": f"r{rep}", "num_tokens": PROMPT_TOKENS, "block_size": BLOCK_SIZE,
                    "runs": runs, "last": k == len(groups) - 1, "t_send": t0,
                    "prefill_worker": "bench"}
            sock.send_multipart(encode("kv", body, tensors), copy=False)
        t_send, t_recv, t_written, nbytes = msgpack.unpackb(sock.recv())
        t_ack = time.time()
        if rep:
            gbps.append(nbytes / (t_recv - t_send) / 1e9)
            total_gbps.append(nbytes / (t_written - t_send) / 1e9)
            rtts.append(t_ack - t0)
    sock.send_multipart([b"stop"])
    proc.join(10)
    ctx.destroy(linger=0)
    return {"bytes": nbytes, "frames": len(tensors) * len(groups), "gbps": statistics.median(gbps),
            "gbps_best": max(gbps),
            "gbps_with_write": statistics.median(total_gbps), "ack_ms": statistics.median(rtts) * 1e3}


def part_a(reps: int) -> None:
    spec = _spec()
    print(f"(a) KV transfer of a {PROMPT_TOKENS}-token request of {MODEL} "
          f"({spec.num_layers} layers x K,V x {spec.num_kv_heads} heads x {spec.head_dim}, fp32 = "
          f"{PROMPT_TOKENS * spec.bytes_per_token / 2**20:.0f} MiB), median (best) of {reps}; "
          f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"    {'transport':9s} {'mode':9s} {'blocks':10s} {'frames':>6s} {'GB/s':>14s} "
          f"{'GB/s incl. write':>16s} {'ack ms':>7s}")
    for transport in ("ipc", "tcp"):
        for mode, frag in (("full", False), ("full", True), ("layerwise", False)):
            r = bench_transfer(transport, mode, frag, reps)
            print(f"    {transport:9s} {mode:9s} {'scattered' if frag else 'contiguous':10s} "
                  f"{r['frames']:6d} {r['gbps']:6.2f} ({r['gbps_best']:5.2f}) "
                  f"{r['gbps_with_write']:16.2f} {r['ack_ms']:7.1f}")


def _stats_ms(s: dict, key: str) -> str:
    d = s[key]
    return f"{d['mean'] * 1e3:8.1f} {d['p50'] * 1e3:8.1f} {d['p90'] * 1e3:8.1f}" if d["mean"] else "-"


def _overhead_ms(reqs) -> tuple[list[float], list[float]]:
    """(per request: client TPOT minus the mean engine step time of its tokens after the first;
    per token: client inter-token gap minus the step that made the token), in ms."""
    per_req, per_tok = [], []
    for r in reqs:
        steps = r.annotations.get("step_s") or []
        k = len(r.token_times)
        if k > 2 and len(steps) == k:
            tpot = (r.token_times[-1] - r.token_times[0]) / (k - 1)
            per_req.append((tpot - float(np.mean(steps[1:]))) * 1e3)
            per_tok.extend(((np.diff(r.token_times) - np.asarray(steps[1:])) * 1e3).tolist())
    return per_req, per_tok


def part_bc(args: argparse.Namespace) -> None:
    import workloads
    from realexec.serving.client import EngineClient
    from realexec.serving.config import ServeConfig
    from realexec.serving.replay.runner import prepare_trace, replay

    llm_kwargs = {"num_gpu_blocks": 2048, "block_size": BLOCK_SIZE}
    raw = workloads.load_trace(AZURE)
    trace = prepare_trace(raw, window_s=(args.window_start_s, args.window_start_s + 120.0),
                          scale_prompt=args.scale_prompt, scale_output=args.scale_output,
                          time_scale=args.time_scale, max_model_len=2048)
    print(f"\n    load average before (b): {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"(b) replay: Azure conversation trace, 2-minute slice from t={args.window_start_s:g} s: "
          f"{len(trace)} requests, prompts x{args.scale_prompt} (mean {trace.prompt_len.mean():.0f} "
          f"tokens), outputs x{args.scale_output} (mean {trace.output_len.mean():.1f}), arrival "
          f"times x{args.time_scale} ({len(trace) / max(trace.duration_s, 1e-9):.1f} req/s over "
          f"{trace.duration_s:.0f} s)")
    results = {}
    for name, pd in (("colocated", None), ("1P1D", (1, 1))):
        cfg = ServeConfig(model=MODEL, llm_kwargs=llm_kwargs, pd=pd, num_threads=1)
        with EngineClient(cfg) as client:
            if name == "colocated":
                alone = client.generate(list(range(100, 164)),
                                        {"temperature": 0.0, "max_tokens": 256, "ignore_eos": True})
            results[name] = replay(trace, "engine" if pd is None else "pd:1:1", client=client, seed=0)
    print(f"    {'':26s} {'colocated':>26s} {'1P1D':>26s}")
    print(f"    {'':26s} {'mean     p50      p90':>26s} {'mean     p50      p90':>26s}")
    sc, sp = results["colocated"].summary, results["1P1D"].summary
    for key, label in (("ttft_s", "TTFT ms"), ("tpot_s", "TPOT ms"), ("itl_s", "ITL ms"),
                       ("e2e_s", "E2E ms")):
        print(f"    {label:26s} {_stats_ms(sc, key):>26s} {_stats_ms(sp, key):>26s}")
    for key, label in (("output_tokens_per_s", "output tokens/s"), ("requests_per_s", "requests/s")):
        print(f"    {label:26s} {sc['throughput'][key]:26.2f} {sp['throughput'][key]:26.2f}")
    print(f"    {'finished / total':26s} {sc['requests']['finished']:>20d} / {sc['requests']['total']:<3d}"
          f" {sp['requests']['finished']:>20d} / {sp['requests']['total']:<3d}")
    kv = sp.get("kv_transfer") or {}
    if kv:
        rec = results["1P1D"].records
        ok = np.isfinite(rec["kv_transfer_s"])
        print(f"    1P1D KV transfers: {kv['count']}, mean {kv['bytes_mean'] / 1e6:.2f} MB in "
              f"{kv['seconds_mean'] * 1e3:.2f} ms (per-transfer GB/s: mean {kv['gbps_mean']:.2f}, "
              f"p50 {np.median(rec['kv_transfer_bytes'][ok] / rec['kv_transfer_s'][ok]) / 1e9:.2f}), "
              f"{kv['lost']} lost")
    steps = alone.step_s[1:]
    tpot = (alone.token_times[-1] - alone.token_times[0]) / (len(alone.token_times) - 1)
    gaps = (np.diff(alone.token_times) - np.asarray(steps)) * 1e3
    per_req, per_tok = _overhead_ms(results["colocated"].requests)
    print(f"\n(c) front-end overhead per token (client TPOT - engine step time), colocated {MODEL}")
    print(f"    one request alone, 256 tokens: client TPOT {tpot * 1e3:.2f} ms, engine step "
          f"{np.mean(steps) * 1e3:.2f} ms -> overhead {(tpot - np.mean(steps)) * 1e3:.3f} ms/token "
          f"(per token: p50 {np.median(gaps):.3f}, p90 {np.percentile(gaps, 90):.3f} ms)")
    if per_req:
        print(f"    over the colocated replay ({len(per_req)} requests): mean "
              f"{np.mean(per_req):.3f} ms/token (per request p50 {np.median(per_req):.3f}; "
              f"per token p50 {np.median(per_tok):.3f}, p90 {np.percentile(per_tok, 90):.3f} ms)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=10, help="transfers per configuration in (a)")
    p.add_argument("--window-start-s", type=float, default=600.0)
    p.add_argument("--scale-prompt", type=float, default=0.04)
    p.add_argument("--scale-output", type=float, default=0.04)
    p.add_argument("--time-scale", type=float, default=0.75)
    p.add_argument("--skip-a", action="store_true")
    p.add_argument("--skip-bc", action="store_true")
    args = p.parse_args()
    t0 = time.perf_counter()
    if not args.skip_a:
        part_a(args.reps)
    if not args.skip_bc:
        part_bc(args)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
