"""The engine-core process: `EngineCore` (schedule, execute, update) with the real model runner,
fed over ZeroMQ (socket topology and message formats: `realexec.serving.transport`).

One thread runs everything: poll the input socket (and the KV socket of a PD worker), apply
adds and aborts, run one engine step, push one `outputs` message per step with every
request's new tokens (and the engine's stats when a request ended or a heartbeat period
passed), and a `heartbeat` with the stats when idle. Aborts are applied
between steps, so an aborted request's blocks are free before the next step is scheduled. A
message that fails validation is logged and counted (`stats.num_bad_messages`) and nothing
else changes. The worker exits when told (`shutdown`) or when its parent process is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from typing import Any

import zmq

from realexec.serving.transport import Message, ProtocolError, decode, encode
from realexec.serving.worker_spec import WorkerSpec, bind

log = logging.getLogger("kvpd.engine")

# Poll wait (s) after a step that scheduled nothing (e.g. the decode head-of-line waits for
# free blocks): long enough not to spin a core, short next to a CPU step (~10-600 ms).
IDLE_STEP_WAIT_S = 0.005


class EngineLoop:
    """The worker's serve loop around an `LLM` (role hooks come from `realexec.serving.pd`)."""

    def __init__(self, spec: WorkerSpec, llm: Any, ctx: zmq.Context, out: zmq.Socket) -> None:
        self.spec = spec
        self.llm = llm
        self.out = out
        self.inp = ctx.socket(zmq.PULL)
        self.inp.setsockopt(zmq.LINGER, 0)
        self.endpoints = {"input": bind(self.inp, spec, "in")}
        self.live: dict[str, Any] = {}  # request id -> core Request still reported on
        self.sent: dict[str, int] = {}  # request id -> output tokens already pushed
        self.num_bad_messages = 0
        self.num_steps = 0
        self.stopping = False
        self.connector: Any = None
        if spec.role == "prefill":
            from realexec.serving.pd.prefill import PrefillConnector

            self.connector = PrefillConnector(self, ctx)
        elif spec.role == "decode":
            from realexec.serving.pd.decode import DecodeConnector

            self.connector = DecodeConnector(self, ctx)
            self.endpoints["kv"] = self.connector.endpoint
        self.poller = zmq.Poller()
        self.poller.register(self.inp, zmq.POLLIN)
        self._last_sent = 0.0
        self._last_stats = 0.0
        self.step_s = 0.0  # duration of the latest step (schedule + execute + update)
        self.loop_clock = LoopClock()  # the serving loop's cost per step ("l" in the step log)
        self.step_log = None
        if spec.step_log:
            from realexec.serving.step_log import StepLogWriter

            self.step_log = StepLogWriter(spec.step_log)

    # ---------------------------------------------------------------- output
    def push(self, msg_type: str, body: dict[str, Any]) -> None:
        self.out.send_multipart(encode(msg_type, body))  # header only: small, so copied
        self._last_sent = time.monotonic()

    def _stats_now(self, now: float) -> dict[str, Any]:
        self._last_stats = now
        return self.stats()

    def stats(self) -> dict[str, Any]:
        s = dict(self.llm.scheduler.get_stats())
        kvs = self.llm.kv_cache_manager.get_stats()
        s.update(num_gpu_blocks=kvs.num_gpu_blocks, kv_peak_usage=kvs.peak_usage,
                 prefix_hit_rate=kvs.prefix_hit_rate,
                 prefix_queries_tokens=kvs.prefix_queries_tokens,
                 prefix_hit_tokens=kvs.prefix_hit_tokens, num_bad_messages=self.num_bad_messages,
                 num_steps=self.num_steps, num_live=len(self.live))
        if self.connector is not None:
            s.update(self.connector.stats())
        return s

    def model_info(self) -> dict[str, Any]:
        llm = self.llm
        spec = llm.kv_cache.spec
        return {"source": str(llm.loaded.source), "vocab_size": llm.vocab_size,
                "max_model_len": llm.max_model_len, "eos_token_id": llm.eos_token_id,
                **llm.scheduler.kv_cache_manager.limits(),
                "kv_bytes_per_token": spec.bytes_per_token, "num_layers": spec.num_layers,
                "dtype": str(spec.dtype).removeprefix("torch."), "device": str(llm.device)}

    def error_item(self, rid: str, message: str) -> dict[str, Any]:
        return {"id": rid, "tok": [], "fin": "error", "err": message}

    # ----------------------------------------------------------------- input
    def handle(self, msg: Message) -> list[dict[str, Any]]:
        """Apply one input message; returns output items to push right away."""
        b = msg.body
        if msg.type == "add":
            return self._add(b, remote=False)
        if msg.type == "add_remote":
            if self.spec.role != "decode":
                return [self.error_item(b["request_id"], f"{self.spec.name} is not a decode worker")]
            return self._add(b, remote=True)
        if msg.type == "abort":
            return [it for rid in b["request_ids"] if (it := self._abort(rid))]
        if msg.type == "peers" and self.connector is not None:
            self.connector.on_peers(b)
        elif msg.type == "shutdown":
            self.stopping = True
        else:
            raise ProtocolError(f"{self.spec.name}: unexpected {msg.type} message on the input socket")
        return []

    def _add(self, b: dict[str, Any], remote: bool) -> list[dict[str, Any]]:
        from simulator.core.request import RequestStatus

        rid = b["request_id"]
        llm = self.llm
        if rid in self.live or rid in llm.scheduler.requests:
            return [self.error_item(rid, f"request id {rid!r} is already in use")]
        try:
            req = llm.make_request(rid, b["prompt_token_ids"], b["sampling"],
                                   priority=int(b.get("priority") or 0))
            if req.sampling_params.n != 1:
                raise ValueError(f"request {rid}: n must be 1 when serving (got {req.sampling_params.n})")
            if remote:
                first = b["first_token_id"]
                if not 0 <= first < llm.vocab_size:
                    raise ValueError(f"request {rid}: first_token_id {first} outside the vocabulary")
                req.status = RequestStatus.WAITING_FOR_REMOTE_KV
                req.append_output_token(first, llm.clock())
        except ValueError as exc:
            return [self.error_item(rid, str(exc))]
        if self.connector is not None:
            self.connector.on_add(req, b)
        llm.engine.add_request(req, llm.clock())
        if req.is_finished and self.connector is not None:  # refused: no KV will be taken
            self.connector.on_abort(rid, f"rejected: {req.stop_reason}")
        self.live[rid] = req
        self.sent[rid] = req.num_output_tokens
        return []

    def _abort(self, rid: str) -> dict[str, Any] | None:
        if self.connector is not None:
            self.connector.on_abort(rid)
        known = self.llm.abort_request(rid, "aborted by the client")
        req = self.live.pop(rid, None)
        self.sent.pop(rid, None)
        if req is None and not known:
            return None
        return {"id": rid, "tok": [], "fin": "abort", "stop": "aborted by the client"}

    def drain_input(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        while True:
            try:
                frames = self.inp.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return items
            try:
                items.extend(self.handle(decode(frames)))
            except ProtocolError as exc:
                self.num_bad_messages += 1
                log.warning("%s: rejected a message on the input socket: %s", self.spec.name, exc)
                if exc.request_id is not None and exc.request_id not in self.live:
                    # the client waits on this request: end it with the reason
                    items.append({"id": exc.request_id, "tok": [], "fin": None,
                                  "err": f"the worker rejected the request: {exc}"})

    # ------------------------------------------------------------------ step
    def step(self) -> tuple[list[dict[str, Any]], bool]:
        """One engine step; returns (output items, whether it did anything)."""
        t_wall = time.time() if self.step_log is not None else 0.0
        loop_s, loop_cpu_s = self.loop_clock.step_starting()
        landed = self.connector.take_landed() if self.connector is not None else (0, 0)
        t0 = time.perf_counter()
        out = self.llm.step()
        t_end = time.perf_counter()
        self.loop_clock.step_ended()
        step_s = t_end - t0
        self.num_steps += 1
        self.step_s = step_s
        so = out.scheduler_output
        if self.step_log is not None and so.reqs:
            self.step_log.add(t_wall, step_s, so.shape, loop_s, len(out.kv_ready),
                              sum(r.num_prompt_tokens for r in out.kv_ready), loop_cpu_s, *landed)
        handoff = {r.request_id for r in out.kv_ready}
        if self.connector is not None:
            self.connector.after_step(out)
        items = []
        seen = set()
        for req in [*so.reqs, *out.finished, *out.kv_ready]:
            rid = req.request_id
            if rid in seen or rid not in self.live:
                continue
            seen.add(rid)
            self.llm.finished.pop(rid, None)
            n = self.sent[rid]
            new = req.output_token_ids[n:]
            fin = req.finish_reason if req.is_finished else None
            if not new and fin is None and rid not in handoff:
                continue
            item: dict[str, Any] = {"id": rid, "tok": list(new), "fin": fin}
            if n == 0 and new:
                item["cached"] = max(req.num_cached_tokens, 0)
                if req.prompt_logprobs is not None:  # prompt tokens 1 .. P-1, with the first token
                    item["plp"] = [list(e) for e in req.prompt_logprobs if e is not None]
                if req.first_scheduled_time is not None:  # s since its first step here began
                    item["sched_age"] = max(0.0, self.llm.clock() - req.first_scheduled_time)
            if fin is not None and req.stop_reason:
                item["stop"] = req.stop_reason
            if rid in handoff:
                item["handoff"] = True
            if new and req.logprobs:  # one entry per token this worker sampled: the newest
                item["lp"] = [[lp, ids, vals] for lp, ids, vals in req.logprobs[-len(new):]]
            if (fin is not None or rid in handoff) and req.num_preemptions:
                item["pre"] = req.num_preemptions  # times this worker preempted it
            kv = self.connector.pop_kv_info(rid) if self.connector is not None else None
            if kv:
                item["kv"] = kv
            items.append(item)
            self.sent[rid] = n + len(new)
            if fin is not None or rid in handoff:
                self.live.pop(rid, None)
                self.sent.pop(rid, None)
        busy = bool(so.reqs or out.finished or so.kv_to_receive or out.kv_ready)
        return items, busy

    def _needs_step(self) -> bool:
        s = self.llm.scheduler
        if s.running or s.waiting:
            return True
        return s.has_unfinished_requests() and not s.waiting_for_kv

    def run(self) -> None:
        spec = self.spec
        self.push("ready", {"worker": spec.name, "role": spec.role, "pid": os.getpid(),
                            "endpoints": self.endpoints, "model": self.model_info()})
        wait = 0.0
        last_parent_check = time.monotonic()
        while not self.stopping:
            conn = self.connector
            if conn is not None:
                deadline = conn.next_deadline()
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - time.monotonic()))
                for sock in conn.socks:  # a full staging area stops reading KV (back-pressure)
                    self.poller.register(sock, zmq.POLLIN if conn.want_read() else 0)
            if wait > 0:
                self.loop_clock.waiting()
            events = dict(self.poller.poll(int(wait * 1000)))
            if wait > 0:
                self.loop_clock.woke()
            items = self.drain_input() if self.inp in events else []
            if conn is not None:
                for sock in conn.socks:
                    if sock in events:
                        conn.on_readable(sock)
                items.extend(conn.tick())
            busy = False
            step_s = 0.0
            if not self.stopping and self._needs_step():
                step_items, busy = self.step()
                items.extend(step_items)
                step_s = self.step_s
            now = time.monotonic()
            if items:
                # stats ride along when a request ended or a heartbeat period passed (they
                # cost ~0.05 ms; a decode step of a small model on CPU is ~10-40 ms)
                fresh = now - self._last_stats >= spec.heartbeat_s or any(
                    it["fin"] is not None for it in items)
                self.push("outputs", {"worker": spec.name, "step_id": self.num_steps,
                                      "step_s": step_s, "t_wall": time.time(), "items": items,
                                      "stats": self._stats_now(now) if fresh else {}})
            elif now - self._last_sent >= spec.heartbeat_s:
                self.push("heartbeat", {"worker": spec.name, "t_wall": time.time(),
                                        "stats": self._stats_now(now)})
            if not busy and self.step_log is not None:
                self.step_log.flush()
            if now - last_parent_check >= spec.heartbeat_s:
                last_parent_check = now
                if spec.parent_pid and os.getppid() != spec.parent_pid:
                    log.warning("%s: parent process is gone; exiting", spec.name)
                    return
            if busy:
                wait = 0.0
            elif self._needs_step():
                wait = IDLE_STEP_WAIT_S
            else:
                wait = max(0.0, spec.heartbeat_s - (now - self._last_sent))


class LoopClock:
    """The serving loop's host time on the path between two engine steps (s, wall and the
    engine thread's CPU): from a step's end until the loop first waits for input, plus from
    its last wake-up to the next step's start. Iterations in between (woken by a `kv_ack` or a
    heartbeat, then waiting again) delay no request and are left out: run 16's prefill worker
    spent 1.5 ms after a one-prompt hand-off when it went straight on, 2.7 ms by the older
    step-end-to-step-start measure when it went idle first."""

    def __init__(self) -> None:
        self.started = False  # a step has ended
        self.post_step = False  # no wait since it ended
        self.acc_wall = self.acc_cpu = 0.0  # the post-step part, once a wait closed it
        self.since_wall = self.since_cpu = 0.0  # the step's end, or the latest wake-up

    def step_ended(self) -> None:
        self.started = self.post_step = True
        self.acc_wall = self.acc_cpu = 0.0
        self.since_wall, self.since_cpu = time.perf_counter(), time.thread_time()

    def waiting(self) -> None:
        """The loop is about to wait for input."""
        if self.post_step:
            self.post_step = False
            self.acc_wall = time.perf_counter() - self.since_wall
            self.acc_cpu = time.thread_time() - self.since_cpu

    def woke(self) -> None:
        self.since_wall, self.since_cpu = time.perf_counter(), time.thread_time()

    def step_starting(self) -> tuple[float | None, float | None]:
        """(wall s, cpu s) of loop work this step waited on; (None, None) before any step."""
        if not self.started:
            return None, None
        wall = self.acc_wall + time.perf_counter() - self.since_wall
        return max(0.0, wall), max(0.0, self.acc_cpu + time.thread_time() - self.since_cpu)


def engine_context() -> zmq.Context:
    """A ZMQ context whose I/O thread runs SCHED_BATCH (Linux): it then never preempts the
    engine thread when a send wakes it. On an oversubscribed CPU a woken I/O thread otherwise
    takes the engine's core and the engine waits a scheduler slice (measured on this 2-core
    box under load: a send right after a compute burst took 0.8-1.2 ms mean, 3-4 ms p90; the
    engine loop's push 0.9-2.2 ms per step, 0.16 ms with SCHED_BATCH). The thread keeps its
    normal share of CPU time."""
    ctx = zmq.Context()
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is not None:
        # platforms without it keep the default policy
        with contextlib.suppress(zmq.ZMQError, AttributeError):
            ctx.set(zmq.THREAD_SCHED_POLICY, batch)
    return ctx


def worker_main(spec: WorkerSpec) -> None:
    """Process entry point: build the engine, report `ready`, serve until told to stop."""
    logging.basicConfig(level=spec.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # Ctrl-C in a terminal reaches the whole process group: the front end owns it and stops
    # the workers with `shutdown` (or they notice it is gone).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctx = engine_context()
    out = ctx.socket(zmq.PUSH)
    out.setsockopt(zmq.SNDHWM, 0)  # never drop or block on outputs; the front end drains them
    out.setsockopt(zmq.LINGER, 2000)
    out.connect(spec.output_addr)
    try:
        import torch

        if spec.num_threads:
            torch.set_num_threads(spec.num_threads)
        from realexec.engine.llm import LLM

        llm = LLM(**spec.llm_kwargs, role=spec.role)
        loop = EngineLoop(spec, llm, ctx, out)
    except Exception as exc:  # report why the worker could not start, then exit
        log.exception("%s failed to start", spec.name)
        out.send_multipart(encode("fatal", {"worker": spec.name, "message": f"{type(exc).__name__}: {exc}"}))
        out.close()
        ctx.term()
        return
    signal.signal(signal.SIGTERM, lambda *_: setattr(loop, "stopping", True))
    try:
        loop.run()
    finally:
        if loop.step_log is not None:
            loop.step_log.flush()
        if loop.connector is not None:
            loop.connector.close()
        ctx.destroy(linger=500)
