"""Records the front-end client hands out: `Delta` (a request's new tokens), `ClientRequest`
(all the client knows of one request, client-side timestamps), `WorkerState`, and errors."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq


class EngineDeadError(RuntimeError):
    """A worker needed by a request is down."""


class RequestFailed(RuntimeError):
    """A request ended with an error (its message says why)."""


# Why a request ended with an error (`Delta.error_kind`, `ClientRequest.error_kind`):
# "down": a worker it needed died or stalled; "rejected": the engine can never fit it;
# "shutdown": the server is stopping; "internal": anything else (a bad worker message, ...).
ERROR_KINDS = ("down", "rejected", "shutdown", "internal")


@dataclass
class Delta:
    """New output of one request: tokens received together, at client time `t` (perf_counter s)."""

    request_id: str
    token_ids: list[int]
    t: float
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    num_preemptions: int = 0  # on the finishing delta: times preempted, over all its workers
    # on the finishing delta: s from submission to the first step of the worker that ran its
    # prompt (None: not reported)
    queueing_s: float | None = None
    error_kind: str | None = None  # one of ERROR_KINDS when `error` is set
    # with logprobs asked for: [logprob, top ids, top logprobs] per token of `token_ids`
    logprobs: list[list[Any]] | None = None
    # on the delta with the first token, when prompt logprobs were asked for: the same per
    # prompt token after the first
    prompt_logprobs: list[list[Any]] | None = None


@dataclass
class ClientRequest:
    """What the client knows about one request; times are `time.perf_counter()` seconds."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: dict[str, Any]
    t_submit: float
    token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)  # engine step that made each token (NaN: n/a)
    finish_reason: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    error_kind: str | None = None
    num_cached_tokens: int = 0
    # when the first step of the worker that ran its prompt began, in this client's clock:
    # the client's receipt of the first tokens minus how long before that the worker says
    # the step began (a duration, so the clocks need not agree)
    first_scheduled: float | None = None
    num_preemptions: int = 0  # summed over the workers it ran on (reported when it left each)
    worker: str = ""  # the worker holding it now
    prefill_worker: str = ""
    decode_worker: str = ""
    kv: dict[str, Any] = field(default_factory=dict)
    logprobs: list[list[Any]] = field(default_factory=list)  # per output token, when asked for
    prompt_logprobs: list[list[Any]] | None = None  # per prompt token after the first
    sink: Callable[[Delta], None] | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def finished(self) -> bool:
        return self.done.is_set()


@dataclass
class WorkerState:
    name: str
    role: str
    proc: Any = None
    sock: zmq.Socket | None = None
    endpoints: dict[str, str] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    stats_at: float = 0.0  # perf_counter s when `stats` arrived
    ready: bool = False
    down: str | None = None  # why it is down
    last_seen: float = 0.0  # perf_counter s
    stalled: bool = False  # silent for longer than the heartbeat timeout (may come back)
    spec: Any = None  # the WorkerSpec it was started from (to restart it)
    restarts: int = 0  # times it was restarted after dying
    # counters of the worker's earlier lives (they restart at 0 with a new process)
    base_counters: dict[str, float] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.ready and self.down is None

    @property
    def serving(self) -> bool:
        """Up and not stalled: new requests may go to it."""
        return self.alive and not self.stalled
