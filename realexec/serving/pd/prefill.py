"""Prefill worker side of PD disaggregation: send each request's prompt KV to its decode
worker and hold the blocks until that worker acknowledges.

The engine runs a `role="prefill"` scheduler: a request finishes its prompt, samples its
first token, and appears in `EngineStepOutput.kv_ready`; its blocks stay held. In `full`
mode the KV of all layers then goes out as one `kv` message; in `layerwise` mode the step
that completes the prompt sends layer l's blocks as soon as layer l's attention has written
them (a hook around the attention backend), overlapping the transfer with the remaining
layers. Frames are views of the KV pool (zero-copy) or one gathered copy
(`pd_kv.kv_frames`). `kv_ack` from the decode side (ok or not) releases the blocks
(`Scheduler.release_transferred`); without one they are released after `kv_hold_timeout_s`
once ZMQ has let go of the frames.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import zmq

from realexec.serving.pd.kv_wire import kv_frames
from realexec.serving.transport import ProtocolError, decode, encode

log = logging.getLogger("kvpd.prefill")


class _HookedAttention:
    """Calls `on_layer(i)` after the wrapped backend has attended (and written KV) in layer i."""

    def __init__(self, inner: Any, on_layer: Any) -> None:
        self.inner = inner
        self.on_layer = on_layer

    def attend(self, layer: int, *args: Any, **kwargs: Any) -> Any:
        out = self.inner.attend(layer, *args, **kwargs)
        self.on_layer(layer)
        return out

    def attend_latent(self, layer: int, *args: Any, **kwargs: Any) -> Any:
        """MLA's attention (DeepSeek): the same hook after the latent is written."""
        out = self.inner.attend_latent(layer, *args, **kwargs)
        self.on_layer(layer)
        return out

    def __getattr__(self, name: str) -> Any:  # the backend's other calls (the indexer's keys)
        return getattr(self.inner, name)


class _LayerHookModel:
    """The runner's model with an optional per-layer callback around its attention."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.on_layer: Any = None

    def forward(self, input_ids: Any, positions: Any, attn: Any, linear: Any = None) -> Any:
        if self.on_layer is not None:
            attn = _HookedAttention(attn, self.on_layer)
        return self._model.forward(input_ids, positions, attn, linear)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class _LayerwiseExecutor:
    """The core's executor, arming the layer hook for prompts that complete in this step."""

    def __init__(self, runner: Any, conn: PrefillConnector) -> None:
        self.runner = runner
        self.conn = conn

    def execute(self, output: Any) -> Any:
        model = self.runner.model
        done = self.conn.prompts_completing(output)
        if done:
            model.on_layer = lambda layer: self.conn.send_layer(done, layer)
        try:
            return self.runner.execute(output)
        finally:
            model.on_layer = None


@dataclass
class _Held:
    request: Any
    decode_worker: str
    deadline: float  # monotonic s
    trackers: list[Any]
    nbytes: int = 0


class PrefillConnector:
    """KV sender of a prefill worker (one DEALER per decode worker, identity = this worker)."""

    def __init__(self, loop: Any, ctx: zmq.Context) -> None:
        self.loop = loop
        self.spec = loop.spec
        self.llm = loop.llm
        self.ctx = ctx
        self.peers: dict[str, zmq.Socket] = {}
        self.endpoints: dict[str, str] = {}  # decode worker -> the KV endpoint connected to
        self.socks: list[zmq.Socket] = []
        self.target: dict[str, str] = {}  # request id -> decode worker
        self.streamed: dict[str, list[Any]] = {}  # layerwise: request id -> trackers so far
        self.held: dict[str, _Held] = {}
        self.num_sent = self.num_acked = self.num_nacked = self.num_hold_timeouts = 0
        self.bytes_sent = 0
        self.num_layers = self.llm.kv_cache.spec.num_layers
        if self.spec.kv_mode == "layerwise":
            self.llm.runner.model = _LayerHookModel(self.llm.runner.model)
            self.llm.engine.executor = _LayerwiseExecutor(self.llm.runner, self)

    # ------------------------------------------------------------- control
    def on_peers(self, body: dict[str, Any]) -> None:
        for name, endpoint in body["decode_kv"].items():
            if not isinstance(endpoint, str) or self.endpoints.get(name) == endpoint:
                continue
            old = self.peers.pop(name, None)  # a restarted decode worker's new endpoint
            if old is not None:
                self.socks.remove(old)
                old.close(linger=0)
            self.endpoints[name] = endpoint
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, self.spec.name.encode())
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)  # KV back-pressure is the decode side's blocks
            sock.connect(endpoint)
            self.peers[name] = sock
            self.socks.append(sock)

    def on_add(self, req: Any, body: dict[str, Any]) -> None:
        target = body.get("kv_target")
        if target:
            self.target[req.request_id] = target

    def on_abort(self, rid: str, reason: str = "aborted") -> None:
        self.target.pop(rid, None)
        self.streamed.pop(rid, None)
        self.held.pop(rid, None)  # the core's abort frees the held blocks

    def want_read(self) -> bool:
        return True

    def close(self) -> None:
        return None

    def next_deadline(self) -> float | None:
        """Monotonic time of the next hold timeout (retried every 0.1 s while ZMQ still
        holds the frames)."""
        now = time.monotonic()
        return min((max(h.deadline, now + 0.1) for h in self.held.values()), default=None)

    def take_landed(self) -> tuple[int, int]:
        """(requests, tokens) of received KV written since the last call: none here."""
        return 0, 0

    def pop_kv_info(self, rid: str) -> dict[str, Any] | None:
        h = self.held.get(rid)
        return {"bytes": h.nbytes, "decode_worker": h.decode_worker} if h else None

    def stats(self) -> dict[str, Any]:
        return {"kv_sent": self.num_sent, "kv_acked": self.num_acked,
                "kv_nacked": self.num_nacked, "kv_hold_timeouts": self.num_hold_timeouts,
                "kv_bytes_sent": self.bytes_sent, "kv_held": len(self.held)}

    # ------------------------------------------------------------- sending
    def _send(self, req: Any, target: str, runs: list, tensors: list, last: bool) -> Any:
        """Queue one `kv` message to `target` (frames are pool views); returns its tracker."""
        sock = self.peers.get(target)
        if sock is None or self.spec.fault_drop_kv:
            if sock is None:
                log.warning("%s: no decode worker %r for %s's KV", self.spec.name, target,
                            req.request_id)
            return None
        body = {"request_id": req.request_id, "num_tokens": req.num_prompt_tokens,
                "block_size": self.llm.kv_cache.block_size, "runs": runs, "last": last,
                "t_send": time.time(), "prefill_worker": self.spec.name}
        tracker = sock.send_multipart(encode("kv", body, tensors), copy=False, track=True)
        self.bytes_sent += sum(t.numel() * t.element_size() for t in tensors)
        return tracker

    def prompts_completing(self, output: Any) -> list[tuple[Any, list[int]]]:
        """Layerwise: requests (with a decode target) whose prompt completes in `output`."""
        done = []
        for req, n, before, ids in zip(output.reqs, output.num_new_tokens,
                                       output.num_computed_before, output.block_ids):
            if (req.request_id in self.target and req.num_output_tokens == 0
                    and before + n == req.num_prompt_tokens and req.max_tokens > 1):
                done.append((req, ids))
        return done

    def send_layer(self, done: list[tuple[Any, list[int]]], layer: int) -> None:
        cache = self.llm.kv_cache
        last = layer == self.num_layers - 1
        for req, ids in done:
            runs, tensors = kv_frames(cache, ids, req.num_prompt_tokens, range(layer, layer + 1))
            tracker = self._send(req, self.target[req.request_id], runs, tensors, last)
            self.streamed.setdefault(req.request_id, []).append(tracker)

    def after_step(self, out: Any) -> None:
        cache = self.llm.kv_cache
        now = time.monotonic()
        for req in out.kv_ready:
            rid = req.request_id
            self.llm.runner.drop_request(rid)
            target = self.target.pop(rid, "")
            trackers = self.streamed.pop(rid, None)
            if trackers is None:  # full mode (or a prompt the layer hook did not see)
                ids = self.llm.kv_cache_manager.get_block_ids(rid)
                runs, tensors = kv_frames(cache, ids, req.num_prompt_tokens, range(self.num_layers))
                trackers = [self._send(req, target, runs, tensors, True)]
            nbytes = req.num_prompt_tokens * cache.spec.bytes_per_token
            self.held[rid] = _Held(req, target, now + self.spec.kv_hold_timeout_s, trackers, nbytes)
            self.num_sent += 1
        for req in out.finished:  # finished here (e.g. EOS as the first token): no hand-off
            rid = req.request_id
            target = self.target.pop(rid, "")
            if self.streamed.pop(rid, None) is not None and target in self.peers:
                self.peers[target].send_multipart(encode("kv_cancel", {"request_id": rid}))

    # ----------------------------------------------------------- receiving
    def on_readable(self, sock: zmq.Socket) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                msg = decode(frames)
                if msg.type != "kv_ack":
                    raise ProtocolError(f"unexpected {msg.type} message on the KV socket")
            except ProtocolError as exc:
                self.loop.num_bad_messages += 1
                log.warning("%s: rejected a KV-socket message: %s", self.spec.name, exc)
                continue
            self._release(msg.body["request_id"], msg.body["ok"], msg.body.get("reason"))

    def _release(self, rid: str, ok: bool, reason: str | None = None) -> None:
        if self.held.pop(rid, None) is None:
            return
        if ok:
            self.num_acked += 1
        else:
            self.num_nacked += 1
            log.info("%s: decode side gave up on %s's KV (%s)", self.spec.name, rid, reason)
        if rid in self.llm.scheduler.transferring:
            self.llm.scheduler.release_transferred(rid)

    def tick(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        for rid, h in list(self.held.items()):
            if now >= h.deadline and all(t is None or t.done for t in h.trackers):
                self.num_hold_timeouts += 1
                log.warning("%s: no acknowledgement for %s's KV in %.1f s; releasing its blocks",
                            self.spec.name, rid, self.spec.kv_hold_timeout_s)
                self._release(rid, False, "hold timeout")
        return []
