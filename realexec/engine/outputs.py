"""What `LLM.generate` returns (names follow vLLM's `RequestOutput` / `CompletionOutput`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.core.request import Request


@dataclass
class CompletionOutput:
    """One generated sequence. Times are seconds on the engine clock (since `LLM` creation)."""

    index: int  # 0 for the parent, i for the i-th child of an n > 1 request
    request_id: str
    token_ids: list[int]
    finish_reason: str | None  # "stop", "length", "abort" or "rejected"
    stop_reason: str | None  # detail, e.g. why a request was rejected
    token_times: list[float]  # time each output token was produced (s)
    first_token_time: float | None
    finish_time: float | None
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    num_preemptions: int
    # with SamplingParams(logprobs=k): per output token, {token id: log-probability} of the
    # sampled token and the k most likely ones, of the raw model output (vLLM's
    # CompletionOutput.logprobs); None without
    logprobs: list[dict[int, float]] | None = None
    # the tokens as text (special tokens skipped, as vLLM) when the engine has a tokenizer;
    # cut before the stop string that ended it (its `stop_reason`)
    text: str | None = None

    @classmethod
    def from_request(cls, index: int, req: Request, tokenizer: Any = None) -> CompletionOutput:
        return cls(
            index=index,
            request_id=req.request_id,
            token_ids=list(req.output_token_ids),
            finish_reason=req.finish_reason,
            stop_reason=req.stop_reason,
            token_times=list(req.token_times),
            first_token_time=req.first_token_time,
            finish_time=req.finish_time,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            num_preemptions=req.num_preemptions,
            logprobs=None if req.logprobs is None else [
                {token: sampled, **dict(zip(top_ids, top_values))}
                for token, (sampled, top_ids, top_values)
                in zip(req.output_token_ids, req.logprobs)],
            text=_text(req, tokenizer),
        )


def _text(req: Request, tokenizer: Any) -> str | None:
    """The output as text: as a stop string cut it (`annotations["text"]`, set by the LLM),
    else decoded; None without a tokenizer."""
    if tokenizer is None:
        return None
    if "text" in req.annotations:
        return req.annotations["text"]
    return tokenizer.decode(req.output_token_ids, skip_special_tokens=True)


@dataclass
class RequestOutput:
    """The outputs of one prompt: `outputs[0]` is the parent, then the n-1 children."""

    request_id: str
    prompt_token_ids: list[int]
    arrival_time: float  # s, engine clock
    outputs: list[CompletionOutput]
    requests: list[Request] = field(repr=False)  # the core's Request objects, same order
    prompt: str | None = None  # the prompt as given, when it was text

    @property
    def finished(self) -> bool:
        return all(r.is_finished for r in self.requests)

    @property
    def prompt_logprobs(self) -> list[dict[int, float] | None] | None:
        """With SamplingParams(prompt_logprobs=k): None for the first prompt token, then per
        prompt token {token id: log-probability} of it and of the k most likely tokens at its
        position (vLLM's `RequestOutput.prompt_logprobs`); None without, or if the prompt
        never ran."""
        entries = self.requests[0].prompt_logprobs
        if entries is None:
            return None
        return [None] + [None if e is None else {tok: e[0], **dict(zip(e[1], e[2]))}
                         for tok, e in zip(self.prompt_token_ids[1:], entries)]

    # conveniences for n == 1
    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str | None:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def token_times(self) -> list[float]:
        return self.outputs[0].token_times
