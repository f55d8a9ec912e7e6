"""Replay over HTTP: one streaming `/v1/completions` request (token-id prompt, `ignore_eos`,
greedy) per trace row, sent at its arrival time; each server-sent chunk is stamped on
arrival (`time.perf_counter()`), and its `token_ids` count the tokens it carries; the
finishing chunk's `kvpd.num_preemptions` and `kvpd.queueing_s` (kvpd's extension field)
are the request's preemptions and its wait from the server's receipt to the first step of
the worker that ran its prompt (added to the send time: queueing as the client sees it
less the request's trip to the server). With `max_concurrency` = N (a closed loop, as
`vllm bench serve --max-concurrency`) a request is sent once its time has come and one of N
slots is free; it is stamped as sent then, so TTFT counts from the send.

What a client cannot see is read from the server's `/metrics` before and after the replay:
the prefix-cache hit rate is the change in `vllm:prefix_cache_hits_total` over the change in
`vllm:prefix_cache_queries_total` of the workers that compute prompts (None when the server
has no such counters, or nothing was looked up). The KV pool's peak usage is not exported
(only the current usage), so it is None."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

import workloads
from realexec.serving.replay.drain import shift_after_drain
from realexec.serving.replay.records import request_record


async def _one(http: httpx.AsyncClient, url: str, model: str, i: int, prompt: list[int],
               n_out: int, t0: float, at: float, slots: asyncio.Semaphore | None) -> dict[str, Any]:
    delay = t0 + at - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    if slots is None:
        return await _send(http, url, model, i, prompt, n_out, t0)
    async with slots:
        return await _send(http, url, model, i, prompt, n_out, t0)


def _rejection(err: Any) -> str | None:
    """The message of an OpenAI error object coded `context_length_exceeded` (a request the
    server can never serve: past the context or the whole KV pool, said as a 400 or, once
    streaming, as an error event); None for any other error."""
    if not isinstance(err, dict) or err.get("code") != "context_length_exceeded":
        return None
    return str(err.get("message") or "context_length_exceeded")


def _error_of(text: str) -> Any:
    """The `error` object of an error answer's body (None if it has none)."""
    try:
        return json.loads(text).get("error")
    except (ValueError, AttributeError):
        return None


async def _send(http: httpx.AsyncClient, url: str, model: str, i: int, prompt: list[int],
                n_out: int, t0: float) -> dict[str, Any]:
    sent = time.perf_counter() - t0
    body = {"model": model, "prompt": prompt, "max_tokens": n_out, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    toks: list[int] = []
    times: list[float] = []
    finish, error, preempted, queueing, reason = None, None, 0, None, None
    try:
        async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                why = _rejection(_error_of(text)) if resp.status_code == 400 else None
                if why is not None:  # the engine can never serve it: rejected, as simulated
                    return {"i": i, "sent": sent, "toks": [], "times": [], "finish": "rejected",
                            "error": None, "reason": why, "preempted": 0, "queueing": None}
                return {"i": i, "sent": sent, "toks": [], "times": [], "finish": None,
                        "error": f"HTTP {resp.status_code}: {text[:500]}", "preempted": 0,
                        "queueing": None}
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                now = time.perf_counter() - t0
                chunk = json.loads(data)
                if "error" in chunk:
                    reason = _rejection(chunk["error"])
                    if reason is not None:
                        finish = "rejected"
                    else:
                        error = chunk["error"].get("message", str(chunk["error"]))
                    break
                ext = chunk.get("kvpd") or {}
                preempted = int(ext.get("num_preemptions", preempted))
                if ext.get("queueing_s") is not None:
                    queueing = float(ext["queueing_s"])
                for choice in chunk.get("choices", []):
                    ids = choice.get("token_ids") or []
                    toks.extend(ids)
                    times.extend([now] * len(ids))
                    finish = choice.get("finish_reason") or finish
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"i": i, "sent": sent, "toks": toks, "times": times, "finish": finish, "error": error,
            "reason": reason, "preempted": preempted, "queueing": queueing}


async def _run(url: str, model: str, trace: workloads.Trace, prompts: list[list[int]],
               timeout_s: float, max_concurrency: int | None,
               drain: int = 0) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
        t0 = time.perf_counter()
        outs = trace.output_len.tolist()
        arrival = trace.arrival_s.tolist()
        # asyncio.Semaphore wakes waiters in FIFO order: the trace's order at equal times
        slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        def send(rows: range) -> list:
            return [_one(http, url, model, i, prompts[i], int(outs[i]), t0, arrival[i], slots)
                    for i in rows]

        if not drain:
            return await asyncio.gather(*send(range(len(trace))))
        warm = await asyncio.gather(*send(range(drain)))  # every warm-up ends first
        shift_after_drain(arrival, drain, time.perf_counter() - t0)
        return warm + await asyncio.gather(*send(range(drain, len(trace))))


def prefix_counters(url: str) -> tuple[float, float] | None:
    """(prefix-cache queries, hits) in tokens, summed over the server's workers that compute
    prompts (colocated, prefill), from its `/metrics`; None if it exports none."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        fams = {f.name: f for f in text_string_to_metric_families(text)}
    except (httpx.HTTPError, ValueError):
        return None
    out = []
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
        fam = fams.get(name)
        if fam is None:
            return None
        out.append(sum(s.value for s in fam.samples if s.name.endswith("_total")
                       and s.labels.get("role") != "decode"))
    return out[0], out[1]


def replay_http(url: str, model: str, trace: workloads.Trace, prompts: list[list[int]],
                timeout_s: float, max_concurrency: int | None = None,
                drain: int = 0) -> tuple[list[Any], dict[str, Any]]:
    """(client-side `Request` records, extra stats) of a replay against a running server;
    `max_concurrency`: a closed loop of that many slots (None: open loop); `drain` > 0: request
    `drain` and later wait for the first `drain` to finish (runner's module docstring)."""

    before = prefix_counters(url)
    rows = asyncio.run(_run(url, model, trace, prompts, timeout_s, max_concurrency, drain))
    after = prefix_counters(url)
    hit_rate = None
    if before is not None and after is not None and after[0] > before[0]:
        hit_rate = (after[1] - before[1]) / (after[0] - before[0])
    outs = trace.output_len.tolist()
    reqs = [request_record(r["i"], prompts[r["i"]], int(outs[r["i"]]), r["sent"], r["toks"], r["times"],
                    r["finish"], r["error"], 0,
                    None if r["queueing"] is None else r["sent"] + r["queueing"],
                    {"replica": url}, r["preempted"], r.get("reason"))
            for r in rows]
    return reqs, {"kv_peak_usage": None, "prefix_hit_rate": hit_rate}
