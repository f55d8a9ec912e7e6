"""vLLM's `/tokenize` and `/detokenize` routes (served when a tokenizer is loaded).

`POST /tokenize` `{"model"?, "prompt": str, "add_special_tokens"?: bool}` or
`{"model"?, "messages": [...]}` -> `{"count", "max_model_len", "tokens"}`;
`POST /detokenize` `{"model"?, "tokens": [int]}` -> `{"prompt": str}`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from pydantic import Field, ValidationError

from realexec.serving.http.body import read_body
from realexec.serving.http.protocol import (
    ApiError,
    ChatMessage,
    _Strict,
    check_model,
    error_from,
    render_chat,
)


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int] = Field(...)


def _validate(model: type, raw: bytes, served: str) -> Any:
    try:
        req = model.model_validate_json(raw)
    except ValidationError as exc:
        raise error_from(exc) from None
    if req.model is not None:
        check_model(req.model, served)
    return req


def tokenize(raw: bytes, served: str, tokenizer: Any) -> list[int]:
    req = _validate(TokenizeRequest, raw, served)
    if (req.prompt is None) == (req.messages is None):
        raise ApiError("give exactly one of 'prompt' and 'messages'", param="prompt")
    if req.prompt is not None:
        return list(tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens))
    msgs = [{"role": m.role, "content": m.content if isinstance(m.content, str) else
             "".join(str(p.get("text", "")) for p in m.content)} for m in req.messages]
    return render_chat(tokenizer, msgs)


def detokenize(raw: bytes, served: str, tokenizer: Any) -> str:
    req = _validate(DetokenizeRequest, raw, served)
    vocab = len(tokenizer)
    for i, t in enumerate(req.tokens):
        if not 0 <= t < vocab:
            raise ApiError(f"'tokens[{i}]' = {t} is not a token id in [0, {vocab})", param="tokens")
    return tokenizer.decode(req.tokens)


def add_tokenize_routes(app: FastAPI, served: str, tokenizer: Any, max_model_len: Callable[[], int],
                        limit: int, off_loop: Callable[..., Any]) -> None:
    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> dict[str, Any]:
        raw = await read_body(request, limit)
        ids = await off_loop(tokenize, raw, served, tokenizer)
        return {"count": len(ids), "max_model_len": max_model_len(), "tokens": ids}

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> dict[str, Any]:
        raw = await read_body(request, limit)
        return {"prompt": await off_loop(detokenize, raw, served, tokenizer)}
