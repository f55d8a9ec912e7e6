"""The decode worker's KV receiver thread: reads `kv` messages from prefill workers while the
engine thread runs steps, so transfers overlap decoding and their timings are wire times.

The thread owns the ROUTER socket. It validates each message (`check_kv_message`), keeps its
frames as zero-copy views in a `StagedKV`, and when a request's KV is complete pokes the
engine thread through an inproc PAIR socket (which the engine loop polls). The engine thread
sends acknowledgements back through a second PAIR socket, since a ZMQ socket must not be
used from two threads. While the staged bytes exceed `max_staging_bytes` the thread stops
reading, so further KV waits on the prefill side.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any

import zmq

from realexec.serving.pd.kv_wire import StagedKV, check_kv_message, stage
from realexec.serving.transport import ProtocolError, decode, encode

log = logging.getLogger("kvpd.decode")
_ids = itertools.count()
POLL_S = 0.1  # the thread's poll period (s): how often it rechecks its stop flag and staging room


class KVReceiver:
    def __init__(self, ctx: zmq.Context, router: zmq.Socket, cache: Any, name: str,
                 max_staging_bytes: int) -> None:
        self.router = router
        self.cache = cache
        self.name = name
        self.max_staging_bytes = max_staging_bytes
        n = next(_ids)
        self.cmd, self._cmd_t = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        self.notify, self._notify_t = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        for main, thread, what in ((self.cmd, self._cmd_t, "cmd"), (self.notify, self._notify_t, "notify")):
            main.setsockopt(zmq.LINGER, 0)
            thread.setsockopt(zmq.LINGER, 0)
            main.bind(f"inproc://kvpd-{what}-{n}")
            thread.connect(f"inproc://kvpd-{what}-{n}")
        self.lock = threading.Lock()
        self.staged: dict[str, StagedKV] = {}
        self.staged_at: dict[str, float] = {}  # monotonic s of the first frame
        self.staged_bytes = 0
        self.bytes_received = 0
        self.num_bad = 0
        self._stop = False
        self.thread = threading.Thread(target=self._run, name=f"{name}-kv-recv", daemon=True)
        self.thread.start()

    # ------------------------------------------------------ engine thread
    def ack(self, worker: str, rid: str, ok: bool, reason: str = "") -> None:
        body = {"request_id": rid, "ok": ok, "reason": reason}
        self.cmd.send_multipart([worker.encode(), *encode("kv_ack", body)])

    def drain_notify(self) -> None:
        while True:
            try:
                self.notify.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def complete(self, rid: str) -> StagedKV | None:
        with self.lock:
            st = self.staged.get(rid)
            return st if st is not None and st.complete else None

    def drop(self, rid: str) -> StagedKV | None:
        with self.lock:
            st = self.staged.pop(rid, None)
            self.staged_at.pop(rid, None)
            if st is not None:
                self.staged_bytes -= st.nbytes
            return st

    def stale(self, older_than_s: float) -> list[str]:
        now = time.monotonic()
        with self.lock:
            return [rid for rid, t in self.staged_at.items() if now - t > older_than_s]

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"kv_staged": len(self.staged), "kv_staged_bytes": self.staged_bytes,
                    "kv_bytes_received": self.bytes_received}

    def stop(self) -> None:
        self._stop = True
        self.thread.join(2 * POLL_S + 1.0)

    # ----------------------------------------------------- receiver thread
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._cmd_t, zmq.POLLIN)
        try:
            while not self._stop:
                room = self.staged_bytes < self.max_staging_bytes
                poller.register(self.router, zmq.POLLIN if room else 0)
                events = dict(poller.poll(int(POLL_S * 1000)))
                if self._cmd_t in events:
                    self._forward_acks()
                if self.router in events:
                    self._read()
        except zmq.ContextTerminated:
            return

    def _forward_acks(self) -> None:
        while True:
            try:
                frames = self._cmd_t.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.router.send_multipart(frames, copy=False)

    def _read(self) -> None:
        while self.staged_bytes < self.max_staging_bytes:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            sender = bytes(frames[0].buffer).decode(errors="replace")
            try:
                msg = decode(frames[1:])
                if msg.type == "kv_cancel":
                    self.drop(msg.body["request_id"])
                    continue
                if msg.type != "kv":
                    raise ProtocolError(f"unexpected {msg.type} message on the KV socket")
                check_kv_message(msg, self.cache)
            except ProtocolError as exc:
                with self.lock:
                    self.num_bad += 1
                log.warning("%s: rejected a KV message from %s: %s", self.name, sender, exc)
                continue
            if self._stage(msg):
                self._notify_t.send(b"")

    def _stage(self, msg: Any) -> bool:
        """Stage one message; True if it completed its request's KV."""
        b = msg.body
        rid = b["request_id"]
        with self.lock:
            st = self.staged.get(rid)
            if st is None:
                spec = self.cache.spec
                st = StagedKV(rid, b["prefill_worker"], b["num_tokens"], spec.num_layers,
                              spec.num_planes)
                self.staged[rid] = st
                self.staged_at[rid] = time.monotonic()
            elif st.num_tokens != b["num_tokens"]:
                self.num_bad += 1
                log.warning("%s: KV of %s changed length mid-transfer; dropped", self.name, rid)
                self.staged.pop(rid)
                self.staged_at.pop(rid, None)
                self.staged_bytes -= st.nbytes
                return False
            before = st.nbytes
            stage(st, msg)
            self.staged_bytes += st.nbytes - before
            self.bytes_received += st.nbytes - before
            return st.complete
