"""Seconds of all-decode steps, the price the simulator asks for most.

An all-decode step's price is fixed by its token, request and decode counts (`DecodeTerms`,
memoised on the cost model) and by its summed decode contexts, which grow by the decode count
each step. A run of steps is priced element by element with the float operations of a single
step (`DecodeTerms.step`): vectorised with numpy in the interpreter (`DecodeTerms.steps`), and
as a loop of `step` when this module is compiled (`kvpd native build`), where the loop costs
less than numpy's per-call overhead on the ~20-step runs a simulation asks for. The two forms
give bit-identical seconds (tests/test_decode_steps.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import host_overhead_s

if TYPE_CHECKING:
    from simulator.cost.breakdown import CostModel

COMPILED = not __file__.endswith(".py")  # mypyc builds an extension module


@dataclass
class DecodeTerms:
    """What an all-decode step costs besides its contexts, fixed by its token, request and
    decode counts: `mb` micro-batches; per stage the seconds without the decode-attention term
    (`rests`) and that term's coefficients (`attn`: s per context token computed, s per KV
    token read, s per decode request); `host` s; `ov` = 1 - overlap; and the cost model's
    decode padding, sliding share and window (tokens), and sparse attention's indexer share."""

    num_decodes: int
    mb: int
    rests: list[float]
    attn: list[tuple[float, float, float]]
    host: float
    ov: float
    padding: float
    slide: float
    window: int
    index: float = 0.0  # sparse attention's indexer: a share of every (uncapped) context token
    scheduler: float = 0.0  # the engine scheduler's s this step (cluster.host_request_s x requests)
    scheduler_async: bool = False  # it runs beside the step: the longer of the two counts
    Rd: float = field(init=False)  # decodes per micro-batch

    def __post_init__(self) -> None:
        self.Rd = self.num_decodes / self.mb

    def step(self, D: float, pad: int, win: tuple[float, int] | None = None) -> float:
        """Seconds of a step whose decodes' contexts sum to `D` tokens, `pad` tokens short of
        all being the longest; `win`: (window-capped sum, longest context) for a model with
        sliding layers. One element of `steps`, with the same float operations."""
        padding = self.padding
        ctx = D + padding * pad if padding and pad > 0 else D
        full = ctx
        if win is not None:  # sliding layers read the window-capped contexts
            Dw, longest = win
            Dw = Dw + padding * (self.num_decodes * min(longest, self.window) - Dw)
            ctx = ctx + self.slide * (Dw - ctx)
        if self.index:
            ctx = ctx + self.index * full
        mb = self.mb
        if mb != 1:
            ctx = ctx / mb
        ov, Rd = self.ov, self.Rd
        total = longest_stage = 0.0
        for i, rest in enumerate(self.rests):
            ac, akv, aqd = self.attn[i]
            c = ctx * ac
            m = ctx * akv + Rd * aqd
            hi, lo = (c, m) if c > m else (m, c)
            t = rest + (hi + ov * lo if ov else hi)
            if i == 0:
                total = longest_stage = t
            else:
                total = total + t
                longest_stage = t if t > longest_stage else longest_stage
        if len(self.rests) > 1:
            total = total + (mb - 1) * longest_stage
        total = total + self.host
        if self.scheduler:  # as CostModel.with_scheduler_host
            if self.scheduler_async:
                return self.scheduler if self.scheduler > total else total
            return total + self.scheduler
        return total

    def steps(self, D: np.ndarray, pad: int,
              win: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """`step` elementwise over arrays of `D` and of `win`'s parts, vectorised."""
        padding = self.padding
        ctx = D + padding * pad if padding and pad > 0 else D
        full = ctx
        if win is not None:
            Dw, longest = win
            Dw = Dw + padding * (self.num_decodes * np.minimum(longest, self.window) - Dw)
            ctx = ctx + self.slide * (Dw - ctx)
        if self.index:
            ctx = ctx + self.index * full
        mb = self.mb
        if mb != 1:
            ctx = ctx / mb
        ov, Rd = self.ov, self.Rd
        times = []
        for rest, (ac, akv, aqd) in zip(self.rests, self.attn):
            c = ctx * ac
            m = ctx * akv + Rd * aqd
            hi = np.maximum(c, m)
            times.append(rest + (hi + ov * np.minimum(c, m) if ov else hi))
        total = longest_stage = times[0]
        for t in times[1:]:
            total = total + t
            longest_stage = np.maximum(longest_stage, t)
        if len(times) > 1:
            total = total + (mb - 1) * longest_stage
        total = total + self.host
        if self.scheduler:
            return (np.maximum(total, self.scheduler) if self.scheduler_async
                    else total + self.scheduler)
        return total


def decode_terms(cm: CostModel, shape: BatchShape) -> DecodeTerms:
    """The `DecodeTerms` of an all-decode `shape` (memoised on its token, request and decode
    counts)."""
    key = (shape.num_tokens, shape.num_reqs, shape.num_decode_reqs)
    terms = cm._decode_terms.get(key)
    if terms is None:
        T = shape.num_tokens
        mb = cm.num_microbatches(shape)
        R, Rd = shape.num_reqs / mb, shape.num_decode_reqs / mb
        fasts = [st["fast"] for st in cm._stages]
        rests = [cm._stage_time(f, T / mb, R, 0.0, 0.0, 0.0, Rd, 0.0) - Rd * f.aqd
                 for f in fasts]
        attn = [(float(f.dac), float(f.dakv), float(f.aqd)) for f in fasts]  # MLA: absorbed
        terms = DecodeTerms(shape.num_decode_reqs, mb, rests, attn, host_overhead_s(cm, shape),
                            1.0 - cm.params.overlap, cm._padding, cm._slide, cm._window,
                            cm._index_tokens, shape.num_reqs * cm.host_request_s,
                            cm.async_scheduling)
        cm._decode_terms[key] = terms
    return terms


def _check_decodes(shape: BatchShape) -> None:
    if shape.num_prefill_reqs:
        raise ValueError("an all-decode price needs an all-decode batch "
                         f"(this one has {shape.num_prefill_reqs} prefill requests)")


def decode_step_time(cm: CostModel, shape: BatchShape) -> float:
    """Seconds of one all-decode step (element 0 of `decode_run_list`; it may differ from
    `CostModel.step_time` in the last bits)."""
    _check_decodes(shape)
    if shape.num_tokens <= 0:
        return 0.0
    win = None
    if cm._slide and cm._windowed(shape):
        win = (float(shape.decode_window_tokens), shape.max_decode_context)
    return decode_terms(cm, shape).step(float(shape.decode_context_tokens), _pad(shape), win)


def decode_run_list(cm: CostModel, shape: BatchShape, num_steps: int,
                    extra_s: float = 0.0) -> list[float]:
    """Seconds (+ `extra_s` each, when not 0) of `num_steps` all-decode steps from `shape`,
    the contexts growing by one per decode per step: element j is `decode_step_time(
    shape.advanced(j))` (+ `extra_s`) bit for bit."""
    _check_decodes(shape)
    if num_steps <= 0 or shape.num_tokens <= 0:
        return [extra_s] * max(num_steps, 0)
    if not COMPILED:
        run = _numpy_run(cm, shape, num_steps)
        return (run + extra_s).tolist() if extra_s else run.tolist()
    return _loop_run(cm, shape, num_steps, extra_s)


def decode_run_times(cm: CostModel, shape: BatchShape, num_steps: int) -> np.ndarray:
    """`decode_run_list` as an array (checks `num_steps`)."""
    _check_decodes(shape)
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 0:
        raise ValueError(f"num_steps must be an integer >= 0, got {num_steps!r}")
    n = int(num_steps)
    if n == 0 or shape.num_tokens <= 0:
        return np.zeros(n)
    return _numpy_run(cm, shape, n) if not COMPILED else np.array(_loop_run(cm, shape, n, 0.0))


def _pad(shape: BatchShape) -> int:
    """Tokens the decodes' contexts fall short of all being the longest (constant over a run:
    every context grows by one per step)."""
    return shape.num_decode_reqs * shape.max_decode_context - shape.decode_context_tokens


def _numpy_run(cm: CostModel, shape: BatchShape, n: int) -> np.ndarray:
    """The run's seconds, vectorised (integer-valued float64s below 2**53 hold the integers
    exactly, so each element's operations are `_loop_run`'s)."""
    D = np.arange(n, dtype=np.float64)
    D *= shape.num_decode_reqs
    D += shape.decode_context_tokens
    win = None
    if cm._slide and cm._windowed(shape):  # below the window they grow, at it they do not
        j = np.arange(n, dtype=np.int64)
        Dw = shape.decode_window_tokens + j * shape.num_decodes_below_window
        win = (Dw.astype(np.float64), shape.max_decode_context + j)
    return decode_terms(cm, shape).steps(D, _pad(shape), win)


def _loop_run(cm: CostModel, shape: BatchShape, n: int, extra_s: float) -> list[float]:
    """The run's seconds (+ `extra_s` each, when not 0), one `DecodeTerms.step` at a time."""
    terms = decode_terms(cm, shape)
    pad = _pad(shape)
    D0, dD = shape.decode_context_tokens, shape.num_decode_reqs
    out: list[float] = []
    if cm._slide and cm._windowed(shape):
        W0, dW, L0 = (shape.decode_window_tokens, shape.num_decodes_below_window,
                      shape.max_decode_context)
        for j in range(n):
            t = terms.step(float(D0 + j * dD), pad, (float(W0 + j * dW), L0 + j))
            out.append(t + extra_s if extra_s else t)
    else:
        for j in range(n):
            t = terms.step(float(D0 + j * dD), pad)
            out.append(t + extra_s if extra_s else t)
    return out
