"""`Request`, its status and its sampling parameters: the one object both backends share.

Times are seconds on the driving backend's clock (simulated time or wall time
since the engine started). Every metric is derived from the timestamps kept here.
"""

from __future__ import annotations

import enum
import math
import numbers
import operator
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any


class RequestStatus(enum.IntEnum):
    """Ordered status; every value from FINISHED_STOPPED on is final."""

    WAITING = 0
    WAITING_FOR_REMOTE_KV = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH = 5
    FINISHED_ABORTED = 6
    FINISHED_REJECTED = 7

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


def penalties_on(presence_penalty: float, frequency_penalty: float,
                 repetition_penalty: float) -> bool:
    """Whether any of the three penalties changes the logits (presence or frequency not 0,
    repetition not 1): the one rule `SamplingParams` and the executor's sampler share."""
    return presence_penalty != 0.0 or frequency_penalty != 0.0 or repetition_penalty != 1.0


SEED_MAX = 2**64 - 1  # seeds are unsigned 64-bit, as torch.Generator.manual_seed takes them


def _is_int(v: Any) -> bool:
    """An integer: int, or any integer type that says so (`__index__`: numpy, 0-d tensors)."""
    if type(v) is int:
        return True
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        return False
    try:
        operator.index(v)
    except TypeError:  # e.g. a float tensor defines __index__ but refuses it
        return False
    return True


def _is_real(v: Any) -> bool:
    return type(v) is float or type(v) is int or (isinstance(v, numbers.Real)
                                                   and not isinstance(v, bool))


_INT_OPTIONS = ("top_k", "n", "max_tokens", "min_tokens", "seed", "logprobs", "prompt_logprobs")
_REAL_OPTIONS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")
LOGIT_BIAS_MAX = 100.0  # OpenAI's range for a logit bias: [-100, 100]


def _typed(name: str, v: Any, where: str = "sampling_params") -> Any:
    """Option `name`'s value as int (an integer option; None stays None) or float (a number
    option); ValueError naming the field when it is not one."""
    if name in _REAL_OPTIONS:
        if not (_is_real(v) and math.isfinite(v)):
            raise ValueError(f"{where}.{name} must be a finite number, got {v!r}")
        return float(v)
    if v is None:
        return None
    if not _is_int(v):
        raise ValueError(f"{where}.{name} must be an integer, got {v!r}")
    return operator.index(v)


def _typed_options(options: dict[str, Any]) -> dict[str, Any]:
    """`options` with integers as int and numbers as float (`_typed`). Done before
    construction because the compiled core (mypyc) checks field types itself (a TypeError
    without the field, and numpy integers refused), so both builds take and refuse the same
    options."""
    return {k: _typed(k, v) if k in _INT_OPTIONS or k in _REAL_OPTIONS else v
            for k, v in options.items()}


def _bias_pairs(raw: Any) -> tuple[tuple[int, float], ...]:
    """`logit_bias` as sorted (token id, bias) pairs; ValueError naming what is wrong."""
    pairs = raw.items() if isinstance(raw, Mapping) else raw
    if isinstance(pairs, str | bytes) or not hasattr(pairs, "__iter__"):
        raise ValueError(f"sampling_params.logit_bias must map token ids to biases, got {raw!r}")
    out: dict[int, float] = {}
    for pair in pairs:
        if isinstance(pair, str | bytes) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise ValueError(f"sampling_params.logit_bias: {pair!r} is not a (token id, bias) pair")
        token, bias = pair
        if not _is_int(token) or operator.index(token) < 0:
            raise ValueError(f"sampling_params.logit_bias: {token!r} is not a token id (an "
                             f"integer >= 0)")
        if not (_is_real(bias) and math.isfinite(bias) and abs(bias) <= LOGIT_BIAS_MAX):
            raise ValueError(f"sampling_params.logit_bias[{token}] must be a number in "
                             f"[-100, 100], got {bias!r}")
        out[operator.index(token)] = float(bias)
    return tuple(sorted(out.items()))


FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_REJECTED: "rejected",
}


@dataclass(frozen=True)
class SamplingParams:
    """Sampling options (names and defaults follow vLLM).

    temperature 0 means greedy; top_k 0 means off; top_p 1.0 means off.
    `n` > 1 forks n-1 children that share the prompt's KV blocks.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    n: int = 1
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: Sequence[int] = ()  # kept as a tuple of ints (__post_init__)
    # text that ends generation when it appears in the output (vLLM's `stop`; the text is cut
    # before it). Only an engine with a tokenizer reads it (realexec.LLM); the core does not.
    stop: Sequence[str] = ()  # kept as a tuple of non-empty strings
    ignore_eos: bool = False
    # log-probabilities to return per output token: None = none; k >= 0 = the sampled token's
    # and the k most likely tokens' (vLLM's `logprobs`: of the raw model output, before
    # temperature, top-k/top-p or min_tokens change it)
    logprobs: int | None = None
    # the same for every prompt token after the first (vLLM's `prompt_logprobs`): the token's
    # log-probability given the tokens before it, and the k most likely ones. Such a request
    # takes no prefix-cache hits (a cached block's logits were never computed), as in vLLM.
    prompt_logprobs: int | None = None
    # penalties on the logits before temperature (vLLM's and OpenAI's): presence subtracts
    # this once from every token already in the output, frequency this times its count there;
    # repetition divides positive logits (multiplies negative ones) of every token in the
    # prompt or output (HF's and vLLM's). 0, 0 and 1 are off.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # after temperature, drop tokens less likely than min_p x the most likely one's (vLLM's
    # and transformers' min-p); 0 is off
    min_p: float = 0.0
    # added to these tokens' logits before penalties and sampling (OpenAI's `logit_bias`, each
    # in [-100, 100]): a {token id: bias} mapping or (id, bias) pairs, kept as sorted pairs
    logit_bias: Mapping[int, float] | Sequence[tuple[int, float]] = ()

    def __post_init__(self) -> None:
        raw: Any = self.stop_token_ids  # Any: the compiled core would unbox its items as int
        if isinstance(raw, str | bytes) or not hasattr(raw, "__iter__"):
            raise ValueError(f"sampling_params.stop_token_ids must be a list of token ids, got "
                             f"{raw!r}")
        ids: tuple[Any, ...] = tuple(raw)
        for t in ids:
            if not _is_int(t) or operator.index(t) < 0:
                raise ValueError(f"sampling_params.stop_token_ids: {t!r} is not a token id "
                                 f"(an integer >= 0)")
        object.__setattr__(self, "stop_token_ids", tuple(operator.index(t) for t in ids))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        stop: Any = self.stop
        stops = (stop,) if isinstance(stop, str) else stop
        if not hasattr(stops, "__iter__") or not all(isinstance(x, str) and x for x in stops):
            raise ValueError(f"sampling_params.stop must be a string or a list of non-empty "
                             f"strings, got {stop!r}")
        object.__setattr__(self, "stop", tuple(stops))
        # vLLM's spellings of "off": top_k -1 (as 0) and seed -1 (as no seed)
        if _is_int(self.top_k) and self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        if _is_int(self.seed) and self.seed == -1:
            object.__setattr__(self, "seed", None)
        self.validate()

    def validate(self, where: str = "sampling_params") -> None:
        """Raise ValueError naming the field and its allowed range."""
        for name in (*_INT_OPTIONS, *_REAL_OPTIONS):  # types (set directly, not by from_dict)
            _typed(name, getattr(self, name), where)
        if self.seed is not None and not 0 <= self.seed <= SEED_MAX:
            raise ValueError(f"{where}.seed must be None (or -1) or an integer in 0..2^64-1, "
                             f"got {self.seed!r}")
        if not self.temperature >= 0.0:
            raise ValueError(f"{where}.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"{where}.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"{where}.top_k must be >= 0 (0 or -1 = off), got {self.top_k}")
        if self.n < 1:
            raise ValueError(f"{where}.n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"{where}.max_tokens must be >= 1, got {self.max_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{where}.{name} must be None or >= 0, got {getattr(self, name)}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{where}.{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"{where}.min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"{where}.repetition_penalty must be > 0 (1 = off), got "
                             f"{self.repetition_penalty}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"{where}.min_tokens must be in [0, max_tokens={self.max_tokens}], "
                f"got {self.min_tokens}"
            )

    @classmethod
    def from_dict(cls, options: dict[str, Any], where: str = "sampling_params") -> SamplingParams:
        """Build from a plain dict; an unknown option is a ValueError that lists the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"{where}: unknown sampling option(s) {unknown}; known: {sorted(known)}"
            )
        try:
            return cls(**_typed_options(options))
        except ValueError as exc:  # messages already name "sampling_params.<field>"
            raise ValueError(str(exc).replace("sampling_params", where, 1)) from exc
        except TypeError as exc:
            raise ValueError(f"{where}: {exc}") from exc

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any penalty is on (the sampler then needs the request's tokens)."""
        return penalties_on(self.presence_penalty, self.frequency_penalty,
                            self.repetition_penalty)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as its constructor's arguments: a frozen instance cannot have its fields
        set one by one, which is how the compiled core's objects are otherwise restored
        (`simulator.multiproc` ships kept requests between processes)."""
        return (SamplingParams, tuple(getattr(self, f.name) for f in fields(self)))


@dataclass(eq=False)
class Request:
    """One inference request.

    The prompt is either token ids, or only a length (`num_prompt_tokens`) with
    optional content hashes per `hash_block_size`-token block, as traces give them.
    """

    request_id: str
    prompt_token_ids: list[int] | None = None
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0  # s
    num_prompt_tokens: int = -1  # set from prompt_token_ids when given
    prompt_hash_ids: list[int] | None = None  # content hashes of the prompt's trace blocks
    hash_block_size: int = 0  # tokens per entry of prompt_hash_ids
    eos_token_id: int | None = None
    priority: int = 0  # lower is served first under the priority policy
    parent_request_id: str | None = None  # set on n > 1 children

    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None  # "stop", "length", "abort", "rejected"
    stop_reason: str | None = None  # human-readable detail (why rejected / aborted)
    num_computed_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    num_output_tokens: int = 0  # also counted when the backend gives no token ids
    # timestamps (s)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: array = field(default_factory=lambda: array("d"))  # one per output token
    # counters
    num_preemptions: int = 0
    num_cached_tokens: int = -1  # prompt tokens served from the prefix cache (-1: not yet)
    # with sampling_params.logprobs set, one (sampled token's logprob, top ids, top logprobs)
    # per output token this engine sampled (the real executor fills it; None otherwise)
    logprobs: list[tuple[float, list[int], list[float]]] | None = None
    # with sampling_params.prompt_logprobs set, the same for prompt tokens 1 .. P-1 (entry i
    # is token i+1's) and the token's rank (1: the most likely), filled by the real executor
    # as the prompt's chunks run
    prompt_logprobs: list[tuple[float, list[int], list[float], int] | None] | None = None
    # backend annotations (replica ids, KV transfer time, ...); never read by the core
    annotations: dict[str, Any] = field(default_factory=dict)
    # core-internal
    block_hashes: list[int] = field(default_factory=list, repr=False)
    block_hashes_block_size: int = field(default=0, repr=False)  # pool block size of block_hashes
    is_swapped: bool = field(default=False, repr=False)
    num_forked: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.prompt_token_ids is not None:
            n = len(self.prompt_token_ids)
            if self.num_prompt_tokens not in (-1, n):
                raise ValueError(
                    f"request {self.request_id}: num_prompt_tokens={self.num_prompt_tokens} "
                    f"disagrees with len(prompt_token_ids)={n}"
                )
            self.num_prompt_tokens = n
        if self.num_prompt_tokens < 1:
            raise ValueError(
                f"request {self.request_id}: the prompt must have at least 1 token, "
                f"got {max(self.num_prompt_tokens, 0)}"
            )
        if self.prompt_hash_ids is not None and self.hash_block_size <= 0:
            raise ValueError(
                f"request {self.request_id}: prompt_hash_ids need hash_block_size > 0"
            )

    # ---- derived ----
    @property
    def max_tokens(self) -> int:
        return self.sampling_params.max_tokens

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens so far."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED_STOPPED

    @property
    def has_token_ids(self) -> bool:
        return self.prompt_token_ids is not None

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        """Token ids at positions [start, end) over prompt + output."""
        prompt = self.prompt_token_ids
        if prompt is None:
            raise ValueError(f"request {self.request_id} has no token ids (length-only prompt)")
        p = self.num_prompt_tokens
        if end <= p:
            return prompt[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return prompt[start:] + self.output_token_ids[: end - p]

    # ---- transitions used by the scheduler ----
    def append_output_token(self, token_id: int | None, now: float) -> None:
        """Record one new output token produced at time `now` (s)."""
        if token_id is not None:
            self.output_token_ids.append(token_id)
        self.num_output_tokens += 1
        self.token_times.append(now)
        if self.first_token_time is None:
            self.first_token_time = now

    def finish(self, status: RequestStatus, now: float, reason: str | None = None) -> None:
        self.status = status
        self.finish_reason = FINISH_REASONS[status]
        if reason is not None:
            self.stop_reason = reason
        self.finish_time = now

    def check_stop(self, token_id: int | None) -> RequestStatus | None:
        """The finished status this request reaches after its newest token, if any."""
        if self.num_output_tokens >= self.sampling_params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if token_id is None or self.num_output_tokens < self.sampling_params.min_tokens:
            return None
        sp = self.sampling_params
        if (not sp.ignore_eos and token_id == self.eos_token_id) or token_id in sp.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        return None
