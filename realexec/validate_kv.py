"""KV-cache transport between a prefill worker and a decode worker (1P1D over ZMQ).

The decode side pulls (as vLLM's NIXL connector does): once it has allocated blocks for a
request it sends `pull`; the prefill side gathers the request's KV from its paged cache into
one contiguous `[layers, 2, tokens, kv_heads, head_dim]` tensor, sends it as one message
(JSON header + raw bytes, zero-copy), and frees its blocks; the decode side scatters the
tensor into its own blocks. `kvpd profile` times the same path (`measure_transfer`).

Messages are ZMQ multipart `[kind, json header, payload?]` over PUSH/PULL `ipc://` sockets,
each socket owned by one thread.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import zmq

from realexec.kv_cache import KVCacheSpec, PagedKVCache

# bf16/fp16 travel as raw 16-bit words (numpy has no bfloat16)
_WIRE_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16}
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16)}


def ipc_address(tag: str) -> str:
    """A fresh `ipc://` endpoint in a private temporary folder."""
    return f"ipc://{Path(tempfile.mkdtemp(prefix='kvpd-'))}/{tag}"


def send_msg(sock: zmq.Socket, kind: str, meta: dict[str, Any] | None = None,
             payload: Any = None) -> None:
    parts = [kind.encode(), json.dumps(meta or {}).encode()]
    if payload is not None:
        parts.append(payload)
    sock.send_multipart(parts, copy=payload is None)


def recv_msg(sock: zmq.Socket, flags: int = 0) -> tuple[str, dict[str, Any], Any]:
    parts = sock.recv_multipart(flags=flags, copy=False)
    payload = parts[2].buffer if len(parts) > 2 else None
    return bytes(parts[0].buffer).decode(), json.loads(bytes(parts[1].buffer)), payload


def token_slots(block_ids: list[int], block_size: int, start: int, end: int,
                device: torch.device) -> torch.Tensor:
    """Cache slots of token positions [start, end) of a request with block table `block_ids`."""
    pos = torch.arange(start, end)
    ids = torch.tensor(block_ids, dtype=torch.long)[pos // block_size]
    return (ids * block_size + pos % block_size).to(device)


def gather_kv(cache: PagedKVCache, block_ids: list[int], start: int, end: int
              ) -> tuple[dict[str, Any], Any]:
    """The KV of positions [start, end) as (header, contiguous host buffer)."""
    slots = token_slots(block_ids, cache.block_size, start, end, cache.device)
    t = cache.kv[:, :, slots].to("cpu").contiguous()
    header = {"shape": list(t.shape), "dtype": str(t.dtype), "start": start, "end": end}
    wire = t.view(_WIRE_VIEW.get(t.dtype, t.dtype))
    return header, wire.numpy()


def scatter_kv(cache: PagedKVCache, block_ids: list[int], header: dict[str, Any],
               payload: Any) -> None:
    """Write a `gather_kv` buffer into this cache's blocks `block_ids`."""
    dtype = _DTYPES[header["dtype"]]
    flat = torch.frombuffer(payload, dtype=_WIRE_VIEW.get(dtype, dtype))
    t = flat.view(dtype).view(header["shape"])
    slots = token_slots(block_ids, cache.block_size, header["start"], header["end"], cache.device)
    cache.kv[:, :, slots] = t.to(cache.device)


# ---------------------------------------------------------------- worker processes
def spawn_worker(module: str, args: dict[str, Any]) -> subprocess.Popen:
    """Start `python -m module JSON` (a fresh interpreter: no fork of a torch process)."""
    return subprocess.Popen([sys.executable, "-m", module, json.dumps(args)])


def wait_msg(sock: zmq.Socket, proc: subprocess.Popen, timeout_s: float, what: str
             ) -> tuple[str, dict[str, Any], Any]:
    """The next message on `sock`; RuntimeError if `proc` dies or nothing comes in time."""
    deadline = time.monotonic() + timeout_s
    while not sock.poll(200):
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: the worker process exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: no answer from the worker process in {timeout_s:g} s")
    return recv_msg(sock)


def stop_worker(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- profiling the transport
def echo_worker(args: dict[str, Any]) -> None:
    """Decode-side stand-in: scatter every KV message it receives, reply with the time."""
    if args.get("threads"):
        torch.set_num_threads(args["threads"])
    spec = args["spec"]
    kv_spec = KVCacheSpec(spec["num_layers"], spec["num_kv_heads"], spec["head_dim"],
                          spec["block_size"], _DTYPES[spec["dtype"]])
    cache = PagedKVCache(kv_spec, args["num_blocks"], torch.device(args["device"]))
    ctx = zmq.Context()
    rx, tx = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    rx.connect(args["addr_in"])
    tx.connect(args["addr_out"])
    send_msg(tx, "ready")
    while True:
        kind, meta, payload = recv_msg(rx)
        if kind == "stop":
            break
        scatter_kv(cache, meta["block_ids"], meta, payload)
        if cache.device.type == "cuda":
            torch.cuda.synchronize(cache.device)
        send_msg(tx, "ack", {"t": time.perf_counter()})
    rx.close(linger=0)
    tx.close(linger=0)
    ctx.term()


def measure_transfer(cache: PagedKVCache, token_counts: list[int], repeats: int, warmup: int,
                     threads: int | None = None) -> list[tuple[int, int, list[float]]]:
    """One-way seconds to move the KV of n tokens to another process and scatter it there,
    for each n: [(n, bytes, times)]. Both processes read the same monotonic clock."""
    spec = cache.spec
    need_blocks = max(-(-n // spec.block_size) for n in token_counts)
    if need_blocks > cache.num_blocks:
        raise ValueError(f"kv transfer of {max(token_counts)} tokens needs {need_blocks} blocks; "
                         f"the profiling cache has {cache.num_blocks}")
    to_worker, from_worker = ipc_address("kv"), ipc_address("ack")
    ctx = zmq.Context()
    tx, rx = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    tx.bind(to_worker)
    rx.bind(from_worker)
    spec_d = {"num_layers": spec.num_layers, "num_kv_heads": spec.num_kv_heads,
              "head_dim": spec.head_dim, "block_size": spec.block_size, "dtype": str(spec.dtype)}
    proc = spawn_worker("realexec.validate_kv", {
        "spec": spec_d, "num_blocks": need_blocks, "device": str(cache.device),
        "threads": threads, "addr_in": to_worker, "addr_out": from_worker})
    out = []
    try:
        wait_msg(rx, proc, 120, "kv transfer profile")
        for n in token_counts:
            blocks = list(range(-(-n // spec.block_size)))
            times = []
            for r in range(warmup + repeats):
                t0 = time.perf_counter()
                header, buf = gather_kv(cache, blocks, 0, n)
                header["block_ids"] = blocks
                send_msg(tx, "kv", header, buf)
                _, meta, _ = wait_msg(rx, proc, 120, "kv transfer profile")
                if r >= warmup:
                    times.append(meta["t"] - t0)
            out.append((n, int(buf.nbytes), times))
        send_msg(tx, "stop")
        stop_worker(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        tx.close(linger=0)
        rx.close(linger=0)
        ctx.term()
    return out


if __name__ == "__main__":
    echo_worker(json.loads(sys.argv[1]))
