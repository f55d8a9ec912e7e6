"""KV blocks on the wire: cut a request's blocks out of a `PagedKVCache` as frames (prefill
side), collect received frames and write them into another pool (decode side).

A `kv` message carries `runs`: one entry `[first_layer, num_layers, first_kv, num_kv,
token_start, num_tokens]` per tensor frame, and the frame is
`kv[first_layer : first_layer + num_layers, first_kv : first_kv + num_kv]` (kv 0: keys,
1: values; an MLA model's pool has one plane, its latents) of prompt tokens
`[token_start, token_start + num_tokens)`, shaped `[num_layers, num_kv, num_tokens, kv_heads,
head_dim]`. A CPU pool whose blocks lie in long runs of consecutive ids sends one zero-copy view
per run, layer and plane (`[1, 1, ...]` frames); scattered blocks, and any device pool, are
gathered into one frame of all the message's layers and planes (`[layers, planes, ...]`): one
copy, one frame. Token ranges (not block
ids) cross the wire, so the two sides may use different block sizes and block ids. A frame may
extend past the prompt into the tail of its final block; the receiver writes only prompt
tokens.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from realexec.engine.kv_cache import PagedKVCache
from realexec.serving.transport import Message, ProtocolError


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


# A zero-copy frame still costs host time to slice, encode and send: 35-60 us on this 2-core
# VM (bench/kv_handoff.py), as long as copying 200-350 KB at its ~6 GB/s. Below this mean
# frame size (one layer's K of one run of blocks) gathering all into one frame is cheaper.
ZERO_COPY_MIN_BYTES = 256 * 1024


def kv_frames(cache: PagedKVCache, block_ids: list[int], num_tokens: int,
              layers: range) -> tuple[list[list[int]], list[torch.Tensor]]:
    """(runs, tensors) covering the first `num_tokens` tokens of `block_ids` in `layers`.

    On a CPU pool whose blocks lie in long runs (`ZERO_COPY_MIN_BYTES` or more per frame) the
    tensors are views into `cache` (valid while the blocks are held), one per run, layer and
    K/V. Otherwise (short prompts, scattered blocks, or a device pool that must go through
    host memory anyway: one device-to-host copy per frame) all of it is gathered into one
    tensor `[layers, planes, tokens, kv_heads, head_dim]` with a single copy."""
    if layers.step != 1 or not layers:
        raise ValueError(f"layers must be a non-empty range of consecutive layers, got {layers}")
    bs = cache.block_size
    need = -(-num_tokens // bs)
    if need > len(block_ids):
        raise ValueError(f"{num_tokens} tokens need {need} blocks, the request holds {len(block_ids)}")
    block_runs_ = block_runs(block_ids[:need])
    planes = cache.spec.num_planes  # K and V, or an MLA latent
    frame_bytes = cache.spec.bytes_per_block // (planes * cache.spec.num_layers)  # one layer's K
    if cache.device.type != "cpu" or need * frame_bytes < ZERO_COPY_MIN_BYTES * len(block_runs_):
        ids = torch.tensor(block_ids[:need], dtype=torch.long, device=cache.device)
        spec = cache.spec
        pool = cache.kv[layers.start:layers.stop]
        blocks = pool.view(len(layers), planes, -1, bs, spec.num_kv_heads, spec.head_dim)
        # whole-block rows: ~3x faster than gathering token slots
        frame = blocks.index_select(2, ids).flatten(2, 3)
        return [[layers.start, len(layers), 0, planes, 0, need * bs]], [frame]
    runs, tensors = [], []
    for idx, first, n in block_runs_:
        lo, hi = first * bs, (first + n) * bs
        for layer in layers:
            for kv in range(planes):
                runs.append([layer, 1, kv, 1, idx * bs, n * bs])
                tensors.append(cache.kv[layer : layer + 1, kv : kv + 1, lo:hi])
    return runs, tensors


@dataclass
class StagedKV:
    """Frames of one request's KV received so far (views of ZMQ frames, not copied)."""

    request_id: str
    prefill_worker: str
    num_tokens: int
    num_layers: int
    num_planes: int = 2  # K and V; 1 for an MLA latent pool
    parts: list[tuple[list[list[int]], list[torch.Tensor]]] = field(default_factory=list)
    covered: dict[tuple[int, int], int] = field(default_factory=dict)  # (layer, kv) -> tokens
    nbytes: int = 0  # tensor bytes received
    t_send: float = 0.0  # wall time (s) the sender sent its first message
    t_first_recv: float = 0.0
    t_last_recv: float = 0.0
    got_last: bool = False

    @property
    def complete(self) -> bool:
        """Every layer's K and V (or latent) cover the whole prompt."""
        if not self.got_last:
            return False
        return all(self.covered.get((layer, kv), 0) >= self.num_tokens
                   for layer in range(self.num_layers) for kv in range(self.num_planes))


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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
        if len(run) != 6 or not all(isinstance(x, int) and not isinstance(x, bool) for x in run):
            raise ProtocolError(f"kv run {i}: expected [first_layer, num_layers, first_kv, "
                                f"num_kv, token_start, num_tokens], got {run}")
        layer, num_layers, kv, num_kv, start, n = run
        if not (layer >= 0 and num_layers >= 1 and layer + num_layers <= spec.num_layers
                and kv >= 0 and num_kv >= 1 and kv + num_kv <= spec.num_planes and start >= 0
                and n >= 1):
            planes = "K and V" if spec.num_planes == 2 else "1 plane (MLA latent)"
            raise ProtocolError(f"kv run {i}: {run} out of range ({spec.num_layers} layers, "
                                f"{planes})")
        if t.dtype != spec.dtype or tuple(t.shape) != (num_layers, num_kv, n, *want):
            raise ProtocolError(
                f"kv run {i}: frame is {_dtype(t.dtype)}{list(t.shape)}, this pool needs "
                f"{_dtype(spec.dtype)}{[num_layers, num_kv, n, *want]}"
            )


def stage(staged: StagedKV, msg: Message) -> None:
    """Add a validated `kv` message's frames to `staged`."""
    now = time.time()
    if not staged.parts:
        staged.t_send = float(msg.body["t_send"])
        staged.t_first_recv = now
    staged.t_last_recv = now
    staged.parts.append((msg.body["runs"], msg.tensors))
    for (layer, num_layers, kv, num_kv, _start, n), t in zip(msg.body["runs"], msg.tensors):
        for key in itertools.product(range(layer, layer + num_layers), range(kv, kv + num_kv)):
            staged.covered[key] = staged.covered.get(key, 0) + n
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
        for (layer, num_layers, kv, num_kv, start, count), t in zip(runs, tensors):
            lo, hi = max(start, skip_tokens), min(start + count, n)
            if lo >= hi:
                continue
            src = t[:, :, lo - start : hi - start].to(cache.device, non_blocking=True)
            dst = cache.kv[layer : layer + num_layers, kv : kv + num_kv]
            dst.index_copy_(2, slots[lo:hi], src)
