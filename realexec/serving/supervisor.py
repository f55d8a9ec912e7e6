"""Supervision of the worker processes behind an `EngineClient` (`realexec.serving.client`).

A worker silent for `heartbeat_timeout_s` is *stalled*: the client's `is_healthy()` is False
and no new request goes to it, but its requests wait; if it speaks again it is taken back. A
worker whose process exits, or that stays silent for `worker_kill_timeout_s` (then it is
killed), is *down*: every request it held fails at once with an error naming it. With
`config.restart_workers` a down worker is started again (its requests are not retried) and
serves once it is ready; in PD mode the prefill workers are then re-pointed at the decode
workers' KV sockets (a restarted decoder has new ones). Otherwise, or when the new process
fails before it is ready, the client's `on_worker_down(name, why)` is called (the HTTP server
exits non-zero on it).

All of it runs on the client's I/O thread, under the client's lock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from realexec.serving.client_types import ClientRequest, WorkerState
from realexec.serving.config import ServeConfig, spawn_worker

log = logging.getLogger("kvpd.client")

# How often the I/O thread checks worker processes (s): bounds how late a dead worker is seen.
LIVENESS_PERIOD_S = 0.05
# Cumulative counters in a worker's stats, carried over its restarts for `/metrics`.
COUNTERS = ("num_preemptions", "prefix_queries_tokens", "prefix_hit_tokens")


class SupervisedClient(Protocol):
    """What the supervisor uses of its `EngineClient`."""

    config: ServeConfig
    workers: dict[str, WorkerState]
    requests: dict[str, ClientRequest]
    lock: threading.RLock
    started: threading.Event  # set once every worker is ready or down at start-up
    closing: bool
    on_worker_down: Callable[[str, str], None] | None

    def send(self, w: WorkerState, msg_type: str, body: dict[str, Any]) -> None: ...

    def drop_on_workers(self, req: ClientRequest, skip: str | None) -> None: ...

    def fail(self, rid: str, error: str, kind: str = "internal") -> None: ...


class WorkerSupervisor:
    """Stall and death detection, restarts and PD re-pointing for the workers of `client`."""

    def __init__(self, client: SupervisedClient) -> None:
        self.client = client

    def send_peers(self) -> None:
        """Tell every live prefill worker where the decode workers' KV sockets are."""
        workers = self.client.workers.values()
        decode_kv = {w.name: w.endpoints["kv"] for w in workers if w.role == "decode" and w.alive}
        for w in workers:
            if w.role == "prefill" and w.alive:
                with contextlib.suppress(zmq.ZMQError):
                    self.client.send(w, "peers", {"decode_kv": decode_kv})

    def heard(self, w: WorkerState, now: float) -> None:
        """`w` sent a message at `now` (perf_counter s): it is not stalled."""
        w.last_seen = now
        if w.stalled:
            w.stalled = False
            log.warning("front end: worker %s speaks again; taking it back", w.name)

    def on_ready(self, w: WorkerState) -> None:
        """`w` (connected already) said `ready`: start-up may be over; a restarted worker
        serves again, and in PD mode the prefill workers learn its new KV socket."""
        c = self.client
        if all(x.ready or x.down for x in c.workers.values()):
            c.started.set()
        if w.restarts:
            log.warning("front end: worker %s is back (restart %d)", w.name, w.restarts)
            if c.config.pd is not None:
                self.send_peers()

    def mark_down(self, w: WorkerState, why: str) -> None:
        """`w` is down: fail the requests that needed it, then restart it or report it."""
        if w.down is not None:
            return
        c = self.client
        w.down = why
        log.error("front end: worker %s is down: %s", w.name, why)
        if not c.started.is_set() and all(x.ready or x.down for x in c.workers.values()):
            c.started.set()
        # A request fails if the dead worker holds it or was to decode it; its other workers
        # are told to drop it (a prefill worker may still hold its KV for the dead decoder).
        # Requests already decoding elsewhere go on: a decode worker whose prefill worker died
        # recomputes the prompt when the KV does not come.
        for req in list(c.requests.values()):
            if w.name not in (req.worker, req.decode_worker):
                continue
            c.drop_on_workers(req, w.name)
            c.fail(req.request_id, f"worker {w.name} is down: {why}", "down")
        if w.sock is not None:
            w.sock.close(linger=0)
            w.sock = None
        if c.closing or not c.started.is_set():
            return
        if c.config.restart_workers and w.ready:
            self.restart(w)
        elif c.on_worker_down is not None:
            c.on_worker_down(w.name, why)

    def restart(self, w: WorkerState) -> None:
        """Start a new process for the down worker `w` (it serves again once ready)."""
        for key in COUNTERS:  # its counters start again at 0
            w.base_counters[key] = w.base_counters.get(key, 0.0) + float(w.stats.get(key, 0))
        if w.proc is not None and w.proc.is_alive():
            w.proc.kill()
        w.restarts += 1
        w.ready, w.down, w.stalled, w.stats = False, None, False, {}
        w.last_seen = time.perf_counter()
        log.warning("front end: restarting worker %s (restart %d)", w.name, w.restarts)
        w.proc = spawn_worker(w.spec)

    def check(self, now: float) -> None:
        """Mark exited, never-ready and silent workers down, and quiet ones stalled."""
        c = self.client
        if c.closing:
            return
        cfg = c.config
        with c.lock:
            for w in c.workers.values():
                if w.down is not None:
                    continue
                code = w.proc.exitcode if w.proc is not None else None
                silent = now - w.last_seen
                if code is not None:
                    self.mark_down(w, f"process exited with code {code}")
                elif not w.ready and w.restarts and silent > cfg.startup_timeout_s:
                    w.proc.kill()
                    self.mark_down(w, f"not ready {silent:.0f} s after its restart")
                elif w.ready and silent > cfg.worker_kill_timeout_s:
                    w.proc.kill()
                    self.mark_down(w, f"silent for {silent:.1f} s (killed)")
                elif w.ready and silent > cfg.heartbeat_timeout_s and not w.stalled:
                    w.stalled = True
                    log.error("front end: worker %s is stalled (silent for %.1f s)", w.name, silent)
