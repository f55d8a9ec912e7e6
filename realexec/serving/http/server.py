"""OpenAI-compatible HTTP server (FastAPI + uvicorn) in front of an `EngineClient`.

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (both with `stream: true` as
server-sent events ending in `data: [DONE]`), `GET /v1/models`, `GET /health` (200, or 503
with the down workers), `GET /metrics` (Prometheus text). Bad input is a 400 with an
OpenAI-style error body (`realexec.serving.http.protocol`); a request whose worker is down is a 503.
A client that disconnects (or cancels) aborts its request: the engine frees its blocks
before its next step.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from realexec.serving.client import AsyncEngineClient, EngineClient, EngineDeadError
from realexec.serving.http.protocol import (
    ApiError,
    Detokenizer,
    ParsedRequest,
    chunk_body,
    completion_body,
    parse_request,
    usage,
)

# How often a non-streaming handler checks whether its client went away (s).
DISCONNECT_POLL_S = 0.1


def load_tokenizer(path: str | Path | None) -> Any:
    """An HF tokenizer from a directory with tokenizer files, or None if there is none."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_dir() or not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(p, local_files_only=True)


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def create_app(client: EngineClient, served_model_name: str, tokenizer: Any = None) -> FastAPI:
    """The FastAPI app serving `client`'s workers under the model name `served_model_name`."""
    app = FastAPI(title="kvpd", docs_url=None, redoc_url=None)
    aclient = AsyncEngineClient(client)
    created = int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(ApiError(f"invalid request: {exc.errors()[:1]}"))

    async def _body(request: Request) -> Any:
        try:
            return json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(f"the request body is not valid JSON ({exc})") from None

    def _parse(body: Any, chat: bool) -> ParsedRequest:
        info = client.model_info
        return parse_request(body, chat=chat, served=served_model_name, tokenizer=tokenizer,
                             vocab_size=int(info["vocab_size"]),
                             max_model_len=int(info["max_model_len"]))

    async def _complete(request: Request, chat: bool) -> Any:
        req = _parse(await _body(request), chat)
        prefix = "chatcmpl-" if chat else "cmpl-"
        rid = prefix + uuid.uuid4().hex
        if not client.is_healthy():
            down = {n: w["down"] for n, w in client.workers_status().items() if w["down"]}
            raise ApiError(f"the engine is down: {down}", 503, err_type="service_unavailable")
        if req.stream:
            return StreamingResponse(_stream(rid, req, chat), media_type="text/event-stream")
        return await _whole(request, rid, req, chat)

    async def _whole(request: Request, rid: str, req: ParsedRequest, chat: bool) -> JSONResponse:
        detok = Detokenizer(tokenizer, req.stop_strings)
        toks: list[int] = []
        gen = aclient.stream(req.prompt_token_ids, req.sampling, rid)
        task = asyncio.ensure_future(_collect(gen, detok, toks, rid))
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return JSONResponse({}, status_code=499)
        finish, preempted, queueing = task.result()
        return JSONResponse(completion_body(rid, served_model_name, detok.text, toks, finish,
                                            len(req.prompt_token_ids), chat, preempted, queueing))

    async def _collect(gen: Any, detok: Detokenizer, toks: list[int],
                       rid: str) -> tuple[str | None, int | None, float | None]:
        """(finish reason, preemptions, queueing s: the last two known when the engine
        finished the request)."""
        try:
            async for delta in gen:
                if delta.error:
                    status = 503 if "down" in delta.error else 500
                    raise ApiError(delta.error, status, err_type="server_error")
                toks.extend(delta.token_ids)
                detok.add(delta.token_ids)
                if detok.stopped:
                    client.abort(rid, "stop string")
                    return "stop", None, None
                if delta.finished:
                    return delta.finish_reason, delta.num_preemptions, delta.queueing_s
        finally:
            await gen.aclose()
        return None, None, None

    async def _stream(rid: str, req: ParsedRequest, chat: bool):
        detok = Detokenizer(tokenizer, req.stop_strings)
        n_out = 0
        gen = aclient.stream(req.prompt_token_ids, req.sampling, rid)
        try:
            if chat:
                yield _sse(chunk_body(rid, served_model_name, "", [], None, True, role=True))
            async for delta in gen:
                if delta.error:
                    yield _sse(ApiError(delta.error, 503, err_type="server_error").body())
                    break
                n_out += len(delta.token_ids)
                text = detok.add(delta.token_ids)
                finish = delta.finish_reason if delta.finished else None
                if detok.stopped:
                    client.abort(rid, "stop string")
                    finish = "stop"
                if delta.token_ids or finish:
                    done = delta.finished
                    yield _sse(chunk_body(rid, served_model_name, text, delta.token_ids, finish, chat,
                                          num_preemptions=delta.num_preemptions if done else None,
                                          queueing_s=delta.queueing_s if done else None))
                if finish:
                    break
            if req.include_usage:
                yield _sse({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                            "created": int(time.time()), "model": served_model_name, "choices": [],
                            "usage": usage(len(req.prompt_token_ids), n_out)})
            yield "data: [DONE]\n\n"
        finally:
            await gen.aclose()

    async def _serve(request: Request, chat: bool) -> Any:
        """`_complete`, with a dead engine answered as 503."""
        try:
            return await _complete(request, chat)
        except EngineDeadError as exc:
            raise ApiError(str(exc), 503, err_type="service_unavailable") from None

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await _serve(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await _serve(request, chat=True)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        info = client.model_info
        return {"object": "list", "data": [{
            "id": served_model_name, "object": "model", "created": created, "owned_by": "kvpd",
            "root": str(info.get("source", served_model_name)),
            "max_model_len": info.get("max_model_len"), "vocab_size": info.get("vocab_size")}]}

    @app.get("/health")
    async def health() -> JSONResponse:
        status = client.workers_status()
        ok = client.is_healthy()
        body = {"status": "ok" if ok else "down",
                "workers": {n: {"role": w["role"], "alive": w["alive"], "down": w["down"]}
                            for n, w in status.items()}}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = client.metrics.render(client.workers_status(), len(client.requests))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


class ServerThread:
    """Run uvicorn for `app` in a background thread (tests, benchmarks): `start()` returns once
    it listens; `port` is the one it got (0 asks for a free port)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                                     lifespan="off")
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, name="kvpd-http", daemon=True)
        self.host = host

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.02)
        return self

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10.0)
