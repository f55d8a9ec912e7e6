"""Front-end client of the engine processes: submit requests, stream their tokens back with
client-side timestamps, abort; sync (`EngineClient`) and asyncio (`AsyncEngineClient`).

`EngineClient(config).start()` spawns the workers of a `ServeConfig` (one colocated engine or
P prefill + D decode workers), waits for their `ready`, and runs one I/O thread that receives
every worker's `outputs` on one PULL socket, stamps them with `time.perf_counter()` as they
arrive and hands each request's tokens to its sink. In PD mode the same thread is the proxy:
a request goes to a prefill worker (chosen by `PDRouter`) with the decode worker that will
receive its KV; when the prefill worker reports the hand-off (first token), the client
streams that token and sends `add_remote` to the decode worker, whose tokens follow.

Workers are watched by a `WorkerSupervisor` (`realexec.serving.supervisor`): stalls,
deaths, restarts with `config.restart_workers`, `on_worker_down(name, why)` otherwise.
Nothing accepted ends silently: each request ends with tokens and a finish reason, or with an
error.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from realexec.serving.client_async import AsyncEngineClient
from realexec.serving.client_types import (
    ClientRequest,
    Delta,
    EngineDeadError,
    RequestFailed,
    WorkerState,
)
from realexec.serving.config import ServeConfig, spawn_worker
from realexec.serving.ipc_dir import make_ipc_dir
from realexec.serving.metrics import ServingMetrics
from realexec.serving.pd.proxy import PDRouter
from realexec.serving.supervisor import LIVENESS_PERIOD_S, WorkerSupervisor
from realexec.serving.transport import ProtocolError, decode, encode

log = logging.getLogger("kvpd.client")

__all__ = ["AsyncEngineClient", "ClientRequest", "Delta", "EngineClient", "EngineDeadError",
           "RequestFailed", "WorkerState"]


class EngineClient:
    """Spawns and talks to the workers of `config` (use as a context manager, or start/close)."""

    def __init__(self, config: ServeConfig | None = None) -> None:
        self.config = config or ServeConfig()
        self.ctx = zmq.Context()
        self.workers: dict[str, WorkerState] = {}
        self.requests: dict[str, ClientRequest] = {}
        self.metrics = ServingMetrics()
        self.router = PDRouter()
        self.num_bad_messages = 0
        self.lock = threading.RLock()  # guards sockets used from user threads and requests
        self.started = threading.Event()
        self._stop = threading.Event()
        self.closing = False
        self._thread: threading.Thread | None = None
        # called from the I/O thread when a worker is down for good (not restarted)
        self.on_worker_down: Callable[[str, str], None] | None = None
        self.supervisor = WorkerSupervisor(self)
        self._ipc_dir = make_ipc_dir()
        self.out = self.ctx.socket(zmq.PULL)
        self.out.setsockopt(zmq.LINGER, 0)
        if self.config.transport == "tcp":
            self.out.bind("tcp://127.0.0.1:*")
        else:
            self.out.bind(f"ipc://{self._ipc_dir}/frontend-out")
        self.output_addr = self.out.getsockopt(zmq.LAST_ENDPOINT).decode()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> EngineClient:
        """Spawn the workers and wait until all are ready (RuntimeError if one fails); a
        started client is returned as is (`with EngineClient(cfg).start() as c` is fine)."""
        if self._thread is not None:
            return self
        for spec in self.config.worker_specs(self.output_addr, self._ipc_dir):
            self.workers[spec.name] = WorkerState(spec.name, spec.role, spawn_worker(spec),
                                                  spec=spec)
        self._thread = threading.Thread(target=self._io_loop, name="kvpd-client-io", daemon=True)
        self._thread.start()
        if not self.started.wait(self.config.startup_timeout_s):
            self.close()
            raise RuntimeError(f"workers not ready within {self.config.startup_timeout_s} s")
        down = {w.name: w.down for w in self.workers.values() if w.down}
        if down:
            self.close()
            raise RuntimeError(f"workers failed to start: {down}")
        with self.lock:
            self.supervisor.send_peers()
        return self

    def __enter__(self) -> EngineClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the workers (shutdown, then kill after `timeout_s`) and the I/O thread."""
        self.closing = True
        with self.lock:
            for w in self.workers.values():
                if w.sock is not None and w.alive:
                    with contextlib.suppress(zmq.ZMQError):
                        w.sock.send_multipart(encode("shutdown", {}), zmq.NOBLOCK)
        deadline = time.monotonic() + timeout_s
        for w in self.workers.values():
            if w.proc is not None:
                w.proc.join(max(0.0, deadline - time.monotonic()))
                if w.proc.is_alive():
                    w.proc.kill()
                    w.proc.join(5.0)
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        with self.lock:
            for rid in list(self.requests):
                self.fail(rid, "the client was closed")
        self.ctx.destroy(linger=0)
        shutil.rmtree(self._ipc_dir, ignore_errors=True)

    # ----------------------------------------------------------- public API
    @property
    def model_info(self) -> dict[str, Any]:
        """The model as the first ready worker reports it (vocab_size, max_model_len, ...)."""
        for w in self.workers.values():
            if w.model:
                return w.model
        return {}

    def workers_status(self) -> dict[str, dict[str, Any]]:
        return {w.name: {"role": w.role, "alive": w.alive, "down": w.down,
                         "stalled": w.stalled, "restarts": w.restarts,
                         "pid": getattr(w.proc, "pid", None), "stats": dict(w.stats),
                         "stats_at": w.stats_at, "base_counters": dict(w.base_counters)}
                for w in self.workers.values()}

    def is_healthy(self) -> bool:
        """Every worker is up and none is stalled."""
        return bool(self.workers) and all(w.serving for w in self.workers.values())

    def abort_all(self, reason: str, kind: str = "shutdown") -> int:
        """Abort every request in flight with an error (`kind`); returns how many."""
        with self.lock:
            rids = list(self.requests)
            for rid in rids:
                self.drop_on_workers(self.requests[rid], None)
                self.fail(rid, reason, kind)
        return len(rids)

    def submit(self, prompt_token_ids: list[int], sampling: dict[str, Any] | None = None,
               request_id: str | None = None, sink: Callable[[Delta], None] | None = None,
               priority: int = 0) -> ClientRequest:
        """Send a request; tokens go to `sink` (from the I/O thread) and onto the returned
        record. Raises EngineDeadError if no live worker can take it."""
        rid = request_id or uuid.uuid4().hex
        sampling = dict(sampling or {})
        ids = list(prompt_token_ids)
        if not ids or not all(type(t) is int for t in ids):
            raise ValueError(f"request {rid}: prompt_token_ids must be a non-empty list of "
                             f"integers, got {ids[:4]!r}")
        req = ClientRequest(rid, ids, sampling, time.perf_counter(), sink=sink)
        with self.lock:
            if rid in self.requests:
                raise ValueError(f"request id {rid!r} is already in flight")
            body = {"request_id": rid, "prompt_token_ids": req.prompt_token_ids,
                    "sampling": sampling, "priority": priority}
            if self.config.pd is None:
                target = self._live("colocated")[0]
                req.worker = target.name
            else:
                pre, dec = self._live("prefill"), self._live("decode")
                p, d = self.router.pick(pre, dec, self.requests.values())
                req.worker = req.prefill_worker = p.name
                req.decode_worker = d.name
                body["kv_target"] = d.name
                target = p
            self.requests[rid] = req
            self.metrics.on_submit()
            try:
                self.send(target, "add", body)
            except Exception as exc:  # noqa: BLE001 - nothing accepted may stay in flight
                self.fail(rid, f"could not send to {target.name}: {exc}", "internal")
        return req

    def abort(self, request_id: str, reason: str = "aborted by the client") -> bool:
        """Abort a request (its workers free its blocks before their next step)."""
        with self.lock:
            req = self.requests.get(request_id)
            if req is None:
                return False
            self.drop_on_workers(req, None)
            self._finish(req, "abort", reason)
        return True

    def drop_on_workers(self, req: ClientRequest, skip: str | None) -> None:
        """Tell the live workers of `req` (but `skip`) to drop it."""
        for name in {req.worker, req.prefill_worker, req.decode_worker} - {skip, ""}:
            w = self.workers.get(name)
            if w is not None and w.alive:
                with contextlib.suppress(zmq.ZMQError):
                    self.send(w, "abort", {"request_ids": [req.request_id]})

    def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any] | None = None,
                 timeout_s: float | None = None, request_id: str | None = None) -> ClientRequest:
        """Submit and wait; RequestFailed if the request ends with an error."""
        req = self.submit(prompt_token_ids, sampling, request_id)
        if not req.done.wait(timeout_s):
            self.abort(req.request_id, "timed out")
            raise TimeoutError(f"request {req.request_id} not finished within {timeout_s} s")
        if req.error:
            raise RequestFailed(req.error)
        return req

    def stream(self, prompt_token_ids: list[int], sampling: dict[str, Any] | None = None,
               request_id: str | None = None, timeout_s: float = 600.0) -> Iterator[Delta]:
        """Yield `Delta`s as they arrive; closing the iterator early aborts the request."""
        q: queue.SimpleQueue[Delta] = queue.SimpleQueue()
        req = self.submit(prompt_token_ids, sampling, request_id, sink=q.put)
        try:
            while True:
                delta = q.get(timeout=timeout_s)
                yield delta
                if delta.finished:
                    return
        finally:
            if not req.finished:
                self.abort(req.request_id)

    # -------------------------------------------------------------- sending
    def _live(self, role: str) -> list[WorkerState]:
        live = [w for w in self.workers.values() if w.role == role and w.serving]
        if not live:
            down = {w.name: w.down or ("stalled" if w.stalled else "starting")
                    for w in self.workers.values() if w.role == role}
            raise EngineDeadError(f"no {role} worker is up ({down})")
        return live

    def send(self, w: WorkerState, msg_type: str, body: dict[str, Any]) -> None:
        """Send one message to worker `w` (zmq.ZMQError if it is not connected or full)."""
        with self.lock:
            if w.sock is None:
                raise zmq.ZMQError(msg=f"{w.name} is not connected")
            w.sock.send_multipart(encode(msg_type, body), zmq.NOBLOCK)

    # ------------------------------------------------------------ receiving
    def _io_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.out, zmq.POLLIN)
        next_check = 0.0
        while not self._stop.is_set():
            try:
                events = dict(poller.poll(int(LIVENESS_PERIOD_S * 1000)))
            except zmq.ZMQError:
                return  # context destroyed
            if self.out in events:
                self._drain()
            now = time.perf_counter()
            if now >= next_check:
                next_check = now + LIVENESS_PERIOD_S
                self.supervisor.check(now)

    def _drain(self) -> None:
        while True:
            try:
                frames = self.out.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            now = time.perf_counter()
            try:
                msg = decode(frames)
            except ProtocolError as exc:
                self.num_bad_messages += 1
                log.warning("front end: rejected a message from a worker: %s", exc)
                continue
            w = self.workers.get(msg.body.get("worker", ""))
            if w is None:
                self.num_bad_messages += 1
                log.warning("front end: %s message from unknown worker %r", msg.type, msg.body.get("worker"))
                continue
            with self.lock:
                self._on_message(w, msg, now)

    def _on_message(self, w: WorkerState, msg: Any, now: float) -> None:
        if w.down is not None and msg.type != "ready":
            return  # a message the dead process sent before it died
        self.supervisor.heard(w, now)
        b = msg.body
        if msg.type == "ready":
            if w.proc is not None and b["pid"] != w.proc.pid:
                return  # the old process of a restarted worker
            w.endpoints, w.model, w.ready = b["endpoints"], b["model"], True
            w.sock = self.ctx.socket(zmq.PUSH)
            w.sock.setsockopt(zmq.LINGER, 0)
            w.sock.connect(w.endpoints["input"])
            self.supervisor.on_ready(w)
        elif msg.type == "fatal":
            self.supervisor.mark_down(w, f"failed: {b['message']}")
        elif msg.type in ("outputs", "heartbeat"):
            if b["stats"]:  # outputs between heartbeats carry none
                w.stats, w.stats_at = b["stats"], now
            if msg.type == "outputs":
                for item in b["items"]:
                    self._on_item(w, item, float(b["step_s"]), now)
        else:
            self.num_bad_messages += 1
            log.warning("front end: unexpected %s message from %s", msg.type, w.name)

    def _on_item(self, w: WorkerState, item: dict[str, Any], step_s: float, now: float) -> None:
        req = self.requests.get(item["id"])
        if req is None or (req.worker and req.worker != w.name):
            return  # aborted or failed already, or a stale item
        if item.get("err"):
            self.fail(req.request_id, f"{w.name}: {item['err']}", "internal")
            return
        if item["fin"] == "rejected":
            self.fail(req.request_id, f"{w.name} can never serve it: {item.get('stop')}",
                       "rejected")
            return
        if "cached" in item:
            req.num_cached_tokens = int(item["cached"])
        if "sched_age" in item and req.first_scheduled is None:
            req.first_scheduled = max(req.t_submit, now - float(item["sched_age"]))
        if item.get("kv"):
            req.kv.update(item["kv"])
        req.num_preemptions += int(item.get("pre") or 0)
        toks = item["tok"]
        lp = item.get("lp")
        if lp:
            req.logprobs.extend(lp)
        plp = item.get("plp") if req.prompt_logprobs is None else None  # PD: the prefill's
        if plp is not None:
            req.prompt_logprobs = plp
        if toks:
            req.token_ids.extend(toks)
            req.token_times.extend([now] * len(toks))
            req.step_s.extend([step_s] * len(toks))
        fin = item["fin"]
        if fin is None and item.get("handoff"):
            self._hand_off(req)
        if fin is not None:
            self._finish(req, fin, item.get("stop"), toks, now, lp, plp)
        elif toks and req.sink is not None:
            req.sink(Delta(req.request_id, list(toks), now, logprobs=lp, prompt_logprobs=plp))

    def _hand_off(self, req: ClientRequest) -> None:
        """PD: the prefill worker holds the KV and sampled the first token; move to decode."""
        d = self.workers.get(req.decode_worker)
        if d is None or not d.alive:  # an error, not an "abort" finish: the client did not
            self.drop_on_workers(req, None)  # leave; its prefill worker frees the held KV
            self.fail(req.request_id, f"decode worker {req.decode_worker} is down", "down")
            return
        req.worker = d.name
        body = {"request_id": req.request_id, "prompt_token_ids": req.prompt_token_ids,
                "sampling": req.sampling, "first_token_id": req.token_ids[0],
                "prefill_worker": req.prefill_worker}
        try:
            self.send(d, "add_remote", body)
        except Exception as exc:  # noqa: BLE001 - nothing accepted may stay in flight
            self.fail(req.request_id, f"could not reach {d.name}: {exc}", "down")

    def _finish(self, req: ClientRequest, reason: str, stop: str | None = None,
                toks: list[int] = (), now: float | None = None,
                logprobs: list[list[Any]] | None = None,
                prompt_logprobs: list[list[Any]] | None = None) -> None:
        """End `req` with `reason` and its last tokens `toks`."""
        if self.requests.pop(req.request_id, None) is None:
            return
        req.finish_reason, req.stop_reason = reason, stop
        self.metrics.on_finish(req)
        req.done.set()
        if req.sink is not None:
            queueing = (None if req.first_scheduled is None
                        else req.first_scheduled - req.t_submit)
            req.sink(Delta(req.request_id, list(toks), now or time.perf_counter(), True, reason,
                           num_preemptions=req.num_preemptions, queueing_s=queueing,
                           logprobs=logprobs, prompt_logprobs=prompt_logprobs))

    def fail(self, rid: str, error: str, kind: str = "internal") -> None:
        """End request `rid` with an error of `kind` (one of ERROR_KINDS); no-op if it ended."""
        req = self.requests.pop(rid, None)
        if req is None:
            return
        req.error, req.error_kind, req.finish_reason = error, kind, "error"
        self.metrics.on_finish(req)
        req.done.set()
        if req.sink is not None:
            req.sink(Delta(rid, [], time.perf_counter(), True, "error", error, error_kind=kind))
