"""Decode worker side of PD disaggregation: receive prompt KV from prefill workers, write it
into this worker's pool, acknowledge, decode.

The front end sends `add_remote` (prompt, sampling, the first token the prefill worker
sampled); the request enters the `role="decode"` scheduler as WAITING_FOR_REMOTE_KV. When a
step allocates its blocks (`SchedulerOutput.kv_to_receive`; the head of the line waits while
the pool is full) the KV staged for it is copied into those blocks, `on_kv_received` starts
decoding and `kv_ack(ok)` tells the prefill worker to free its copy. KV may arrive before or
after `add_remote`; a receiver thread (`realexec.serving.pd.receiver`) reads it while steps run and
keeps it in a staging area (views of the received frames) bounded by `max_staging_bytes`;
when that is full it stops reading the KV socket, so further KV stays on the prefill side. If the KV is not complete `kv_timeout_s` after the blocks were
allocated, the transfer counts as lost: `on_kv_failed` makes this worker recompute the prompt
and `kv_ack(ok=False)` frees the prefill side's blocks.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import zmq

from realexec.serving.pd.kv_wire import StagedKV, write_staged
from realexec.serving.pd.receiver import KVReceiver
from realexec.serving.worker_spec import bind

log = logging.getLogger("kvpd.decode")


@dataclass
class _Pending:
    request: Any
    num_cached: int  # prompt tokens already cached locally (not written)
    deadline: float  # monotonic s
    t_alloc: float  # wall s when the blocks were allocated


class DecodeConnector:
    """KV receiver of a decode worker (a ROUTER that every prefill worker connects to)."""

    def __init__(self, loop: Any, ctx: zmq.Context) -> None:
        self.loop = loop
        self.spec = loop.spec
        self.llm = loop.llm
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.RCVHWM, 0)
        self.endpoint = bind(router, self.spec, "kv")
        self.rx = KVReceiver(ctx, router, self.llm.kv_cache, self.spec.name,
                             self.spec.max_staging_bytes)
        self.socks = [self.rx.notify]  # the engine loop wakes when a transfer completes
        self.source: dict[str, str] = {}  # request id -> prefill worker (from add_remote)
        self.pending: dict[str, _Pending] = {}
        # request id -> monotonic s: KV to drop as it completes (a prompt that was all cached
        # here, or a request refused or aborted before its KV arrived)
        self.unneeded: dict[str, float] = {}
        self.kv_info: dict[str, dict[str, Any]] = {}
        self.num_received = self.num_lost = 0
        self.landed = self.landed_tokens = 0  # KV written into the pool since `take_landed`

    # ------------------------------------------------------------- control
    def on_peers(self, body: dict[str, Any]) -> None:
        return None

    def on_add(self, req: Any, body: dict[str, Any]) -> None:
        self.source[req.request_id] = body.get("prefill_worker", "")

    def on_abort(self, rid: str, reason: str = "aborted") -> None:
        """Forget `rid` (aborted, or refused by this worker's scheduler) and release the
        prefill worker's copy of its KV now, not after the stale-KV timeout."""
        st = self.rx.drop(rid)
        self.pending.pop(rid, None)
        self.kv_info.pop(rid, None)
        src = self.source.pop(rid, None) or (st.prefill_worker if st else "")
        if src:
            self.rx.ack(src, rid, False, reason)
        if st is None:  # its KV may still be on the way: drop it as it completes
            self.unneeded[rid] = time.monotonic()

    def want_read(self) -> bool:
        return True

    def close(self) -> None:
        self.rx.stop()

    def on_readable(self, sock: zmq.Socket) -> None:
        self.rx.drain_notify()  # the work happens in tick()

    def next_deadline(self) -> float | None:
        return min((p.deadline for p in self.pending.values()), default=None)

    def take_landed(self) -> tuple[int, int]:
        """(requests, tokens) of received KV written into the pool since the last call (the
        step log's "k", "kt": host work before the next step)."""
        out = (self.landed, self.landed_tokens)
        self.landed = self.landed_tokens = 0
        return out

    def pop_kv_info(self, rid: str) -> dict[str, Any] | None:
        return self.kv_info.pop(rid, None)

    def stats(self) -> dict[str, Any]:
        return {"kv_received": self.num_received, "kv_lost": self.num_lost,
                "num_bad_messages": self.loop.num_bad_messages + self.rx.num_bad,
                **self.rx.stats()}

    # ------------------------------------------------------------ decoding
    def after_step(self, out: Any) -> None:
        now = time.monotonic()
        for req, num_cached in out.scheduler_output.kv_to_receive:
            self.pending[req.request_id] = _Pending(req, num_cached, now + self.spec.kv_timeout_s,
                                                    time.time())
        if out.scheduler_output.kv_to_receive:
            self.tick()  # KV that arrived before the blocks did lands before the next step

    def tick(self) -> list[dict[str, Any]]:
        """Land complete transfers, give up on late ones, forget stale staged KV."""
        now = time.monotonic()
        sched = self.llm.scheduler
        for rid, p in list(self.pending.items()):
            st = self.rx.complete(rid)
            if st is not None or p.num_cached >= p.request.num_prompt_tokens:
                self._land(rid, p, st)
            elif now >= p.deadline:
                del self.pending[rid]
                st = self.rx.drop(rid)
                self.num_lost += 1
                log.warning("%s: KV of %s not received within %.1f s; recomputing its prompt",
                            self.spec.name, rid, self.spec.kv_timeout_s)
                sched.on_kv_failed(rid)
                self.kv_info[rid] = {"lost": True,
                                     "recomputed_tokens": p.request.num_prompt_tokens - p.num_cached}
                src = self.source.pop(rid, "") or (st.prefill_worker if st else "")
                if src:
                    self.rx.ack(src, rid, False, "timeout")
        for rid, t in list(self.unneeded.items()):  # KV nobody will read, once it came
            if self.rx.complete(rid) is not None or now - t > 4 * self.spec.kv_timeout_s:
                self.rx.drop(rid)
                del self.unneeded[rid]
        # KV nobody asked for (its request was aborted or never arrived) is dropped after a
        # few timeouts and its sender released.
        for rid in self.rx.stale(4 * self.spec.kv_timeout_s):
            if rid not in self.pending and rid not in sched.requests:
                st = self.rx.drop(rid)
                if st is not None:
                    self.rx.ack(st.prefill_worker, rid, False, "no such request on the decode side")
        return []

    def _land(self, rid: str, p: _Pending, st: StagedKV | None) -> None:
        """Write the staged KV (none needed when the whole prompt was cached here) and start
        decoding; acknowledge, so the prefill side frees its blocks."""
        del self.pending[rid]
        t0 = time.time()
        src = self.source.pop(rid, "") or (st.prefill_worker if st else "")
        if st is not None:
            write_staged(self.llm.kv_cache, st, self.llm.kv_cache_manager.get_block_ids(rid),
                         p.num_cached)
            self.rx.drop(rid)
            self.landed += 1
            self.landed_tokens += max(0, st.num_tokens - p.num_cached)
        else:
            self.unneeded[rid] = time.monotonic()
        t_written = time.time()
        self.llm.scheduler.on_kv_received(rid)
        self.num_received += 1
        if src:
            self.rx.ack(src, rid, True)
        info: dict[str, Any] = {"cached_tokens": p.num_cached, "prefill_worker": src,
                                "write_s": t_written - t0}
        if st is not None:
            transfer_s = max(st.t_last_recv - st.t_send, 1e-9)
            info.update(bytes=st.nbytes, transfer_s=transfer_s, gbps=st.nbytes / transfer_s / 1e9,
                        wait_s=max(0.0, t0 - max(p.t_alloc, st.t_last_recv)))
        self.kv_info[rid] = info
