"""ASGI middleware of the HTTP server: an access-log line per request, and the API key.

Both are plain ASGI (not Starlette's `BaseHTTPMiddleware`, which buffers and cancels streamed
responses badly), so a streamed completion is logged once, when its last byte is sent.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from typing import Any

access_log = logging.getLogger("kvpd.access")

# Paths open without the API key (as vLLM leaves its health, metrics and version routes open).
OPEN_PATHS = ("/health", "/metrics", "/version", "/ping")


class AccessLog:
    """One INFO line per request on `kvpd.access`: client, method, path, status, response
    bytes, and seconds from the request to its last byte."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status, nbytes = [500], [0]

        async def send_logged(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            elif msg["type"] == "http.response.body":
                nbytes[0] += len(msg.get("body", b""))
            await send(msg)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            client = scope.get("client") or ("-", 0)
            access_log.info('%s:%s "%s %s" %d %dB %.3fs', client[0], client[1], scope["method"],
                            scope["path"], status[0], nbytes[0], time.perf_counter() - t0)


class ApiKey:
    """With a key set, every route but `OPEN_PATHS` needs `Authorization: Bearer <key>`
    (401 in OpenAI's error shape otherwise), as vLLM's `--api-key`."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.want = f"Bearer {key}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        got = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(got, self.want):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": {"message": "Incorrect or missing API key (send "
                                                "'Authorization: Bearer <key>')",
                                     "type": "invalid_request_error", "param": None,
                                     "code": "invalid_api_key"}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
