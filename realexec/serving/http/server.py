"""OpenAI-compatible HTTP server (FastAPI + uvicorn) in front of an `EngineClient`.

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (both with `stream: true` as
server-sent events ending in `data: [DONE]`; `n` choices; `logprobs`), `GET /v1/models`,
`GET /health` (200, or 503 while a worker is down or stalled or the server drains),
`GET /metrics` (Prometheus, `realexec.serving.metrics`), `GET /version`, and with a tokenizer
`POST /tokenize` and `POST /detokenize` (vLLM's shapes). Every error, 404/405 included, is
OpenAI's error object (`realexec.serving.http.protocol.ApiError`).

A body larger than `max_request_bytes` is a 413, refused from its Content-Length or as soon as
that many bytes arrived; parsing, validation and tokenization run on one worker thread, not
on the event loop that feeds the streams. A request whose worker is down is a 503; a client
that disconnects (or cancels) aborts its request, and the engine frees its blocks before its
next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from realexec.serving.client import EngineClient, EngineDeadError
from realexec.serving.http.body import read_body
from realexec.serving.http.generate import Choices, ClosingStream, collect, stream_events
from realexec.serving.http.middleware import AccessLog, ApiKey
from realexec.serving.http.protocol import ApiError, parse_request
from realexec.serving.metrics import PROMETHEUS_CONTENT_TYPE, render_metrics

log = logging.getLogger("kvpd.http")

# Default `max_request_bytes`: vLLM has no limit; 4 MiB holds a 262k-token prompt of ids
# (<= 16 bytes each as JSON), far beyond any context served here, and parses in ~30 ms.
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
# Default idle keep-alive of a connection (s; uvicorn's `timeout_keep_alive`, 5 s by default).
# The side that closes an idle connection must be the client: a server that closes it while
# the client's pool reuses it resets the new request (ReadError or "server disconnected",
# with no response). So it must outlast the clients' pool expiry: httpx (and so the `openai`
# client) 5 s, aiohttp 15 s, an AWS ALB in front 60 s (its docs ask targets for more than its
# idle timeout); 75 s is nginx's default `keepalive_timeout`. A client whose pool never
# expires (urllib3) can still race: RFC 9112 section 9.3.1 has clients expect a connection
# to close at any time.
DEFAULT_TIMEOUT_KEEP_ALIVE_S = 75.0


@dataclass
class ServerOptions:
    """max_request_bytes: larger bodies get 413. api_key: require `Bearer <key>` (None: open).
    max_model_len: the context advertised and enforced (None: the workers'). access_log: one
    INFO line per request on the `kvpd.access` logger."""

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    api_key: str | None = None
    max_model_len: int | None = None
    access_log: bool = True


class ServerState:
    """What the routes share: `draining` once shutdown began (new requests get 503)."""

    def __init__(self) -> None:
        self.draining = False


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def create_app(client: EngineClient, served_model_name: str, tokenizer: Any = None,
               options: ServerOptions | None = None) -> FastAPI:
    """The FastAPI app serving `client`'s workers under the model name `served_model_name`."""
    opts = options or ServerOptions()
    app = FastAPI(title="kvpd", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.kvpd = state = ServerState()
    created = int(time.time())
    parser = ThreadPoolExecutor(1, thread_name_prefix="kvpd-parse")

    def max_model_len() -> int:
        return int(opts.max_model_len or client.model_info["max_model_len"])

    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(ApiError(f"invalid request: {exc.errors()[:1]}"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        what = {404: f"Invalid URL ({req.method} {req.url.path})",
                405: f"Method {req.method} is not allowed for {req.url.path}"}
        err = ApiError(what.get(exc.status_code, str(exc.detail)), exc.status_code)
        return JSONResponse(err.body(), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return _error(ApiError(f"internal error: {type(exc).__name__}: {exc}", 500,
                               err_type="server_error"))

    async def _off_loop(fn: Any, *args: Any, **kw: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(parser, lambda: fn(*args, **kw))

    async def _complete(request: Request, chat: bool) -> Any:
        raw = await read_body(request, opts.max_request_bytes)
        info = client.model_info
        req = await _off_loop(parse_request, raw, chat=chat, served=served_model_name,
                              tokenizer=tokenizer, vocab_size=int(info["vocab_size"]),
                              max_model_len=max_model_len())
        if state.draining:
            raise ApiError("the server is shutting down", 503, err_type="service_unavailable")
        if not client.is_healthy():
            bad = {n: w["down"] or "stalled" for n, w in client.workers_status().items()
                   if w["down"] or w["stalled"] or not w["alive"]}
            raise ApiError(f"the engine is down: {bad}", 503, err_type="service_unavailable")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        try:
            choices = Choices(client, rid, req)
        except EngineDeadError as exc:
            raise ApiError(str(exc), 503, err_type="service_unavailable") from None
        if req.stream:
            return ClosingStream(stream_events(rid, served_model_name, req, chat, choices,
                                               tokenizer), choices)
        body = await collect(request, rid, served_model_name, req, chat, choices, tokenizer)
        return JSONResponse({}, status_code=499) if body is None else JSONResponse(body)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await _complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await _complete(request, chat=True)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        info = client.model_info
        return {"object": "list", "data": [{
            "id": served_model_name, "object": "model", "created": created, "owned_by": "kvpd",
            "root": str(info.get("source", served_model_name)),
            "max_model_len": max_model_len(), "vocab_size": info.get("vocab_size")}]}

    @app.get("/health")
    async def health() -> JSONResponse:
        status = client.workers_status()
        ok = client.is_healthy() and not state.draining
        body = {"status": "ok" if ok else ("draining" if state.draining else "down"),
                "workers": {n: {"role": w["role"], "alive": w["alive"], "down": w["down"],
                                "stalled": w["stalled"], "restarts": w["restarts"],
                                "pid": w["pid"]}
                            for n, w in status.items()}}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        text = render_metrics(client.metrics, client.workers_status(), len(client.requests),
                              served_model_name)
        return Response(text, media_type=PROMETHEUS_CONTENT_TYPE)

    @app.get("/version")
    async def version() -> dict[str, str]:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as package_version

        try:  # the installed distribution's version (realexec does not import the CLI layer)
            return {"version": package_version("kvpd")}
        except PackageNotFoundError:
            return {"version": "unknown (kvpd is not installed)"}

    if tokenizer is not None:
        from realexec.serving.http.tokenize import add_tokenize_routes

        add_tokenize_routes(app, served_model_name, tokenizer, max_model_len,
                            opts.max_request_bytes, _off_loop)
    app.add_middleware(_Outer, inner=(opts.api_key, opts.access_log))  # type: ignore[arg-type]
    return app


class _Outer:
    """The access log outside the API-key check (refused requests are logged too)."""

    def __init__(self, app: Any, inner: tuple[str | None, bool]) -> None:
        key, access = inner
        wrapped = ApiKey(app, key) if key else app
        self.app = AccessLog(wrapped) if access else wrapped

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


class ServerThread:
    """Run uvicorn for `app` in a background thread (tests, benchmarks): `start()` returns once
    it listens; `port` is the one it got (0 asks for a free port)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                 timeout_keep_alive_s: float = DEFAULT_TIMEOUT_KEEP_ALIVE_S) -> None:
        import uvicorn

        self.config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                                     lifespan="off", timeout_keep_alive=timeout_keep_alive_s)
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
