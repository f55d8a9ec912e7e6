"""OpenAI response shapes for `realexec.serving.http.server`: whole responses, stream chunks,
usage and logprobs (completions' and chat's shapes)."""

from __future__ import annotations

import time
from typing import Any

# vLLM's stand-in for a -inf logprob (JSON has no infinity)
LOGPROB_FLOOR = -9999.0


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


def token_text(tokenizer: Any, token_id: int) -> str:
    """A token as text: its decoded string, or vLLM's `token_id:N` without a tokenizer."""
    if tokenizer is None:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id])


def _lp(value: float) -> float:
    return max(float(value), LOGPROB_FLOOR)


def logprobs_body(tokenizer: Any, token_ids: list[int], entries: list[list[Any]], chat: bool,
                  text_offset: int = 0) -> dict[str, Any]:
    """`choices[i].logprobs` for `token_ids` (entries: [logprob, top ids, top logprobs]):
    chat's `{"content": [...]}` or completions' `{"tokens", "token_logprobs", ...}`."""
    if chat:
        content = []
        for tok, (lp, ids, vals, *_) in zip(token_ids, entries):
            s = token_text(tokenizer, tok)
            top = [{"token": (t := token_text(tokenizer, i)), "logprob": _lp(v),
                    "bytes": list(t.encode())} for i, v in zip(ids, vals)]
            content.append({"token": s, "logprob": _lp(lp), "bytes": list(s.encode()),
                            "top_logprobs": top})
        return {"content": content}
    tokens, lps, tops, offsets = [], [], [], []
    at = text_offset
    for tok, (lp, ids, vals, *_) in zip(token_ids, entries):
        s = token_text(tokenizer, tok)
        tokens.append(s)
        lps.append(_lp(lp))
        tops.append({token_text(tokenizer, i): _lp(v) for i, v in zip(ids, vals)})
        offsets.append(at)
        at += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def prompt_logprobs_body(tokenizer: Any, prompt_ids: list[int], entries: list[list[Any]],
                         k: int) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs` of a prompt: None for its first token, then per token
    {"token id": {"logprob", "rank", "decoded_token"}} for it and its position's `k` most
    likely tokens (`entries`: the engine's, one per token after the first)."""
    out: list[dict[str, dict[str, Any]] | None] = [None]
    for tok, (lp, ids, vals, rank) in zip(prompt_ids[1:], entries):
        pos = {str(tok): {"logprob": _lp(lp), "rank": int(rank),
                          "decoded_token": token_text(tokenizer, tok)}}
        for r, (i, v) in enumerate(zip(ids[:k], vals[:k]), start=1):
            pos.setdefault(str(i), {"logprob": _lp(v), "rank": r,
                                    "decoded_token": token_text(tokenizer, i)})
        out.append(pos)
    return out


def echo_text(tokenizer: Any, prompt_ids: list[int], text: str | None) -> str:
    """An echoed prompt: the string sent, else its ids decoded ("" without a tokenizer, as
    every text is then)."""
    if text is not None:
        return text
    return "" if tokenizer is None else tokenizer.decode(prompt_ids)


def echo_logprobs(tokenizer: Any, prompt_ids: list[int], entries: list[list[Any]],
                  then: tuple[list[int], list[list[Any]]] | None = None) -> dict[str, Any]:
    """Completions' logprobs of an echoed prompt (`entries`: one per prompt token after the
    first, which has none: nothing precedes it), followed by those of the output tokens
    `then` = (token ids, entries)."""
    first = token_text(tokenizer, prompt_ids[0])
    rest = logprobs_body(tokenizer, prompt_ids[1:], entries, False, len(first))
    body = {"tokens": [first, *rest["tokens"]],
            "token_logprobs": [None, *rest["token_logprobs"]],
            "top_logprobs": [None, *rest["top_logprobs"]], "text_offset": [0, *rest["text_offset"]]}
    if then is not None:
        end = body["text_offset"][-1] + len(body["tokens"][-1])
        more = logprobs_body(tokenizer, then[0], then[1], False, end)
        body = {k: v + more[k] for k, v in body.items()}
    return body


def choice_body(index: int, text: str, token_ids: list[int], finish: str | None, chat: bool,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    if chat:
        return {"index": index, "message": {"role": "assistant", "content": text},
                "logprobs": logprobs, "finish_reason": finish, "token_ids": token_ids}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
            "token_ids": token_ids}


def completion_body(rid: str, model: str, choices: list[dict[str, Any]], prompt_tokens: int,
                    chat: bool, num_preemptions: int | None = None,
                    queueing_s: float | None = None) -> dict[str, Any]:
    n_out = sum(len(c["token_ids"]) for c in choices)
    return {"id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": usage(prompt_tokens, n_out), **engine_stats(num_preemptions, queueing_s)}


def chunk_body(rid: str, model: str, text: str | None, token_ids: list[int],
               finish: str | None, chat: bool, role: bool = False,
               num_preemptions: int | None = None, queueing_s: float | None = None,
               index: int = 0, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    if chat:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
                  "token_ids": token_ids}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs,
                  "finish_reason": finish, "token_ids": token_ids}
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            **engine_stats(num_preemptions, queueing_s)}
