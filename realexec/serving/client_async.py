"""asyncio face of an `EngineClient` (`realexec.serving.client`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from realexec.serving.client_types import ClientRequest, Delta, RequestFailed


class AsyncEngineClient:
    """asyncio face of an `EngineClient`: `stream` is an async iterator of `Delta`s; cancelling
    or closing it aborts the request."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def stream(self, prompt_token_ids: list[int], sampling: dict[str, Any] | None = None,
                     request_id: str | None = None) -> AsyncIterator[Delta]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Delta] = asyncio.Queue()
        req = self.client.submit(prompt_token_ids, sampling, request_id,
                                 sink=lambda d: loop.call_soon_threadsafe(q.put_nowait, d))
        try:
            while True:
                delta = await q.get()
                yield delta
                if delta.finished:
                    return
        finally:
            if not req.finished:
                self.client.abort(req.request_id, "client disconnected")

    async def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any] | None = None,
                       request_id: str | None = None) -> ClientRequest:
        """Wait for the whole output; RequestFailed if it ends with an error."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def sink(delta: Delta) -> None:
            if delta.finished:
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

        req = self.client.submit(prompt_token_ids, sampling, request_id, sink=sink)
        try:
            await done
        finally:
            if not req.finished:
                self.client.abort(req.request_id, "client disconnected")
        if req.error:
            raise RequestFailed(req.error)
        return req
