"""Reading a request body under a size limit (413 past it)."""

from __future__ import annotations

from fastapi import Request

from realexec.serving.http.protocol import ApiError


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or ApiError 413 once it is known to exceed `limit` bytes (from its
    Content-Length before reading, else as soon as that many bytes arrived)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(f"the request body has {declared} bytes; this server takes at most "
                       f"{limit} (--max-request-bytes)", 413, code="request_too_large")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(f"the request body exceeds {limit} bytes (--max-request-bytes)", 413,
                           code="request_too_large")
        parts.append(chunk)
    return b"".join(parts)
