"""1P1D PD real-engine driver for `kvpd validate`: a prefill engine in this process, a decode
engine in a worker process (`python -m realexec.validate_pd`), KV over ZMQ (`validate_kv`).

Flow per request (the simulator's PD semantics, `simulator/cluster.py`): the prefill engine
(scheduler role "prefill") computes the prompt and samples the first token, then sends
`ready`; the decode engine (role "decode") admits it when it has blocks and sends `pull`; a
transfer thread on the prefill side gathers the KV, sends it and hands the blocks back to the
prefill engine; a receiver thread on the decode side scatters it into the allocated blocks.
The first token counts as delivered when the KV has landed (TTFT includes the transfer). The
decode side reports each finished request (`done`) with its timestamps.

All times cross processes as absolute `time.perf_counter()` values (one system-wide monotonic
clock on Linux); each engine's clock offset is measured once.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from typing import Any

import zmq

import workloads
from realexec.validate_driver import RunKnobs, make_prompts, sampling, shift_times, warm_up
from realexec.validate_kv import (
    gather_kv,
    ipc_address,
    recv_msg,
    scatter_kv,
    send_msg,
    spawn_worker,
    stop_worker,
    wait_msg,
)
from simulator.core.request import Request, RequestStatus

STARTUP_TIMEOUT_S = 300.0  # model build + warm-up of the decode worker on a busy CPU
RUN_STALL_TIMEOUT_S = 120.0  # no progress at all for this long = a failed run


def build_engine(model_config: dict[str, Any], dtype: str, device: str | None,
                 knobs: RunKnobs, seed: int, role: str):
    """An `LLM` warmed up as colocated, then given a fresh scheduler with `role`."""
    from realexec.llm import LLM
    from simulator.core.engine import EngineCore
    from simulator.core.scheduler import Scheduler

    llm = LLM(model_config, dtype=dtype, device=device, seed=seed, model_seed=seed,
              **knobs.llm_kwargs())
    warm_up(llm, seed)
    cfg = dataclasses.replace(llm.scheduler.config, role=role)
    llm.scheduler = Scheduler(cfg, llm.scheduler.cache_config)
    llm.engine = EngineCore(llm.scheduler, llm.runner)
    return llm


def clock_offset(llm) -> float:
    """perf_counter() - llm.clock() (s): engine clock -> absolute."""
    return time.perf_counter() - llm.clock()


# ----------------------------------------------------------------------------- decode worker
def decode_worker(args: dict[str, Any]) -> None:
    import torch

    if args.get("threads"):
        torch.set_num_threads(args["threads"])
    llm = build_engine(args["model_config"], args["dtype"], args["device"],
                       RunKnobs(**args["knobs"]), args["seed"], "decode")
    off = clock_offset(llm)
    ctx = zmq.Context()
    ctrl_rx, ctrl_tx = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    ctrl_rx.connect(args["ctrl_to_decode"])
    ctrl_tx.connect(args["ctrl_to_prefill"])
    pull_tx = ctx.socket(zmq.PUSH)
    pull_tx.connect(args["pull"])
    landed_rx = ctx.socket(zmq.PULL)
    landed_rx.bind("inproc://landed")
    blocks: dict[str, list[int]] = {}
    reqs: dict[str, Request] = {}
    stop = threading.Event()

    def receiver() -> None:  # owns kv_rx and landed_tx
        kv_rx, landed_tx = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        kv_rx.connect(args["kv"])
        landed_tx.connect("inproc://landed")
        while not stop.is_set():
            if not kv_rx.poll(50):
                continue
            _, meta, payload = recv_msg(kv_rx)
            scatter_kv(llm.kv_cache, blocks.pop(meta["id"]), meta, payload)
            send_msg(landed_tx, "landed", {"id": meta["id"], "t": time.perf_counter()})
        kv_rx.close(linger=0)
        landed_tx.close(linger=0)

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    poller = zmq.Poller()
    poller.register(ctrl_rx, zmq.POLLIN)
    poller.register(landed_rx, zmq.POLLIN)
    send_msg(ctrl_tx, "started")
    sched = llm.scheduler
    while True:
        busy = bool(sched.running or len(sched.waiting))
        events = dict(poller.poll(0 if busy else 100))
        if ctrl_rx in events:
            while ctrl_rx.poll(0):
                kind, m, _ = recv_msg(ctrl_rx)
                if kind == "stop":
                    stop.set()
                    thread.join()
                    for s in (ctrl_rx, ctrl_tx, pull_tx, landed_rx):
                        s.close(linger=0)
                    ctx.term()
                    return
                req = Request(m["id"], prompt_token_ids=m["prompt"],
                              sampling_params=sampling(m["max_tokens"]),
                              arrival_time=m["arrival"] - off, eos_token_id=llm.eos_token_id)
                req.append_output_token(m["first_token"], m["first_token_time"] - off)
                req.status = RequestStatus.WAITING_FOR_REMOTE_KV
                reqs[req.request_id] = req
                llm.engine.add_request(req, llm.clock())
        if landed_rx in events:
            while landed_rx.poll(0):
                _, m, _ = recv_msg(landed_rx)
                req = reqs[m["id"]]
                sched.on_kv_received(m["id"])
                t = m["t"] - off
                req.token_times[0] = req.first_token_time = t
                req.annotations["kv_transfer_s"] = t - req.annotations.pop("pull_t")
        if not (sched.running or len(sched.waiting)):
            continue
        step = llm.step()
        for req, cached in step.scheduler_output.kv_to_receive:
            blocks[req.request_id] = list(sched.kv_cache_manager.get_block_ids(req.request_id))
            req.annotations["pull_t"] = llm.clock()
            send_msg(pull_tx, "pull", {"id": req.request_id, "start": cached})
        for req in step.finished:
            reqs.pop(req.request_id, None)
            send_msg(ctrl_tx, "done", {
                "id": req.request_id, "status": int(req.status),
                "token_times": [t + off for t in req.token_times],
                "first_token_time": None if req.first_token_time is None else req.first_token_time + off,
                "finish_time": None if req.finish_time is None else req.finish_time + off,
                "num_output_tokens": req.num_output_tokens,
                "num_preemptions": req.num_preemptions,
                "kv_transfer_s": req.annotations.get("kv_transfer_s"),
                "stop_reason": req.stop_reason})


# ----------------------------------------------------------------------------- prefill side
class PDRunner:
    """A prefill engine here and a decode worker process, kept across runs."""

    def __init__(self, model_config: dict[str, Any], dtype: str, device: str | None,
                 knobs: RunKnobs, seed: int = 0, threads: int | None = None) -> None:
        self.seed = seed
        self.ctx = zmq.Context()
        addrs = {k: ipc_address(k) for k in ("ctrl_to_decode", "ctrl_to_prefill", "pull", "kv")}
        self.ctrl_tx, self.ctrl_rx = self.ctx.socket(zmq.PUSH), self.ctx.socket(zmq.PULL)
        self.ctrl_tx.bind(addrs["ctrl_to_decode"])
        self.ctrl_rx.bind(addrs["ctrl_to_prefill"])
        self.proc = spawn_worker("realexec.validate_pd", {
            **addrs, "model_config": model_config, "dtype": dtype, "device": device,
            "knobs": knobs.to_dict(), "seed": seed, "threads": threads})
        self.llm = build_engine(model_config, dtype, device, knobs, seed, "prefill")
        self.off = clock_offset(self.llm)
        self.blocks: dict[str, list[int]] = {}
        self.released = self.ctx.socket(zmq.PULL)
        self.released.bind("inproc://released")
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._transfer, args=(addrs,), daemon=True)
        self.thread.start()
        wait_msg(self.ctrl_rx, self.proc, STARTUP_TIMEOUT_S, "PD decode worker start-up")

    def _transfer(self, addrs: dict[str, str]) -> None:
        """Serve pulls: gather the KV, send it, tell the engine loop to free the blocks."""
        pull_rx, kv_tx = self.ctx.socket(zmq.PULL), self.ctx.socket(zmq.PUSH)
        pull_rx.bind(addrs["pull"])
        kv_tx.bind(addrs["kv"])
        rel_tx = self.ctx.socket(zmq.PUSH)
        rel_tx.connect("inproc://released")
        while not self.stop_flag.is_set():
            if not pull_rx.poll(50):
                continue
            _, m, _ = recv_msg(pull_rx)
            rid = m["id"]
            block_ids, n = self.blocks.pop(rid)
            header, buf = gather_kv(self.llm.kv_cache, block_ids, m["start"], n)
            header["id"] = rid
            send_msg(kv_tx, "kv", header, buf)
            send_msg(rel_tx, "released", {"id": rid})
        for s in (pull_rx, kv_tx, rel_tx):
            s.close(linger=0)

    def run(self, trace: workloads.Trace, lead_s: float = 0.05) -> list[Request]:
        llm, sched = self.llm, self.llm.scheduler
        prompts = make_prompts(trace, llm.vocab_size, self.seed)
        offsets = (trace.arrival_s - trace.arrival_s[0]).tolist() if len(trace) else []
        reqs = [llm.make_request(f"{i}", p, sampling(o), 0.0, index=i)
                for i, (p, o) in enumerate(zip(prompts, trace.output_len.tolist()))]
        by_id = {r.request_id: r for r in reqs}
        start = llm.clock() + lead_s
        for r, off in zip(reqs, offsets):
            r.arrival_time = start + off
        poller = zmq.Poller()
        poller.register(self.ctrl_rx, zmq.POLLIN)
        poller.register(self.released, zmq.POLLIN)
        k, n, done = 0, len(reqs), 0
        last_progress = time.monotonic()
        while done < n:
            now = llm.clock()
            while k < n and reqs[k].arrival_time <= now:
                llm.engine.add_request(reqs[k], now)
                k += 1
            busy = bool(sched.running or len(sched.waiting))
            wait_s = 0.0 if busy else (min(0.1, reqs[k].arrival_time - now) if k < n else 0.1)
            events = dict(poller.poll(max(0, int(wait_s * 1000))))
            if self.released in events:
                while self.released.poll(0):
                    sched.release_transferred(recv_msg(self.released)[1]["id"])
            if self.ctrl_rx in events:
                while self.ctrl_rx.poll(0):
                    kind, m, _ = recv_msg(self.ctrl_rx)
                    if kind == "done":
                        self._finish(by_id[m["id"]], m)
                        done += 1
                        last_progress = time.monotonic()
            if self.proc.poll() is not None:
                raise RuntimeError(f"PD decode worker exited with code {self.proc.returncode} "
                                   f"after {done} of {n} requests")
            if time.monotonic() - last_progress > RUN_STALL_TIMEOUT_S:
                raise RuntimeError(f"PD run stalled: {done} of {n} requests finished, none in "
                                   f"{RUN_STALL_TIMEOUT_S:g} s")
            if not (sched.running or len(sched.waiting)):
                continue
            step = llm.step()
            last_progress = time.monotonic()
            for req in step.kv_ready:
                self.blocks[req.request_id] = (
                    list(sched.kv_cache_manager.get_block_ids(req.request_id)), req.num_prompt_tokens)
                send_msg(self.ctrl_tx, "ready", {
                    "id": req.request_id, "prompt": req.prompt_token_ids,
                    "max_tokens": req.max_tokens, "arrival": req.arrival_time + self.off,
                    "first_token": req.output_token_ids[-1],
                    "first_token_time": req.token_times[0] + self.off})
            for req in step.finished:  # max_tokens == 1: done on the prefill side
                req.annotations["replica"] = "p0"
                done += 1
        origin = start - (float(trace.arrival_s[0]) if n else 0.0)
        for r in reqs:
            shift_times(r, origin)
        return reqs

    def _finish(self, req: Request, m: dict[str, Any]) -> None:
        """Fold the decode side's record into the prefill side's request (engine clock)."""
        off = self.off
        req.token_times = type(req.token_times)("d", [t - off for t in m["token_times"]])
        req.first_token_time = None if m["first_token_time"] is None else m["first_token_time"] - off
        req.num_output_tokens = m["num_output_tokens"]
        req.num_preemptions += m["num_preemptions"]
        req.annotations["kv_transfer_s"] = m["kv_transfer_s"]
        req.annotations["replica"] = "d0"
        req.finish(RequestStatus(m["status"]), m["finish_time"] - off, m["stop_reason"])

    def close(self) -> None:
        try:
            send_msg(self.ctrl_tx, "stop")
            stop_worker(self.proc)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.stop_flag.set()
            self.thread.join(timeout=5)
            for s in (self.ctrl_tx, self.ctrl_rx, self.released):
                s.close(linger=0)
            self.ctx.term()


if __name__ == "__main__":
    decode_worker(json.loads(sys.argv[1]))
