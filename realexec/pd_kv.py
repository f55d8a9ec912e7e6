"""KV blocks on the wire: cut a request's blocks out of a `PagedKVCache` as zero-copy frames
(prefill side), collect received frames and write them into another pool (decode side).

A `kv` message carries `runs`: one entry `[layer, kv, token_start, num_tokens]` per tensor
frame, where `kv` is 0 for keys and 1 for values and the frame is that layer's K or V of
prompt tokens `[token_start, token_start + num_tokens)` as `[num_tokens, kv_heads, head_dim]`.
A frame is one run of consecutive block ids of the sender's pool, so it is a contiguous slice
of the pool tensor and goes out without a copy. When the blocks are scattered (runs smaller
than `ZERO_COPY_MIN_BYTES` on average) they are instead gathered into one frame per layer and
K/V (one copy; many small frames cost more than the copy). Token ranges (not block ids) cross the wire,
so the two sides may use different block sizes and block ids. The last run may extend past
the prompt into the tail of its final block; the receiver writes only prompt tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from realexec.kv_cache import PagedKVCache
from realexec.transport import Message, ProtocolError


def block_runs(block_ids: list[int]) -> list[tuple[int, int, int]]:
    """Runs of consecutive ids as (index in the table, first block id, length in blocks)."""
    runs: list[tuple[int, int, int]] = []
    for i, b in enumerate(block_ids):
        if runs and runs[-1][1] + runs[-1][2] == b:
            idx, first, n = runs[-1]
            runs[-1] = (idx, first, n + 1)
        else:
            runs.append((i, b, 1))
    return runs


# pyzmq copies any frame smaller than zmq.COPY_THRESHOLD (65536 bytes) instead of sending it
# zero-copy, and each frame adds per-part overhead; below this mean run size we gather.
ZERO_COPY_MIN_BYTES = 65536


def kv_frames(cache: PagedKVCache, block_ids: list[int], num_tokens: int,
              layers: range) -> tuple[list[list[int]], list[torch.Tensor]]:
    """(runs, tensors) covering the first `num_tokens` tokens of `block_ids` in `layers`;
    the tensors are views into `cache` (valid while the blocks are held), or gathered copies
    when the blocks are scattered."""
    bs = cache.block_size
    need = -(-num_tokens // bs)
    if need > len(block_ids):
        raise ValueError(f"{num_tokens} tokens need {need} blocks, the request holds {len(block_ids)}")
    runs, tensors = [], []
    block_runs_ = block_runs(block_ids[:need])
    frame_bytes = cache.spec.bytes_per_block // (2 * cache.spec.num_layers)  # one layer's K
    if need * frame_bytes < ZERO_COPY_MIN_BYTES * len(block_runs_) and len(block_runs_) > 1:
        ids = torch.tensor(block_ids[:need], dtype=torch.long, device=cache.device)
        shape = (-1, bs, cache.spec.num_kv_heads, cache.spec.head_dim)
        for layer in layers:
            for kv in (0, 1):  # whole-block rows: ~3x faster than gathering token slots
                runs.append([layer, kv, 0, need * bs])
                tensors.append(cache.kv[layer, kv].view(shape).index_select(0, ids).flatten(0, 1))
        return runs, tensors
    for idx, first, n in block_runs_:
        lo, hi = first * bs, (first + n) * bs
        for layer in layers:
            for kv in (0, 1):
                runs.append([layer, kv, idx * bs, n * bs])
                tensors.append(cache.kv[layer, kv, lo:hi])
    return runs, tensors


@dataclass
class StagedKV:
    """Frames of one request's KV received so far (views of ZMQ frames, not copied)."""

    request_id: str
    prefill_worker: str
    num_tokens: int
    num_layers: int
    parts: list[tuple[list[list[int]], list[torch.Tensor]]] = field(default_factory=list)
    covered: dict[tuple[int, int], int] = field(default_factory=dict)  # (layer, kv) -> tokens
    nbytes: int = 0  # tensor bytes received
    t_send: float = 0.0  # wall time (s) the sender sent its first message
    t_first_recv: float = 0.0
    t_last_recv: float = 0.0
    got_last: bool = False

    @property
    def complete(self) -> bool:
        """Every layer's K and V cover the whole prompt."""
        if not self.got_last:
            return False
        return all(self.covered.get((layer, kv), 0) >= self.num_tokens
                   for layer in range(self.num_layers) for kv in (0, 1))


def check_kv_message(msg: Message, cache: PagedKVCache) -> None:
    """ProtocolError unless the `kv` message's runs match its frames and this pool's shape."""
    body = msg.body
    runs = body["runs"]
    if len(runs) != len(msg.tensors):
        raise ProtocolError(f"kv {body['request_id']}: {len(runs)} runs for {len(msg.tensors)} frames")
    if body["num_tokens"] < 1:
        raise ProtocolError(f"kv {body['request_id']}: num_tokens must be >= 1")
    spec = cache.spec
    want = (spec.num_kv_heads, spec.head_dim)
    for i, (run, t) in enumerate(zip(runs, msg.tensors)):
        if len(run) != 4 or not all(isinstance(x, int) and not isinstance(x, bool) for x in run):
            raise ProtocolError(f"kv run {i}: expected [layer, kv, token_start, num_tokens], got {run}")
        layer, kv, start, n = run
        if not (0 <= layer < spec.num_layers and kv in (0, 1) and start >= 0 and n >= 1):
            raise ProtocolError(f"kv run {i}: {run} out of range ({spec.num_layers} layers)")
        if t.dtype != spec.dtype or tuple(t.shape) != (n, *want):
            raise ProtocolError(
                f"kv run {i}: frame is {str(t.dtype)}{list(t.shape)}, this pool needs "
                f"{str(spec.dtype)}{[n, *want]}"
            )


def stage(staged: StagedKV, msg: Message) -> None:
    """Add a validated `kv` message's frames to `staged`."""
    now = time.time()
    if not staged.parts:
        staged.t_send = float(msg.body["t_send"])
        staged.t_first_recv = now
    staged.t_last_recv = now
    staged.parts.append((msg.body["runs"], msg.tensors))
    for (layer, kv, _start, n), t in zip(msg.body["runs"], msg.tensors):
        staged.covered[(layer, kv)] = staged.covered.get((layer, kv), 0) + n
        staged.nbytes += t.numel() * t.element_size()
    staged.got_last = staged.got_last or bool(msg.body["last"])


def write_staged(cache: PagedKVCache, staged: StagedKV, block_ids: list[int],
                 skip_tokens: int) -> None:
    """Copy the staged prompt KV into `block_ids` of `cache`, tokens [skip_tokens, num_tokens)
    (the first `skip_tokens` are already cached locally)."""
    bs = cache.block_size
    n = staged.num_tokens
    if -(-n // bs) > len(block_ids):
        raise ValueError(f"{n} prompt tokens need {-(-n // bs)} blocks, {len(block_ids)} allocated")
    ids = torch.tensor(block_ids, dtype=torch.long)
    slots = (ids[:, None] * bs + torch.arange(bs)).reshape(-1).to(cache.device)
    for runs, tensors in staged.parts:
        for (layer, kv, start, count), t in zip(runs, tensors):
            lo, hi = max(start, skip_tokens), min(start + count, n)
            if lo >= hi:
                continue
            src = t[lo - start : hi - start].to(cache.device, non_blocking=True)
            cache.kv[layer, kv].index_copy_(0, slots[lo:hi], src)
