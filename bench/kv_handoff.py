"""PD hand-off host cost (CPU): python bench/kv_handoff.py [--reps N]

What a prefill worker pays per request to hand its prompt's KV to the transport (cut the
frames, `transport.encode`, `send_multipart` over a real ipc:// DEALER -> ROUTER to another
process), and what the decode side pays to write them into its pool, for the ladder's default
model (llama-50m: 6 layers, 12 KB of fp32 KV per token), side by side in one run:

- `per-layer`: the wire format before protocol 2: one frame per layer and K/V (12 frames),
  scattered blocks gathered with one `index_select` per frame;
- `one-frame`: `pd_kv.kv_frames` now: scattered blocks gathered into a single frame of every
  layer, K and V (one `index_select`), written with one `index_copy_`.

Blocks are scattered (no two consecutive ids, as in a pool after some churn) or contiguous
(one run: both formats send 12 zero-copy views). Medians over `--reps` requests, ms.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BLOCK_SIZE = 16
POOL_BLOCKS = 1024


def _spec():
    import torch

    from realexec.engine.configs import builtin_config
    from realexec.engine.kv_cache import KVCacheSpec

    c = builtin_config("llama-50m")
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    return KVCacheSpec(c["num_hidden_layers"], c["num_key_value_heads"], head_dim, BLOCK_SIZE,
                       torch.float32)


def _sink(endpoint: str, ready: mp.Queue) -> None:
    """Receive and drop messages until one with a single b"stop" frame."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    ready.put(True)
    while True:
        frames = sock.recv_multipart(copy=False)
        if len(frames) == 2 and frames[1].bytes == b"stop":
            break
    ctx.destroy(linger=0)


def per_layer_frames(cache, block_ids: list[int], num_tokens: int):
    """The protocol-1 sender: a frame per layer and K/V, with as many torch ops per frame as it
    had (shaped [1, 1, tokens, heads, dim] so the receiver side can share `write_staged`)."""
    import torch

    from realexec.serving.pd.kv_wire import block_runs

    bs = cache.block_size
    need = -(-num_tokens // bs)
    spec = cache.spec
    runs, tensors = [], []
    if len(block_runs(block_ids[:need])) == 1:
        lo, hi = block_ids[0] * bs, (block_ids[0] + need) * bs
        for layer in range(spec.num_layers):
            for kv in (0, 1):
                runs.append([layer, 1, kv, 1, 0, need * bs])
                tensors.append(cache.kv[layer : layer + 1, kv : kv + 1, lo:hi])
        return runs, tensors
    ids = torch.tensor(block_ids[:need], dtype=torch.long)
    shape = (-1, bs, spec.num_kv_heads, spec.head_dim)
    frame = (1, 1, need * bs, spec.num_kv_heads, spec.head_dim)
    for layer in range(spec.num_layers):
        for kv in (0, 1):
            runs.append([layer, 1, kv, 1, 0, need * bs])
            tensors.append(cache.kv[layer, kv].view(shape).index_select(0, ids).view(frame))
    return runs, tensors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()

    import torch

    from realexec.engine.kv_cache import PagedKVCache
    from realexec.serving.pd.kv_wire import (
        StagedKV,
        check_kv_message,
        kv_frames,
        stage,
        write_staged,
    )
    from realexec.serving.transport import decode, encode

    torch.set_num_threads(1)  # as a worker process runs
    spec = _spec()
    src = PagedKVCache(spec, POOL_BLOCKS, torch.device("cpu"))
    dst = PagedKVCache(spec, POOL_BLOCKS, torch.device("cpu"))
    src.kv.copy_(torch.randn(src.kv.shape, generator=torch.Generator().manual_seed(0)))
    dst.kv.zero_()
    tmp = tempfile.mkdtemp(prefix="kvpd-handoff-")
    endpoint = f"ipc://{tmp}/kv"
    mctx = mp.get_context("spawn")
    ready = mctx.Queue()
    proc = mctx.Process(target=_sink, args=(endpoint, ready), daemon=True)
    proc.start()
    ready.get(timeout=60)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(endpoint)
    rnd = random.Random(0)
    formats = {"per-layer": per_layer_frames,
               "one-frame": lambda c, ids, n: kv_frames(c, ids, n, range(spec.num_layers))}
    print(f"llama-50m KV ({spec.bytes_per_token} B/token), block size {BLOCK_SIZE}, "
          f"ipc:// DEALER -> ROUTER, medians over {args.reps} requests (ms)")
    print(f"{'tokens':>6} {'blocks':>10} {'format':>10} {'frames':>6} {'cut':>6} {'encode':>6} "
          f"{'send':>6} {'sender':>7} {'write':>6} {'sender ratio':>12}")
    for num_tokens in (64, 256, 1024):
        need = -(-num_tokens // BLOCK_SIZE)
        for layout in ("contiguous", "scattered"):
            rows, nframes = {}, {}
            for rep in range(args.reps + 5):  # the formats alternate, request by request
                if layout == "scattered":
                    ids = rnd.sample(range(0, POOL_BLOCKS, 2), need)
                else:
                    first = rnd.randrange(0, POOL_BLOCKS - need)
                    ids = list(range(first, first + need))
                for name, cut in formats.items():
                    t0 = time.perf_counter()
                    runs, tensors = cut(src, ids, num_tokens)
                    t1 = time.perf_counter()
                    body = {"request_id": "r", "num_tokens": num_tokens, "block_size": BLOCK_SIZE,
                            "runs": runs, "last": True, "t_send": time.time(),
                            "prefill_worker": "bench"}
                    frames = encode("kv", body, tensors)
                    t2 = time.perf_counter()
                    sock.send_multipart(frames, copy=False, track=True)
                    t3 = time.perf_counter()
                    msg = decode([bytes(memoryview(f)) for f in frames])
                    check_kv_message(msg, dst)
                    staged = StagedKV("r", "bench", num_tokens, spec.num_layers)
                    t4 = time.perf_counter()
                    stage(staged, msg)
                    write_staged(dst, staged, ids, 0)
                    t5 = time.perf_counter()
                    if rep >= 5:
                        rows.setdefault(name, []).append((t1 - t0, t2 - t1, t3 - t2, t3 - t0, t5 - t4))
                        nframes[name] = len(tensors)
                    time.sleep(0.002)  # let the I/O thread drain, as between engine steps
            med = {k: [statistics.median(r[i] for r in v) * 1e3 for i in range(5)] for k, v in rows.items()}
            base = med["per-layer"][3]
            for name, m in med.items():
                print(f"{num_tokens:>6} {layout:>10} {name:>10} {nframes[name]:>6} {m[0]:>6.3f} {m[1]:>6.3f} "
                      f"{m[2]:>6.3f} {m[3]:>7.3f} {m[4]:>6.3f} {m[3] / base:>12.2f}")
    sock.send_multipart([b"stop"])
    proc.join(10)
    ctx.destroy(linger=0)


if __name__ == "__main__":
    main()
