"""The engine side of one completion / chat request: its `n` choices submitted to the engine
client (`Choices`), streamed as server-sent events (`stream_events`) or collected into one
response (`collect`).

Every path that ends a response, however it ends (finished, error, client gone, server
shutting down, an exception), goes through `Choices.close`, which aborts what is still in
flight: no request outlives its HTTP exchange.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from realexec.engine.tokenizer import Detokenizer
from realexec.serving.client_types import Delta
from realexec.serving.http.protocol import ApiError, ParsedRequest, child_sampling
from realexec.serving.http.responses import (
    choice_body,
    chunk_body,
    completion_body,
    echo_logprobs,
    echo_text,
    logprobs_body,
    prompt_logprobs_body,
    usage,
)

# How often a non-streaming handler checks whether its client went away (s).
DISCONNECT_POLL_S = 0.1


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def delta_error(d: Delta) -> ApiError:
    """The API error for a request that ended with an error."""
    if d.error_kind == "rejected":
        return ApiError(d.error or "rejected", 400, param="prompt", code="context_length_exceeded")
    if d.error_kind in ("down", "shutdown"):
        return ApiError(d.error or "unavailable", 503, err_type="service_unavailable")
    return ApiError(d.error or "internal error", 500, err_type="server_error")


class Choices:
    """The engine requests of one API request, `n` per prompt (ids `rid`, or `rid-0` ..
    `rid-{k-1}` for k choices; choice i runs prompt i // n), their deltas merged into one
    asyncio queue in arrival order."""

    def __init__(self, client: Any, rid: str, req: ParsedRequest) -> None:
        loop = asyncio.get_running_loop()
        self.client = client
        self.q: asyncio.Queue[tuple[int, Delta]] = asyncio.Queue()
        k = req.num_choices
        self.ids = [rid] if k == 1 else [f"{rid}-{i}" for i in range(k)]
        self.done = [False] * k
        try:
            for i, sub in enumerate(self.ids):
                client.submit(req.prompts[i // req.n], child_sampling(req, i % req.n), sub,
                              sink=lambda d, i=i: loop.call_soon_threadsafe(
                                  self.q.put_nowait, (i, d)))
        except BaseException:
            self.close("a sibling choice could not be submitted")
            raise

    def finish(self, i: int, reason: str) -> None:
        """End choice `i` here (a stop string): abort it in the engine, ignore its deltas."""
        self.done[i] = True
        self.client.abort(self.ids[i], reason)

    def close(self, reason: str = "client disconnected") -> None:
        for sub in self.ids:
            self.client.abort(sub, reason)  # a no-op for requests that finished

    def __aiter__(self) -> AsyncIterator[tuple[int, Delta]]:
        return self._deltas()

    async def _deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        while not all(self.done):
            i, d = await self.q.get()
            if self.done[i]:
                continue
            if d.finished:
                self.done[i] = True
            yield i, d


class ClosingStream(StreamingResponse):
    """A streamed response that closes its `Choices` however the exchange ends, even when the
    client leaves before the body's first byte (the generator then never runs)."""

    def __init__(self, content: Any, choices: Choices) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.choices = choices

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.choices.close()


async def stream_events(rid: str, model: str, req: ParsedRequest, chat: bool, choices: Choices,
                        tokenizer: Any) -> AsyncIterator[str]:
    """The server-sent events of a streamed request, ending in `data: [DONE]`."""
    dets = [Detokenizer(tokenizer, req.stop_strings) for _ in range(req.num_choices)]
    offsets = [0] * req.num_choices
    echoed = [False] * req.num_choices
    n_out = 0
    if chat:
        for i in range(req.num_choices):
            yield sse(chunk_body(rid, model, "", [], None, True, role=True, index=i))
    async for i, d in choices:
        if d.error:
            yield sse(delta_error(d).body())
            break
        if req.prompt_only:
            d = dataclasses.replace(d, token_ids=[], logprobs=None)
        n_out += len(d.token_ids)
        text = dets[i].add(d.token_ids, final=d.finished)
        finish = d.finish_reason if d.finished else None
        if dets[i].stopped and not d.finished:
            choices.finish(i, "stop string")
            finish = "stop"
        if d.token_ids or finish:
            lp = None
            if req.echo and not echoed[i]:  # the prompt goes first, with the first tokens
                echoed[i] = True
                p = i // req.n
                text = echo_text(tokenizer, req.prompts[p], req.prompt_texts[p]) + text
                if req.logprobs is not None:
                    lp = echo_logprobs(tokenizer, req.prompts[p], d.prompt_logprobs or [],
                                       (d.token_ids, d.logprobs or []))
            elif req.logprobs is not None and d.logprobs:
                lp = logprobs_body(tokenizer, d.token_ids, d.logprobs, chat, offsets[i])
            if lp is not None and lp.get("tokens"):  # completions' shape: where the next starts
                offsets[i] = lp["text_offset"][-1] + len(lp["tokens"][-1])
            done = d.finished
            yield sse(chunk_body(rid, model, text, d.token_ids, finish, chat,
                                 num_preemptions=d.num_preemptions if done else None,
                                 queueing_s=d.queueing_s if done else None, index=i,
                                 logprobs=lp))
    if req.include_usage:
        yield sse({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                   "created": int(time.time()), "model": model, "choices": [],
                   "usage": usage(req.num_prompt_tokens, n_out)})
    yield "data: [DONE]\n\n"


async def collect(request: Request, rid: str, model: str, req: ParsedRequest, chat: bool,
                  choices: Choices, tokenizer: Any) -> dict[str, Any] | None:
    """The whole response body, or None if the client went away first."""
    task = asyncio.ensure_future(_gather(req, choices, tokenizer))
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return None
        outs, preempted, queueing = task.result()
    finally:
        choices.close()
    scored_prompts: dict[int, list] = {}

    def scored(i: int) -> list:  # vLLM's prompt_logprobs of choice i's prompt, built once
        p = i // req.n  # (the n choices of a prompt share it; the first one's is used)
        if p not in scored_prompts:
            scored_prompts[p] = prompt_logprobs_body(tokenizer, req.prompts[p], outs[i][4] or [],
                                                     req.prompt_logprobs)
        return scored_prompts[p]

    bodies = []
    for i, (det, toks, lps, finish, plp) in enumerate(outs):
        text, p = det.text, i // req.n
        lp = logprobs_body(tokenizer, toks, lps, chat) if req.logprobs is not None else None
        if req.echo:
            text = echo_text(tokenizer, req.prompts[p], req.prompt_texts[p]) + text
            if lp is not None:
                lp = echo_logprobs(tokenizer, req.prompts[p], plp or [], (toks, lps))
        bodies.append(choice_body(i, text, toks, finish, chat, lp))
        if req.prompt_logprobs is not None and not chat:  # vLLM: on each completion choice
            bodies[-1]["prompt_logprobs"] = scored(i)
    body = completion_body(rid, model, bodies, req.num_prompt_tokens, chat, preempted, queueing)
    if req.prompt_logprobs is not None and chat:  # ... and once at the top of a chat response
        body["prompt_logprobs"] = scored(0)
    return body


async def _gather(req: ParsedRequest, choices: Choices, tokenizer: Any) -> tuple[list, Any, Any]:
    # per choice: detokenizer, token ids, their logprobs, finish reason, prompt logprobs
    outs: list[Any] = [[Detokenizer(tokenizer, req.stop_strings), [], [], None, None]
                       for _ in range(req.num_choices)]
    preempted, queueing, ended = 0, None, False
    async for i, d in choices:
        det, toks, lps = outs[i][:3]
        if d.error:
            raise delta_error(d)
        if req.prompt_only:
            d = dataclasses.replace(d, token_ids=[], logprobs=None)
        toks.extend(d.token_ids)
        lps.extend(d.logprobs or [])
        if d.prompt_logprobs is not None:
            outs[i][4] = d.prompt_logprobs
        det.add(d.token_ids)
        if det.stopped and not d.finished:
            choices.finish(i, "stop string")
            outs[i][3] = "stop"
        elif d.finished:
            outs[i][3] = d.finish_reason
            ended = True
            preempted += d.num_preemptions
            queueing = d.queueing_s if queueing is None else queueing
    return outs, (preempted if ended else None), queueing
