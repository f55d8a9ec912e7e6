"""Timing the PD KV transport for `kvpd profile`: the serving stack's own path, end to end.

One-way time for the KV of n prompt tokens to go from a prefill worker's paged cache into a
decode worker's cache: `pd_kv.kv_frames` (pool views or one gathered frame) -> `transport.encode` -> ZMQ
DEALER -> ROUTER over `ipc://` -> `transport.decode` -> `pd_kv.stage` -> `pd_kv.write_staged`
in a second process (`python -m realexec.fidelity.profile.kv_transfer`), as `realexec/serving/pd/prefill.py` and
`realexec/serving/pd/decode.py` do. Both processes read the same monotonic clock
(`time.perf_counter`, system-wide on Linux), so the receiver reports when it is done.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import zmq

from realexec.engine.kv_cache import KVCacheSpec, PagedKVCache
from realexec.serving.pd.kv_wire import StagedKV, check_kv_message, kv_frames, stage, write_staged
from realexec.serving.transport import decode, encode

_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16)}
STARTUP_TIMEOUT_S = 120.0




def _receiver(args: dict[str, Any]) -> None:
    """Decode-side stand-in: write every `kv` message into its pool, reply (plain JSON, not
    the serving protocol) with the time it finished."""
    if args.get("threads"):
        torch.set_num_threads(args["threads"])
    s = args["spec"]
    spec = KVCacheSpec(s["num_layers"], s["num_kv_heads"], s["head_dim"], s["block_size"],
                       _DTYPES[s["dtype"]])
    cache = PagedKVCache(spec, args["num_blocks"], torch.device(args["device"]))
    ctx = zmq.Context()
    kv, ack = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PUSH)
    kv.bind(args["kv"])
    ack.connect(args["ack"])
    ack.send_json({"t": time.perf_counter()})
    while True:
        frames = kv.recv_multipart(copy=False)[1:]  # drop the DEALER identity
        msg = decode(frames)
        if msg.type == "shutdown":
            break
        check_kv_message(msg, cache)
        staged = StagedKV(msg.body["request_id"], msg.body["prefill_worker"],
                          msg.body["num_tokens"], spec.num_layers, spec.num_planes)
        stage(staged, msg)
        write_staged(cache, staged, list(range(args["num_blocks"])), 0)
        if cache.device.type == "cuda":
            torch.cuda.synchronize(cache.device)
        ack.send_json({"t": time.perf_counter()})
    kv.close(linger=0)
    ack.close(linger=0)
    ctx.term()


def _wait(sock: zmq.Socket, proc: subprocess.Popen, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not sock.poll(200):
        if proc.poll() is not None:
            raise RuntimeError(f"kv transfer profile: the receiving process exited "
                               f"with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"kv transfer profile: no answer in {timeout_s:g} s")
    return sock.recv_json()


def measure_transfer(cache: PagedKVCache, token_counts: list[int], repeats: int, warmup: int,
                     threads: int | None = None) -> list[tuple[int, int, list[float]]]:
    """[(n tokens, bytes, one-way seconds per repeat)] for each n in `token_counts`."""
    spec = cache.spec
    need = max(-(-n // spec.block_size) for n in token_counts)
    if need > cache.num_blocks:
        raise ValueError(f"kv transfer of {max(token_counts)} tokens needs {need} blocks; "
                         f"the profiling cache has {cache.num_blocks}")
    tmp = Path(tempfile.mkdtemp(prefix="kvpd-prof-"))  # removed below
    addr_kv, addr_ack = f"ipc://{tmp}/kv", f"ipc://{tmp}/ack"
    ctx = zmq.Context()
    ack = ctx.socket(zmq.PULL)
    ack.bind(addr_ack)
    spec_d = {"num_layers": spec.num_layers, "num_kv_heads": spec.num_kv_heads,
              "head_dim": spec.head_dim, "block_size": spec.block_size, "dtype": str(spec.dtype)}
    args = {"spec": spec_d, "num_blocks": need, "device": str(cache.device), "threads": threads,
            "kv": addr_kv, "ack": addr_ack}
    proc = subprocess.Popen([sys.executable, "-m", "realexec.fidelity.profile.kv_transfer", json.dumps(args)])
    kv = ctx.socket(zmq.DEALER)
    kv.setsockopt(zmq.IDENTITY, b"profile-prefill")
    out = []
    try:
        _wait(ack, proc, STARTUP_TIMEOUT_S)
        kv.connect(addr_kv)
        blocks = list(range(need))
        for n in token_counts:
            times = []
            for r in range(warmup + repeats):
                t0 = time.perf_counter()
                runs, tensors = kv_frames(cache, blocks, n, range(spec.num_layers))
                body = {"request_id": f"p{n}-{r}", "num_tokens": n, "block_size": spec.block_size,
                        "runs": runs, "last": True, "t_send": time.time(),
                        "prefill_worker": "profile-prefill"}
                kv.send_multipart(encode("kv", body, tensors), copy=False)
                t_done = _wait(ack, proc, STARTUP_TIMEOUT_S)["t"]
                if r >= warmup:
                    times.append(t_done - t0)
            out.append((n, n * spec.bytes_per_token, times))
        kv.send_multipart(encode("shutdown", {}))
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kv.close(linger=0)
        ack.close(linger=0)
        ctx.term()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    _receiver(json.loads(sys.argv[1]))
