"""ZeroMQ wire format of kvpd's serving processes: msgpack header + raw tensor frames.

Socket topology (every socket is ipc:// in a private temp dir or tcp://127.0.0.1 with an
ephemeral port; a worker binds its sockets and reports the endpoints in its `ready`):

    front end PUSH --------> worker PULL   "input"   add, add_remote, abort, peers, shutdown
    front end PULL <-------- worker PUSH   "output"  ready, outputs, heartbeat, fatal
                                                     (the front end binds one PULL that
                                                     every worker connects to)
    prefill DEALER <-------> decode ROUTER "kv"      kv (+ tensor frames), kv_cancel  P -> D
                                                     kv_ack                           D -> P
                                                     (one DEALER per decode worker, its
                                                     identity the prefill worker's name)

Request flow. Colocated: `add` -> one `outputs` item per step with the new token(s) -> the
item with `fin` set. PD: the front end picks a prefill worker P and a decode worker D and
sends `add` (with `kv_target` = D) to P. P computes the prompt, samples the first token and
pushes the request's prompt KV to D (`kv`: all layers in one message, or one message per
layer as each is computed); its `outputs` item carries the first token and `handoff`. The
front end streams that token and sends `add_remote` (prompt, sampling, first token, P) to D.
D allocates blocks (waiting while its pool is full), copies the staged KV into them, starts
decoding and answers `kv_ack(ok)`, on which P frees its blocks; if the KV is not complete
`kv_timeout_s` after D allocated, D recomputes the prompt and answers `kv_ack(ok=False)`.
D's `outputs` carry the remaining tokens and, once, the transfer's bytes / seconds / GB/s.
The item with which a request leaves a worker (`fin` or `handoff`) carries `pre`, how often
that worker preempted it, when it did. A request's first tokens from the worker that ran its
prompt carry `sched_age`, how many seconds before that the worker's first step on it began
(the front end turns it into the request's queueing without needing the worker's clock).

A message is a multipart ZMQ message. Frame 0 is a msgpack map
`{"v": PROTOCOL_VERSION, "type": str, "body": map, "tensors": [[dtype, [dims...]], ...]}`;
frames 1..n are the raw bytes of the n tensors the header describes, in order (C order,
native little-endian). Tensor frames are sent with `copy=False` (from the KV pool itself
when `pd_kv.kv_frames` sends views: zero-copy on CPU) and decoded as `torch.frombuffer` views of the received frame.

Every incoming message is validated by `decode`: header size, msgpack well-formedness,
protocol version, known type, each body field's presence and type (`SCHEMAS`), tensor
dtype/shape and that each frame has exactly the bytes its shape needs. A message that fails
raises `ProtocolError` (a ValueError) naming what was wrong; receivers log it, count it and
carry on serving everyone else.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import msgpack

PROTOCOL_VERSION = 2  # 2: `kv` runs carry layer and K/V ranges (pd_kv)
# Headers are small maps (an `add` with a 8k-token prompt packs to ~25 KB); anything larger
# than this is rejected before unpacking so a garbled frame cannot make us allocate much.
MAX_HEADER_BYTES = 16 * 1024 * 1024

# dtype name -> bytes per element (names as torch prints them without the "torch." prefix)
DTYPE_SIZES: dict[str, int] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "uint8": 1,
}

# Field types: a Python type / tuple of types, or "list[int]", "list[str]", "list[dict]".
def _f(kind: Any, optional: bool = False) -> tuple[Any, bool]:
    return kind, optional


_NUM = (int, float)
SCHEMAS: dict[str, dict[str, tuple[Any, bool]]] = {
    # front end -> worker
    "add": {"request_id": _f(str), "prompt_token_ids": _f("list[int]"), "sampling": _f(dict),
            "priority": _f(int, True), "kv_target": _f((str, type(None)), True)},
    "add_remote": {"request_id": _f(str), "prompt_token_ids": _f("list[int]"),
                   "sampling": _f(dict), "first_token_id": _f(int), "prefill_worker": _f(str),
                   "priority": _f(int, True)},
    "abort": {"request_ids": _f("list[str]")},
    "peers": {"decode_kv": _f(dict)},
    "shutdown": {},
    # worker -> front end
    "ready": {"worker": _f(str), "role": _f(str), "pid": _f(int), "endpoints": _f(dict),
              "model": _f(dict)},
    "outputs": {"worker": _f(str), "step_id": _f(int), "step_s": _f(_NUM), "t_wall": _f(_NUM),
                "items": _f("list[dict]"), "stats": _f(dict)},
    "heartbeat": {"worker": _f(str), "t_wall": _f(_NUM), "stats": _f(dict)},
    "fatal": {"worker": _f(str), "message": _f(str)},
    # prefill <-> decode
    "kv": {"request_id": _f(str), "num_tokens": _f(int), "block_size": _f(int),
           "runs": _f("list[list]"), "last": _f(bool), "t_send": _f(_NUM),
           "prefill_worker": _f(str)},
    "kv_cancel": {"request_id": _f(str)},
    "kv_ack": {"request_id": _f(str), "ok": _f(bool), "reason": _f(str, True)},
}

# Fields of one entry of `outputs.items`.
OUTPUT_ITEM_SCHEMA: dict[str, tuple[Any, bool]] = {
    "id": _f(str), "tok": _f("list[int]"), "fin": _f((str, type(None))),
    "stop": _f((str, type(None)), True), "cached": _f(int, True), "err": _f(str, True),
    "handoff": _f(bool, True), "kv": _f(dict, True), "t_tok": _f("list[float]", True),
    "pre": _f(int, True), "sched_age": _f(_NUM, True),
    # with logprobs asked for: [logprob of the token, top ids, top logprobs] per token of `tok`
    "lp": _f("list[list]", True),
    # with prompt logprobs asked for, on the item with the first token: the same per prompt
    # token after the first
    "plp": _f("list[list]", True),
}


class ProtocolError(ValueError):
    """A message that is not a valid kvpd message (garbled, truncated, wrong fields);
    `request_id`: the request it names, when its body has one (the receiver can then fail
    that request instead of leaving it waiting)."""

    request_id: str | None = None


@dataclass
class Message:
    """A decoded message; `tensors` are torch views of the received frames (no copy)."""

    type: str
    body: dict[str, Any]
    tensors: list[Any] = field(default_factory=list)
    nbytes: int = 0  # total bytes on the wire (header + frames)


def _tensor_bytes(t: Any) -> tuple[str, list[int], Any]:
    """(dtype name, shape, zero-copy byte buffer) of a CPU tensor or numpy array."""
    try:
        import torch
    except ImportError:  # pragma: no cover - transport without torch only sends numpy
        torch = None
    if torch is not None and isinstance(t, torch.Tensor):
        if t.device.type != "cpu":
            t = t.cpu()  # device tensors are staged through host memory (one copy)
        t = t.contiguous()
        name = str(t.dtype).removeprefix("torch.")
        return name, list(t.shape), t.view(-1).view(torch.uint8).numpy()
    import numpy as np

    arr = np.ascontiguousarray(t)
    return str(arr.dtype), list(arr.shape), arr.view(np.uint8).reshape(-1)


def encode(msg_type: str, body: dict[str, Any] | None = None, tensors: list[Any] = ()) -> list:
    """The frames of a message: packed header, then each tensor's bytes (zero-copy views).

    Send with `socket.send_multipart(frames, copy=False)`; the tensors must stay unchanged
    until ZMQ has sent them.
    """
    if msg_type not in SCHEMAS:
        raise ValueError(f"unknown message type {msg_type!r}; known: {sorted(SCHEMAS)}")
    metas, bufs = [], []
    for t in tensors:
        name, shape, buf = _tensor_bytes(t)
        if name not in DTYPE_SIZES:
            raise ValueError(f"dtype {name} cannot be sent; supported: {sorted(DTYPE_SIZES)}")
        metas.append([name, shape])
        bufs.append(buf)
    header = msgpack.packb(
        {"v": PROTOCOL_VERSION, "type": msg_type, "body": body or {}, "tensors": metas},
        use_bin_type=True,
    )
    return [header, *bufs]


_LIST_ITEM = {"list[int]": int, "list[str]": str, "list[dict]": dict, "list[list]": list,
              "list[float]": (int, float)}


def _check_kind(value: Any, kind: Any) -> bool:
    """Whether `value` has the schema type `kind` (bools never count as numbers)."""
    if isinstance(kind, str):
        inner = _LIST_ITEM[kind]
        return isinstance(value, list) and all(
            isinstance(x, inner) and not isinstance(x, bool) for x in value
        )
    return isinstance(value, kind) and not (isinstance(value, bool) and bool not in (
        kind if isinstance(kind, tuple) else (kind,)))


def check_fields(body: Any, schema: dict[str, tuple[Any, bool]], where: str) -> None:
    """ProtocolError unless `body` is a map with every required field of the right type."""
    if not isinstance(body, dict):
        raise ProtocolError(f"{where}: expected a map, got {type(body).__name__}")
    for name, (kind, optional) in schema.items():
        if name not in body:
            if optional:
                continue
            raise ProtocolError(f"{where}: missing field {name!r}")
        if body[name] is None and optional:
            continue
        if not _check_kind(body[name], kind):
            want = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
            raise ProtocolError(
                f"{where}: field {name!r} must be {want}, got {type(body[name]).__name__}"
            )


def _frame_buffer(frame: Any) -> memoryview:
    """Bytes of a frame: a zmq.Frame received with copy=False, or any buffer object."""
    buf = getattr(frame, "buffer", None)
    return buf if isinstance(buf, memoryview) else memoryview(frame).cast("B")


def decode(frames: list[Any]) -> Message:
    """Validate and decode a received multipart message (frames as bytes or zmq.Frame)."""
    if not frames:
        raise ProtocolError("empty message")
    head = _frame_buffer(frames[0])
    if len(head) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(head)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(head, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for garbage
        raise ProtocolError(f"header is not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    if header.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {header.get('v')!r}, expected {PROTOCOL_VERSION}")
    msg_type = header.get("type")
    if msg_type not in SCHEMAS:
        raise ProtocolError(f"unknown message type {msg_type!r}")
    body = header.get("body")
    try:
        check_fields(body, SCHEMAS[msg_type], f"{msg_type} message")
    except ProtocolError as exc:
        rid = body.get("request_id") if isinstance(body, dict) else None
        exc.request_id = rid if isinstance(rid, str) else None
        raise
    if msg_type == "outputs":
        for i, item in enumerate(body["items"]):
            check_fields(item, OUTPUT_ITEM_SCHEMA, f"outputs.items[{i}]")
    metas = header.get("tensors")
    if not isinstance(metas, list):
        raise ProtocolError("header field 'tensors' must be a list")
    if len(metas) != len(frames) - 1:
        raise ProtocolError(
            f"header describes {len(metas)} tensors but {len(frames) - 1} data frames arrived"
        )
    tensors = [_tensor(i, meta, _frame_buffer(f)) for i, (meta, f) in enumerate(zip(metas, frames[1:]))]
    nbytes = len(head) + sum(t.numel() * t.element_size() for t in tensors)
    return Message(msg_type, body, tensors, nbytes)


def _tensor(i: int, meta: Any, buf: memoryview) -> Any:
    if not (isinstance(meta, list) and len(meta) == 2 and isinstance(meta[0], str)
            and isinstance(meta[1], list)):
        raise ProtocolError(f"tensor {i}: expected [dtype, shape], got {meta!r}")
    name, shape = meta
    if name not in DTYPE_SIZES:
        raise ProtocolError(f"tensor {i}: dtype {name!r} not in {sorted(DTYPE_SIZES)}")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ProtocolError(f"tensor {i}: shape {shape!r} must be non-negative integers")
    need = math.prod(shape) * DTYPE_SIZES[name]
    if len(buf) != need:
        raise ProtocolError(
            f"tensor {i}: frame has {len(buf)} bytes, {name}{shape} needs {need} (truncated?)"
        )
    import torch

    dtype = getattr(torch, name)
    if need == 0:
        return torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():  # received frames are read-only; we never write to them
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buf, dtype=dtype).view(shape)
