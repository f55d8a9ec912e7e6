"""Replay over HTTP: one streaming `/v1/completions` request (token-id prompt, `ignore_eos`,
greedy) per trace row, sent at its arrival time; each server-sent chunk is stamped on
arrival (`time.perf_counter()`), and its `token_ids` count the tokens it carries; the
finishing chunk's `kvpd.num_preemptions` and `kvpd.queueing_s` (kvpd's extension field)
are the request's preemptions and its wait from the server's receipt to the first step of
the worker that ran its prompt (added to the send time: queueing as the client sees it
less the request's trip to the server). With `max_concurrency` = N (a closed loop, as
`vllm bench serve --max-concurrency`) a request is sent once its time has come and one of N
slots is free; it is stamped as sent then, so TTFT counts from the send."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

import workloads
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


async def _send(http: httpx.AsyncClient, url: str, model: str, i: int, prompt: list[int],
                n_out: int, t0: float) -> dict[str, Any]:
    sent = time.perf_counter() - t0
    body = {"model": model, "prompt": prompt, "max_tokens": n_out, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    toks: list[int] = []
    times: list[float] = []
    finish, error, preempted, queueing = None, None, 0, None
    try:
        async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
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
            "preempted": preempted, "queueing": queueing}


async def _run(url: str, model: str, trace: workloads.Trace, prompts: list[list[int]],
               timeout_s: float, max_concurrency: int | None) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
        t0 = time.perf_counter()
        outs = trace.output_len.tolist()
        arrival = trace.arrival_s.tolist()
        # asyncio.Semaphore wakes waiters in FIFO order: the trace's order at equal times
        slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        tasks = [_one(http, url, model, i, prompts[i], int(outs[i]), t0, arrival[i], slots)
                 for i in range(len(trace))]
        return await asyncio.gather(*tasks)


def replay_http(url: str, model: str, trace: workloads.Trace, prompts: list[list[int]],
                timeout_s: float, max_concurrency: int | None = None) -> tuple[list[Any], dict[str, Any]]:
    """(client-side `Request` records, extra stats) of a replay against a running server;
    `max_concurrency`: a closed loop of that many slots (None: open loop)."""

    rows = asyncio.run(_run(url, model, trace, prompts, timeout_s, max_concurrency))
    outs = trace.output_len.tolist()
    reqs = [request_record(r["i"], prompts[r["i"]], int(outs[r["i"]]), r["sent"], r["toks"], r["times"],
                    r["finish"], r["error"], 0,
                    None if r["queueing"] is None else r["sent"] + r["queueing"],
                    {"replica": url}, r["preempted"])
            for r in rows]
    return reqs, {}
