"""OpenAI request validation for `realexec.serving.http.server`: strict pydantic models of the
completion and chat bodies, turned into a `ParsedRequest` or an `ApiError` (400, OpenAI's error
shape, naming the `param`).

Types are strict (`"stream": "no"` or `"ignore_eos": "false"` is a 400, not a truthy string),
numbers finite and in range, a seed in 0..2^64-1. Prompts are token ids (`prompt: [int, ...]`,
or `prompt_token_ids` in a chat body, e.g. via the `openai` client's `extra_body`) or, when a
tokenizer is loaded, text. A completion's `prompt` may be a batch (a list of strings or of
token-id lists): prompt i's `n` choices are `choices[i*n .. i*n + n-1]`, as OpenAI's.
Extensions beyond OpenAI's fields (vLLM's names): `top_k`, `min_p`, `min_tokens`,
`ignore_eos`, `stop_token_ids`, `prompt_token_ids`, `repetition_penalty`, `prompt_logprobs`
(each prompt token's log-probability, rank and the k most likely at its position, in vLLM's
shape: on each completion choice, at the top of a chat response; not with `stream`). `echo`
(completions) returns each prompt before its completion, with its tokens' logprobs when
`logprobs` is set (the first token has none), as lm-eval's loglikelihood requests use it;
with `max_tokens: 0` only the prompt is answered (scored), as OpenAI's legacy API and vLLM.
Unknown fields are ignored, as OpenAI and vLLM do; fields OpenAI defines that this server
does not implement are accepted only at their neutral value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from realexec.engine.tokenizer import chat_token_ids
from simulator.core.request import LOGIT_BIAS_MAX, SamplingParams

SEED_MAX = 2**64 - 1  # seeds are unsigned 64-bit, as torch.Generator.manual_seed takes them
# vLLM's default max_logprobs, and OpenAI's largest top_logprobs
MAX_LOGPROBS = 20
# OpenAI's largest `n`
MAX_N = 128


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


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class _Common(_Strict):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=0)  # 0 only with echo (checked in parse_request)
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1)  # -1 or 0: off (vLLM uses -1)
    min_tokens: int = Field(0, ge=0)
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    n: int = Field(1, ge=1, le=MAX_N)
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    # OpenAI fields accepted only at their neutral value (checked in `_neutral`)
    presence_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None
    min_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = None
    tools: Any = None
    tool_choice: Any = None
    response_format: Any = None


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool | None = None
    suffix: str | None = None


class ChatMessage(_Strict):
    role: str
    content: str | list[dict[str, Any]]


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] | None = None
    prompt_token_ids: list[int] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


_NEUTRAL = {"best_of": 1, "tools": None, "tool_choice": None, "response_format": None,
            "suffix": None}


@dataclass
class ParsedRequest:
    """A validated completion / chat request, ready for the engine."""

    prompts: list[list[int]]  # token ids; a completion batch has several, a chat body one
    sampling: dict[str, Any]  # one choice's engine sampling options (n = 1)
    stream: bool
    include_usage: bool
    stop_strings: list[str]
    n: int = 1
    logprobs: int | None = None  # top logprobs per token (None: no logprobs asked for)
    # completions' `echo`: each choice's text (and logprobs) starts with its prompt's; the
    # prompt as text: the string sent, else None (then decoded from its ids)
    echo: bool = False
    prompt_texts: list[str | None] | None = None
    # `max_tokens: 0` with echo: the prompt alone is answered (its logprobs scored); the
    # token the engine makes is left out
    prompt_only: bool = False
    prompt_logprobs: int | None = None  # vLLM's field: top logprobs per prompt token

    @property
    def num_choices(self) -> int:
        """Choices in the response: `n` per prompt; choice k answers prompt k // n."""
        return len(self.prompts) * self.n

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def error_from(exc: ValidationError) -> ApiError:
    """The first validation error as a 400 naming its field (`param`)."""
    e = exc.errors(include_url=False)[0]
    loc = [x for x in e["loc"] if not (isinstance(x, str) and ("[" in x or x in (
        "str", "int", "float", "bool", "none")))]
    param = str(loc[0]) if loc else None
    path = "".join(f"[{x}]" if isinstance(x, int) else (f".{x}" if i else str(x))
                   for i, x in enumerate(loc)) or "the request body"
    kind, ctx, got = e["type"], e.get("ctx") or {}, _show(e.get("input"))
    if kind == "json_invalid":
        return ApiError(f"the request body is not valid JSON ({ctx.get('error', e['msg'])})")
    if kind in ("model_type", "dict_type") and not loc:
        return ApiError("the request body must be a JSON object")
    if param == "prompt" and len(loc) == 1 and kind != "missing":
        return ApiError("'prompt' must be a string or a list of token ids", param=param)
    messages = {
        "missing": f"'{path}' is required",
        "int_type": f"{path} must be an integer, got {got}",
        "float_type": f"{path} must be a number, got {got}",
        "finite_number": f"{path} must be a finite number, got {got}",
        "bool_type": f"{path} must be true or false, got {got}",
        "string_type": f"{path} must be a string, got {got}",
        "list_type": f"{path} must be a list, got {got}",
        "greater_than_equal": f"{path} must be >= {ctx.get('ge')}, got {got}",
        "greater_than": f"{path} must be > {ctx.get('gt')}, got {got}",
        "less_than_equal": f"{path} must be <= {ctx.get('le')}, got {got}",
    }
    return ApiError(messages.get(kind, f"{path}: {e['msg']} (got {got})"), param=param)


def check_model(model: str, served: str) -> None:
    if model != served:
        raise ApiError(f"The model '{model}' does not exist; this server serves '{served}'",
                       param="model", code="model_not_found")


def token_prompt(value: list[int], vocab_size: int, param: str) -> list[int]:
    """`value` checked as a prompt of token ids; `param` names it (`prompt[2]` in a batch)."""
    field = param.partition("[")[0]
    if not value:
        raise ApiError(f"'{param}' is empty; give at least one token", param=field)
    for i, t in enumerate(value):
        if not 0 <= t < vocab_size:
            raise ApiError(f"'{param}[{i}]' = {t!r} is not a token id in [0, {vocab_size})",
                           param=field)
    return value


def encode_text(tokenizer: Any, text: str, param: str) -> list[int]:
    field = param.partition("[")[0]
    if tokenizer is None:
        raise ApiError(f"'{param}' is text but this model has no tokenizer; send token ids "
                       "(a list of integers)", param=field)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise ApiError(f"'{param}' encodes to no tokens", param=field)
    return list(ids)


def _prompt_items(prompt: str | list[Any]) -> list[tuple[str, str | list[int]]]:
    """A completion body's prompt as (param name, one prompt) pairs: one (a string or a list
    of token ids, named `prompt`) or a batch (a list of strings or of token-id lists, named
    `prompt[i]`)."""
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return [("prompt", prompt)]
    return [(f"prompt[{i}]", p) for i, p in enumerate(prompt)]


def completion_prompts(req: CompletionRequest, tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """A completion body's prompts as token ids, each answered with its own `n` choices, as
    OpenAI's."""
    return [encode_text(tokenizer, p, name) if isinstance(p, str)
            else token_prompt(p, vocab_size, name) for name, p in _prompt_items(req.prompt)]


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The conversation through the tokenizer's chat template (`chat_token_ids`)."""
    ids = chat_token_ids(tokenizer, messages)
    if not ids:
        raise ApiError("'messages' encode to no tokens", param="messages")
    return ids


def chat_prompt(req: ChatCompletionRequest, tokenizer: Any, vocab_size: int) -> list[int]:
    if req.prompt_token_ids is not None:
        return token_prompt(req.prompt_token_ids, vocab_size, "prompt_token_ids")
    if not req.messages:
        raise ApiError("'messages' must be a non-empty list", param="messages")
    clean = []
    for m in req.messages:
        content = m.content
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(str(p.get("text", "")) for p in content)
        clean.append({"role": m.role, "content": content})
    if tokenizer is None:
        raise ApiError("this model has no tokenizer: pass the prompt as 'prompt_token_ids' "
                       "(e.g. extra_body={'prompt_token_ids': [...]})", param="messages")
    return token_prompt(render_chat(tokenizer, clean), vocab_size, "messages")


def _check_context(prompts: list[list[int]], asked: int | None, key: str, max_model_len: int,
                   default: int | None) -> int:
    """The tokens each choice may make (`asked`, else `default`, else the room the prompt
    leaves); a 400 (`context_length_exceeded`) if a prompt and its output do not fit."""
    max_tokens = 0
    for i, prompt in enumerate(prompts):
        name = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        room = max_model_len - len(prompt)
        if room < 1:
            which = "the prompt" if len(prompts) == 1 else name
            raise ApiError(f"{which} has {len(prompt)} tokens; this model's context is "
                           f"{max_model_len} tokens", param="prompt",
                           code="context_length_exceeded")
        max_tokens = asked if asked is not None else (room if default is None else default)
        if len(prompt) + max_tokens > max_model_len:
            raise ApiError(f"{name} ({len(prompt)} tokens) + {key} ({max_tokens}) exceeds "
                           f"this model's context of {max_model_len} tokens", param=key,
                           code="context_length_exceeded")
    return max_tokens


def _neutral(req: _Common) -> None:
    for name, neutral in _NEUTRAL.items():
        value = getattr(req, name, None)
        if value not in (neutral, None):
            raise ApiError(f"'{name}' = {_show(value)} is not supported by this server "
                           f"(only {neutral!r})", param=name)


def parse_request(raw: bytes, *, chat: bool, served: str, tokenizer: Any, vocab_size: int,
                  max_model_len: int) -> ParsedRequest:
    """Validate a completion (`chat=False`) or chat request body (raw JSON bytes); ApiError
    400 naming the field if bad. CPU-bound: the server runs it off its event loop."""
    model = ChatCompletionRequest if chat else CompletionRequest
    try:
        req = model.model_validate_json(raw)
    except ValidationError as exc:
        raise error_from(exc) from None
    check_model(req.model, served)
    _neutral(req)
    if chat:
        prompts = [chat_prompt(req, tokenizer, vocab_size)]
        if req.top_logprobs is not None and not req.logprobs:
            raise ApiError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
    else:
        prompts = completion_prompts(req, tokenizer, vocab_size)
        logprobs = req.logprobs
    key = "max_completion_tokens" if chat and req.max_completion_tokens is not None else "max_tokens"
    asked = getattr(req, key)
    echo = not chat and bool(req.echo)
    if asked == 0:
        if not echo:
            raise ApiError(f"{key} must be >= 1 (0 only with echo, to score the prompt), got 0",
                           param=key)
        asked = 1  # the engine makes one token; the response leaves it out
    max_tokens = _check_context(prompts, asked, key, max_model_len, default=None if chat else 16)
    stop_strings = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if not all(stop_strings):
        raise ApiError("'stop' must be a string or a list of non-empty strings", param="stop")
    if stop_strings and tokenizer is None:
        raise ApiError("'stop' strings need a tokenizer; use 'stop_token_ids'", param="stop")
    stop_ids = req.stop_token_ids or []
    for i, t in enumerate(stop_ids):
        if not 0 <= t < vocab_size:
            raise ApiError(f"'stop_token_ids[{i}]' = {t} is not a token id in [0, {vocab_size})",
                           param="stop_token_ids")
    if req.min_tokens > max_tokens:
        raise ApiError(f"min_tokens ({req.min_tokens}) must be <= {key} ({max_tokens})",
                       param="min_tokens")
    options = {
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        # vLLM reads top_k >= the vocabulary as off; so here (a top_k past 2^64 could not
        # even be sent to the engine)
        "top_k": 0 if req.top_k in (None, -1) or req.top_k >= vocab_size else req.top_k,
        "max_tokens": max_tokens, "min_tokens": req.min_tokens, "seed": req.seed,
        "ignore_eos": req.ignore_eos, "stop_token_ids": list(stop_ids), "logprobs": logprobs,
        "presence_penalty": req.presence_penalty or 0.0,
        "frequency_penalty": req.frequency_penalty or 0.0,
        "repetition_penalty": 1.0 if req.repetition_penalty is None else req.repetition_penalty,
        "min_p": req.min_p or 0.0, "logit_bias": _logit_bias(req.logit_bias or {}, vocab_size),
    }
    try:
        SamplingParams.from_dict(options, "request")  # the ranges above cover its checks
    except ValueError as exc:
        raise ApiError(str(exc).removeprefix("request: ")) from None
    if req.prompt_logprobs is not None and req.stream:
        raise ApiError("'prompt_logprobs' is not available with 'stream': true",
                       param="prompt_logprobs")
    wanted = [k for k in (logprobs if echo else None, req.prompt_logprobs) if k is not None]
    if wanted:  # the echoed prompt's logprobs, vLLM's prompt_logprobs: the engine's, once
        options["prompt_logprobs"] = max(wanted)
    texts = [p if isinstance(p, str) else None for _, p in _prompt_items(req.prompt)] if echo \
        else None  # echo is a completions field
    so = req.stream_options
    return ParsedRequest(prompts, options, req.stream, bool(so and so.include_usage), stop_strings,
                         req.n, logprobs, echo, texts,
                         echo and req.max_tokens == 0, req.prompt_logprobs)


def _logit_bias(bias: dict[str, float], vocab_size: int) -> list[list[float]]:
    """OpenAI's `logit_bias` ({"token id": bias}) as [id, bias] pairs for the engine."""
    pairs = []
    for key, value in bias.items():
        if not (key.isdigit() and int(key) < vocab_size):
            raise ApiError(f"'logit_bias' key {_show(key)} is not a token id in [0, {vocab_size})",
                           param="logit_bias")
        if not (math.isfinite(value) and abs(value) <= LOGIT_BIAS_MAX):
            raise ApiError(f"logit_bias[{key!r}] must be a number in [-100, 100], got {value!r}",
                           param="logit_bias")
        pairs.append([int(key), value])
    return pairs


def child_sampling(parsed: ParsedRequest, index: int) -> dict[str, Any]:
    """Choice `index`'s options of an `n` > 1 request: the same, with seed + index (mod 2^64)
    when a seed is given, as vLLM v1's parallel sampling does."""
    s = dict(parsed.sampling)
    if s.get("seed") is not None:
        s["seed"] = (s["seed"] + index) % (SEED_MAX + 1)
    return s
