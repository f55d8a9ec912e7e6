"""Trace replay against real serving: send a trace's requests at their arrival times, record
client-side timestamps, and write the simulator's `summary.json` + per-request table.

Prompts are synthetic token ids of the trace's lengths: a trace's own `prompt_token_ids` if it
has them; else, with `hash_ids`, each hash id is one block of `hash_block_size` tokens drawn
from a generator seeded by (seed, hash id), so requests that share hash ids share prefixes;
else tokens seeded by (seed, row). Each request asks for exactly its trace output length
(`ignore_eos`, greedy, so its tokens are those of `transformers`' generate). An engine may
admit by that flag (capacity policy `reserve_ratio` without prefix caching, as SGLang): the
simulation to set beside a replay then says `workload.ignore_eos: true`. Targets (`parse_target`): `inproc` (a `realexec.LLM` driven in this
process, no transport), `engine` (one engine process over ZeroMQ), `pd:P:D` (P prefill + D
decode processes) and `http://host:port` (a running `kvpd serve`, streaming completions).

Times in the records are seconds since the replay started, measured by this client: arrival =
when the request was sent, token times = when each token reached the client.

Load (`max_concurrency`): open loop by default (each request sent at its trace time); with
`max_concurrency` = N a closed loop as `vllm bench serve --max-concurrency` runs it: at most N
requests sent and unfinished, the next one sent (in trace order) at max(its trace time, the
moment a slot frees). TTFT and E2E count from the send, as benchmark clients measure them.
With `warmup_drain` the first measured request waits until every warm-up request has finished,
and every measured request's send time moves by that wait (`vllm bench serve --num-warmups`,
`sglang.bench_serving --warmup-requests`; the simulator's `workload.warmup_drain`).
`prepare_trace(arrival={"process": "burst"})` puts every request at t = 0 first.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import workloads
from realexec.serving.replay.drain import shift_after_drain
from realexec.serving.replay.records import request_record
from simulator.core.request import Request, RequestStatus
from simulator.metrics import SLO, request_records, summarize, write_records, write_summary


@dataclass
class ReplayResult:
    requests: list[Request]
    summary: dict[str, Any]
    records: dict[str, np.ndarray]
    wall_s: float
    outputs: list[list[int]] = field(default_factory=list)  # token ids per request

    def write(self, out_dir: str | Path, records: str = "parquet") -> list[Path]:
        """Write `summary.json` and `requests.{parquet,csv}` (the simulator's file names)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_summary(self.summary, out / "summary.json")
        return [out / "summary.json", write_records(self.records, out / f"requests.{records}")]


def parse_target(text: str) -> tuple[str, Any]:
    """"inproc" | "engine" | "pd:P:D" | "http://host:port" -> (kind, detail)."""
    from realexec.serving.config import parse_pd

    if text in ("inproc", "engine"):
        return text, None
    if text.startswith("pd:"):
        return "pd", parse_pd(text[3:])
    if text.startswith(("http://", "https://")):
        return "http", text.rstrip("/")
    raise ValueError(f"--target must be inproc, engine, pd:P:D or http://HOST:PORT; got {text!r}")


def prepare_trace(trace: workloads.Trace, *, window_s: tuple[float, float] | None = None,
                  limit: int | None = None, scale_prompt: float = 1.0, scale_output: float = 1.0,
                  time_scale: float | None = None, target_rate: float | None = None,
                  max_model_len: int | None = None, arrival: dict[str, Any] | None = None,
                  seed: int = 0, report: dict[str, int] | None = None) -> workloads.Trace:
    """The trace after the simulator's transforms, in its order; prompt + output are then cut
    to fit `max_model_len` (prompt first, at most `max_model_len - 1` tokens). `arrival` (an
    arrival process, `workloads.arrivals`; `{"process": "burst"}`: all at t = 0, drawn with
    `seed`) replaces the arrival times, so it excludes `time_scale` and `target_rate`.
    `report`, if given, receives how many rows were cut: `clipped_prompts`, `clipped_outputs`."""
    if arrival is not None and (time_scale is not None or target_rate is not None):
        raise ValueError("--arrival replaces the trace's arrival times; drop --time-scale and --rate")
    if window_s is not None:
        trace = workloads.time_window(trace, *window_s)
    if limit is not None:
        trace = workloads.first_n(trace, limit)
    if scale_prompt != 1.0 or scale_output != 1.0:
        trace = workloads.scale_lengths(trace, prompt=scale_prompt, output=scale_output)
    if time_scale is not None:
        trace = workloads.scale_time(trace, time_scale)
    if target_rate is not None:
        trace = workloads.rescale_rate(trace, target_rate)
    if arrival is not None:
        trace = workloads.retime(trace, arrival, seed, "--arrival")
    clipped = {"clipped_prompts": 0, "clipped_outputs": 0}
    if max_model_len:
        clipped["clipped_prompts"] = int((trace.prompt_len > max_model_len - 1).sum())
        trace = workloads.limit_prompt_len(trace, max_model_len - 1, mode="clip")
        out = np.minimum(trace.output_len, max_model_len - trace.prompt_len)
        clipped["clipped_outputs"] = int((out < trace.output_len).sum())
        trace = trace.replace(output_len=np.maximum(out, 1))
    if len(trace) == 0:
        raise ValueError(f"trace {trace.name!r} has no requests left after its transforms")
    if report is not None:
        report.update(clipped)
    return trace


def check_servable(trace: workloads.Trace, num_gpu_blocks: int, block_size: int, load: str,
                   sliding_window: int = 0, max_step_tokens: int = 0) -> None:
    """Refuse a benchmark-style load (`load` names its options) with a request whose prompt +
    output needs more KV blocks than the engine's whole pool: the engine could only reject it
    (under either capacity policy), and the benchmark would measure less load than it states.
    With a `sliding_window` the pool frees (0: none), a request holds at most the window's
    blocks plus one step's (`max_step_tokens`; the core's `blocks_held`)."""
    total = trace.prompt_len + trace.output_len
    need = -(-total // block_size)
    if sliding_window:
        step = max_step_tokens or total
        need = np.minimum(need, -(-(sliding_window - 1 + step) // block_size) + 1)
    bad = np.flatnonzero(need > num_gpu_blocks)
    if len(bad):
        i = int(bad[0])
        p, o = int(trace.prompt_len[i]), int(trace.output_len[i])
        raise ValueError(
            f"{load}: {len(bad)} of {len(trace)} requests can never be served, e.g. trace row {i}: "
            f"prompt {p} + output {o} = {p + o} tokens need {int(need[i])} KV blocks of {block_size} "
            f"tokens but the engine's pool has {num_gpu_blocks}; shorten them (--scale-prompt, "
            "--scale-output) or give the engine more blocks (--num-gpu-blocks)")


def synth_prompts(trace: workloads.Trace, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """One token-id prompt per row (see the module docstring); ValueError naming a row whose
    own token ids fall outside the vocabulary."""
    prompts = []
    bs = trace.hash_block_size
    blocks: dict[int, list[int]] = {}
    for i in range(len(trace)):
        n = int(trace.prompt_len[i])
        own = trace.prompt_token_ids_of(i)
        if own is not None:
            bad = [t for t in own if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"trace row {i}: prompt token id {bad[0]} outside [0, {vocab_size})")
            prompts.append(list(own))
            continue
        hashes = trace.hash_ids_of(i)
        if hashes:
            toks: list[int] = []
            for h in hashes:
                if h not in blocks:
                    rng = np.random.default_rng([seed, int(h) & (2**63 - 1)])
                    blocks[h] = rng.integers(0, vocab_size, bs).tolist()
                toks.extend(blocks[h])
            toks = toks[:n]
            if len(toks) < n:  # hashes cover fewer tokens than the length: pad per row
                rng = np.random.default_rng([seed, 1 << 62, i])
                toks.extend(rng.integers(0, vocab_size, n - len(toks)).tolist())
            prompts.append(toks)
        else:
            prompts.append(np.random.default_rng([seed, i]).integers(0, vocab_size, n).tolist())
    return prompts


def _sleep_until(t: float) -> float:
    """Sleep until perf_counter time `t`; returns how late we woke (s)."""
    d = t - time.perf_counter()
    if d > 0:
        time.sleep(d)
    return max(0.0, time.perf_counter() - t)


def _replay_inproc(llm: Any, trace: workloads.Trace, prompts: list[list[int]],
                   max_concurrency: int | None = None, drain: int = 0) -> tuple[list[Request], dict]:
    """Drive `llm` in this thread; the engine clock is the client clock. In a closed loop a
    request is sent at max(its trace time, the finish time of the request whose slot it takes).
    `drain` > 0: request `drain` and later wait for the first `drain` to finish."""
    outs = trace.output_len.tolist()
    start = llm.clock()
    arrival = (trace.arrival_s + start).tolist()
    reqs = [llm.make_request(str(i), prompts[i],
                             {"temperature": 0.0, "max_tokens": int(outs[i]), "ignore_eos": True},
                             arrival_time=arrival[i], index=i) for i in range(len(trace))]
    # closed loop: the times (engine clock) at which free slots became free, earliest first
    free = [start] * max_concurrency if max_concurrency else None

    def send_time(req: Request) -> float:
        return req.arrival_time if free is None else max(req.arrival_time, free[0])

    k, held = 0, drain > 0  # held: request `drain` waits for the warm-ups
    while k < len(reqs) or llm.has_unfinished_requests():
        now = llm.clock()
        if held and k == drain and not llm.has_unfinished_requests():
            shift_after_drain(arrival, drain, now)  # requests `drain` on are not sent yet
            for r, a in zip(reqs[drain:], arrival[drain:]):
                r.arrival_time = a
            held = False
        while (k < len(reqs) and not (held and k == drain) and (free is None or free)
               and send_time(reqs[k]) <= now):
            if free is not None:
                reqs[k].arrival_time = send_time(reqs[k])
                heapq.heappop(free)
            llm.engine.add_request(reqs[k], now)
            k += 1
        if llm.has_unfinished_requests():
            step = llm.step()
            if free is not None:
                for r in step.finished:
                    heapq.heappush(free, r.finish_time)
        elif k < len(reqs):
            time.sleep(max(0.0, send_time(reqs[k]) - llm.clock()))
    out = []
    for i, r in enumerate(reqs):
        times = [t - start for t in r.token_times]
        fs = None if r.first_scheduled_time is None else r.first_scheduled_time - start
        out.append(request_record(i, prompts[i], int(outs[i]), r.arrival_time - start, r.output_token_ids,
                           times, r.finish_reason, None, max(r.num_cached_tokens, 0), fs,
                           {"replica": "inproc"}, r.num_preemptions, r.stop_reason))
    kvs = llm.kv_cache_manager.get_stats()
    return out, {"kv_peak_usage": kvs.peak_usage, "prefix_hit_rate": kvs.prefix_hit_rate}


def _replay_client(client: Any, trace: workloads.Trace, prompts: list[list[int]],
                   timeout_s: float, max_concurrency: int | None = None,
                   drain: int = 0) -> tuple[list[Request], dict]:
    """Submit through an `EngineClient` at the trace's times (in a closed loop, also once a slot
    is free: a request's final delta frees its slot); collect its client-side records. `drain`
    > 0: request `drain` and later wait for the first `drain` to finish."""
    outs = trace.output_len.tolist()
    arrival = trace.arrival_s.tolist()
    slots = threading.Semaphore(max_concurrency) if max_concurrency else None

    def free_slot(delta: Any) -> None:
        if delta.finished:
            slots.release()

    t0 = time.perf_counter()
    sent, lateness = [], []
    for i in range(len(trace)):
        if drain and i == drain:
            deadline = time.perf_counter() + timeout_s
            for r in sent:
                if not isinstance(r, Exception):
                    r.done.wait(max(0.0, deadline - time.perf_counter()))
            shift_after_drain(arrival, drain, time.perf_counter() - t0)
        lateness.append(_sleep_until(t0 + arrival[i]))
        if slots is not None and not slots.acquire(timeout=timeout_s):
            sent.append(RuntimeError(f"replay timeout: no request finished in {timeout_s} s "
                                     f"to free one of the {max_concurrency} slots"))
            continue
        try:
            sent.append(client.submit(prompts[i], {"temperature": 0.0, "max_tokens": int(outs[i]),
                                                   "ignore_eos": True}, request_id=f"replay-{i}",
                                      sink=free_slot if slots is not None else None))
        except RuntimeError as exc:  # no live worker: the request fails, the replay goes on
            sent.append(exc)
            if slots is not None:
                slots.release()
    deadline = time.perf_counter() + timeout_s
    for r in sent:
        if not isinstance(r, Exception) and not r.done.wait(max(0.0, deadline - time.perf_counter())):
            client.abort(r.request_id, "replay timeout")
    out = []
    for i, r in enumerate(sent):
        if isinstance(r, Exception):
            out.append(request_record(i, prompts[i], int(outs[i]), arrival[i], [], [], None, str(r)))
            continue
        kv = r.kv
        ann = {"replica": r.decode_worker or r.worker, "kv_transfer_s": kv.get("transfer_s"),
               "kv_transfer_bytes": kv.get("bytes"), "kv_lost": bool(kv.get("lost")),
               "step_s": r.step_s}
        # queueing: from submission to the first step of the worker that ran its prompt
        first_scheduled = None if r.first_scheduled is None else r.first_scheduled - t0
        rejected = r.error_kind == "rejected"  # the engine can never serve it, as simulated
        out.append(request_record(i, prompts[i], int(outs[i]), r.t_submit - t0, r.token_ids,
                           [t - t0 for t in r.token_times],
                           "rejected" if rejected else r.finish_reason,
                           None if rejected else r.error, r.num_cached_tokens, first_scheduled,
                           ann, r.num_preemptions, r.error if rejected else r.stop_reason))
    stats = [w["stats"] for w in client.workers_status().values()]
    prefill = [s for n, s in zip(client.workers_status(), stats) if not n.startswith("decode")]
    extra = {"kv_peak_usage": max((s.get("kv_peak_usage", 0.0) for s in stats), default=0.0),
             "prefix_hit_rate": float(np.mean([s.get("prefix_hit_rate", 0.0) for s in prefill] or [0.0])),
             "send_lateness_s_max": max(lateness, default=0.0)}
    return out, extra


def summarize_replay(reqs: list[Request], wall_s: float, extra_stats: dict, meta: dict,
                     slo: SLO | None = None, warmup: int = 0) -> tuple[dict, dict[str, np.ndarray]]:
    """The simulator's summary and per-request columns (all requests; the first `warmup`, in
    trace order, left out of the summary), plus serving-only columns/sections."""
    rec = request_records(reqs)
    ann = [r.annotations for r in reqs]
    rec["kv_transfer_bytes"] = np.array([float(a.get("kv_transfer_bytes") or math.nan) for a in ann])
    rec["kv_lost"] = np.array([bool(a.get("kv_lost")) for a in ann])
    rec["error"] = np.array([r.stop_reason if r.status == RequestStatus.FINISHED_ABORTED else ""
                             for r in reqs], dtype=object)
    moved = np.isfinite(rec["kv_transfer_s"]) & np.isfinite(rec["kv_transfer_bytes"])
    kv = None
    if moved.any():
        b, s = rec["kv_transfer_bytes"][moved], rec["kv_transfer_s"][moved]
        kv = {"count": int(moved.sum()), "bytes_mean": float(b.mean()),
              "seconds_mean": float(s.mean()), "gbps_mean": float((b / s).mean() / 1e9),
              "lost": int(rec["kv_lost"].sum())}
    clipped = {k: int(meta.pop(k, 0)) for k in ("clipped_prompts", "clipped_outputs")}
    extra = {"backend": {"kind": "real-serving", **meta}, "kv_transfer": kv,
             "replay": {"send_lateness_s_max": extra_stats.get("send_lateness_s_max", 0.0),
                        **clipped}}
    peak, hit = extra_stats.get("kv_peak_usage"), extra_stats.get("prefix_hit_rate")
    summary = summarize(reqs, slo=slo, kv_peak_usage=peak or 0.0, prefix_hit_rate=hit or 0.0,
                        wall_s=wall_s, records=rec, extra=extra, warmup=warmup)
    # figures the target could not give are null, not 0.0 (a server is measured from outside)
    summary["kv"] = {"peak_usage": None if peak is None else float(peak),
                     "prefix_hit_rate": None if hit is None else float(hit)}
    return summary, rec


def check_warmup_requests(warmup_requests: Any, num_requests: int) -> None:
    """ValueError unless `warmup_requests` leaves at least one of `num_requests` to measure."""
    if (isinstance(warmup_requests, bool) or not isinstance(warmup_requests, int)
            or not 0 <= warmup_requests < num_requests):
        has = f"{num_requests} request" + ("" if num_requests == 1 else "s")
        raise ValueError(f"warmup_requests must be an integer from 0 to {num_requests - 1} (the "
                         f"trace has {has}), got {warmup_requests!r}")


def replay(trace: workloads.Trace, target: str, *, client: Any = None, llm: Any = None,
           model: str | None = None, vocab_size: int | None = None, seed: int = 0,
           timeout_s: float = 600.0, slo: SLO | None = None,
           max_concurrency: int | None = None, warmup_requests: int = 0,
           warmup_drain: bool = False, clipped: dict[str, int] | None = None) -> ReplayResult:
    """Replay `trace` (already transformed) against `target`. For `inproc` pass `llm`, for
    `engine`/`pd:P:D` a started `EngineClient` as `client`, for `http://...` the served
    `model` name and its `vocab_size`. `max_concurrency`: a closed loop of that many slots
    (module docstring); None: open loop. `warmup_requests`: the first N requests (trace order)
    run but stay out of the summary; `warmup_drain`: the measured ones wait for them to finish
    (module docstring). `clipped`: `prepare_trace`'s report, carried into the
    summary's `replay` section."""
    if max_concurrency is not None and (isinstance(max_concurrency, bool)
                                        or not isinstance(max_concurrency, int) or max_concurrency < 1):
        raise ValueError(f"max_concurrency must be a positive integer, got {max_concurrency!r}")
    check_warmup_requests(warmup_requests, len(trace))
    if warmup_drain and not warmup_requests:
        raise ValueError("warmup_drain waits for the warm-up requests: give warmup_requests >= 1")
    drain = warmup_requests if warmup_drain else 0
    kind, detail = parse_target(target)
    t_start = time.perf_counter()
    if kind == "inproc":
        if llm is None:
            raise ValueError("target inproc needs llm=")
        prompts = synth_prompts(trace, llm.vocab_size, seed)
        reqs, extra = _replay_inproc(llm, trace, prompts, max_concurrency, drain)
    elif kind in ("engine", "pd"):
        if client is None:
            raise ValueError(f"target {target} needs a started EngineClient as client=")
        prompts = synth_prompts(trace, int(client.model_info["vocab_size"]), seed)
        reqs, extra = _replay_client(client, trace, prompts, timeout_s, max_concurrency,
                                     drain)
    else:
        from realexec.serving.replay.over_http import replay_http

        if model is None or vocab_size is None:
            raise ValueError("an http target needs model= and vocab_size=")
        prompts = synth_prompts(trace, vocab_size, seed)
        reqs, extra = replay_http(detail, model, trace, prompts, timeout_s, max_concurrency,
                                  drain)
    wall_s = time.perf_counter() - t_start
    meta = {"target": target, "trace": trace.name, "num_requests": len(trace), **(clipped or {})}
    if max_concurrency is not None:
        meta["max_concurrency"] = max_concurrency
    if drain:
        meta["warmup_drain"] = True
    summary, rec = summarize_replay(reqs, wall_s, extra, meta, slo, warmup_requests)
    return ReplayResult(reqs, summary, rec, wall_s, [list(r.output_token_ids) for r in reqs])
