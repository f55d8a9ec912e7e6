"""OpenAI API shapes for `realexec.serving.http.server`: request validation (-> `ApiError` 400 with an
OpenAI-style body) and response / stream-chunk construction.

Prompts are token ids (`prompt: [int, ...]`, or `prompt_token_ids` in the body of a chat
request, e.g. via the `openai` client's `extra_body`) or, when a tokenizer is loaded, text.
Extensions beyond OpenAI's fields (vLLM's names): `top_k`, `min_tokens`, `ignore_eos`,
`stop_token_ids`, `prompt_token_ids`; every choice also carries its `token_ids`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from simulator.core.request import SamplingParams


class ApiError(Exception):
    """An error answered as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None, err_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.type = (
            message, status, param, code, err_type)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


@dataclass
class ParsedRequest:
    """A validated completion / chat request, ready for the engine."""

    prompt_token_ids: list[int]
    sampling: dict[str, Any]
    stream: bool
    include_usage: bool
    stop_strings: list[str]


# Fields OpenAI defines that this server accepts only at their neutral value.
_NEUTRAL = {"n": 1, "best_of": 1, "echo": False, "logprobs": None, "top_logprobs": None,
            "suffix": None, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "logit_bias": None, "tools": None, "tool_choice": None, "response_format": None}


def _num(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise ApiError(f"'{name}' must be {'a number' if kind is float else 'an integer'}, "
                       f"got {value!r}", param=name)
    return kind(value)


def check_model(body: dict[str, Any], served: str) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError("'model' is required (a string)", param="model")
    if model != served:
        raise ApiError(f"The model '{model}' does not exist; this server serves '{served}'",
                       param="model", code="model_not_found")


def token_prompt(value: Any, vocab_size: int, param: str) -> list[int]:
    if not value:
        raise ApiError(f"'{param}' is empty; give at least one token", param=param)
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise ApiError(f"'{param}[{i}]' = {t!r} is not a token id in [0, {vocab_size})",
                           param=param)
    return list(value)


def encode_text(tokenizer: Any, text: str, param: str) -> list[int]:
    if tokenizer is None:
        raise ApiError(f"'{param}' is text but this model has no tokenizer; send token ids "
                       "(a list of integers)", param=param)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise ApiError(f"'{param}' encodes to no tokens", param=param)
    return list(ids)


def completion_prompt(body: dict[str, Any], tokenizer: Any, vocab_size: int) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return encode_text(tokenizer, prompt, "prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return encode_text(tokenizer, prompt, "prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return token_prompt(prompt, vocab_size, "prompt")
    if isinstance(prompt, list):
        raise ApiError("'prompt' must be one prompt (a string or a list of token ids); "
                       "batches of prompts are not supported", param="prompt")
    raise ApiError("'prompt' is required: a string or a list of token ids", param="prompt")


def render_chat(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """The tokenizer's chat template, or a plain `<|role|>\\ncontent\\n` template without one."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
    text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"
    return encode_text(tokenizer, text, "messages")


def chat_prompt(body: dict[str, Any], tokenizer: Any, vocab_size: int) -> list[int]:
    if body.get("prompt_token_ids") is not None:
        ids = body["prompt_token_ids"]
        if not isinstance(ids, list):
            raise ApiError("'prompt_token_ids' must be a list of token ids", param="prompt_token_ids")
        return token_prompt(ids, vocab_size, "prompt_token_ids")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list", param="messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"'messages[{i}]' must be an object with a 'role'", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise ApiError(f"'messages[{i}].content' must be a string", param="messages")
        clean.append({"role": m["role"], "content": content})
    if tokenizer is None:
        raise ApiError("this model has no tokenizer: pass the prompt as 'prompt_token_ids' "
                       "(e.g. extra_body={'prompt_token_ids': [...]})", param="messages")
    return render_chat(tokenizer, clean)


def parse_request(body: Any, *, chat: bool, served: str, tokenizer: Any, vocab_size: int,
                  max_model_len: int) -> ParsedRequest:
    """Validate a completion (`chat=False`) or chat request body; ApiError 400 if bad."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    check_model(body, served)
    for name, neutral in _NEUTRAL.items():
        if body.get(name, neutral) not in (neutral, None):
            raise ApiError(f"'{name}' = {body[name]!r} is not supported by this server "
                           f"(only {neutral!r})", param=name)
    prompt = chat_prompt(body, tokenizer, vocab_size) if chat else completion_prompt(
        body, tokenizer, vocab_size)
    room = max_model_len - len(prompt)
    if room < 1:
        raise ApiError(f"the prompt has {len(prompt)} tokens; this model's context is "
                       f"{max_model_len} tokens", param="prompt", code="context_length_exceeded")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _num(body, key, int, room if chat else 16)
    if len(prompt) + max_tokens > max_model_len:
        raise ApiError(f"prompt ({len(prompt)} tokens) + {key} ({max_tokens}) exceeds this "
                       f"model's context of {max_model_len} tokens", param=key,
                       code="context_length_exceeded")
    top_k = _num(body, "top_k", int, 0)
    stop = body.get("stop")
    stop_strings = [stop] if isinstance(stop, str) else list(stop or [])
    if not all(isinstance(s, str) and s for s in stop_strings):
        raise ApiError("'stop' must be a string or a list of non-empty strings", param="stop")
    if stop_strings and tokenizer is None:
        raise ApiError("'stop' strings need a tokenizer; use 'stop_token_ids'", param="stop")
    options = {
        "temperature": _num(body, "temperature", float, 1.0),
        "top_p": _num(body, "top_p", float, 1.0),
        "top_k": 0 if top_k == -1 else top_k,  # vLLM uses -1 for "off"
        "max_tokens": max_tokens,
        "min_tokens": _num(body, "min_tokens", int, 0),
        "seed": _num(body, "seed", int, None),
        "ignore_eos": bool(body.get("ignore_eos", False)),
        "stop_token_ids": body.get("stop_token_ids") or [],
    }
    try:
        SamplingParams.from_dict(options, "request")
    except ValueError as exc:
        raise ApiError(str(exc).removeprefix("request: ")) from None
    so = body.get("stream_options") or {}
    return ParsedRequest(prompt, {**options, "stop_token_ids": list(options["stop_token_ids"])},
                         bool(body.get("stream", False)),
                         bool(isinstance(so, dict) and so.get("include_usage")), stop_strings)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def engine_stats(num_preemptions: int | None, queueing_s: float | None = None) -> dict[str, Any]:
    """kvpd's extension field of a response or of its finishing chunk (clients that do not
    know it ignore it): how often the engine preempted the request and how long (s) it
    waited from the server's receipt to the first step of the worker that ran its prompt
    (each left out when not known)."""
    ext: dict[str, Any] = {}
    if num_preemptions is not None:
        ext["num_preemptions"] = int(num_preemptions)
    if queueing_s is not None:
        ext["queueing_s"] = float(queueing_s)
    return {"kvpd": ext} if ext else {}


def completion_body(rid: str, model: str, text: str, token_ids: list[int], finish: str | None,
                    prompt_tokens: int, chat: bool, num_preemptions: int | None = None,
                    queueing_s: float | None = None) -> dict[str, Any]:
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish, "token_ids": token_ids}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                  "token_ids": token_ids}
    return {"id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(prompt_tokens, len(token_ids)), **engine_stats(num_preemptions, queueing_s)}


def chunk_body(rid: str, model: str, text: str | None, token_ids: list[int],
               finish: str | None, chat: bool, role: bool = False,
               num_preemptions: int | None = None, queueing_s: float | None = None) -> dict[str, Any]:
    if chat:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                  "token_ids": token_ids}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish,
                  "token_ids": token_ids}
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            **engine_stats(num_preemptions, queueing_s)}


class Detokenizer:
    """Incremental text of a growing token list; with `stop_strings`, where to cut."""

    def __init__(self, tokenizer: Any, stop_strings: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.ids: list[int] = []
        self.text = ""
        self.stopped = False

    def add(self, ids: list[int]) -> str:
        """The new text for `ids` (empty without a tokenizer); sets `stopped` at a stop string."""
        if self.tokenizer is None or self.stopped:
            return ""
        self.ids.extend(ids)
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if full.endswith("\ufffd"):  # an unfinished multi-byte character: wait for more
            return ""
        for s in self.stop_strings:
            at = full.find(s, max(0, len(self.text) - len(s)))
            if at >= 0:
                full, self.stopped = full[:at], True
                break
        new = full[len(self.text):]
        self.text = full
        return new
