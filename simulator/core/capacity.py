"""Capacity policies: how a scheduler commits its KV blocks (`SchedulerConfig.capacity_policy`).

- `max_utilization` (vLLM's policy, the default): admit a waiting request while blocks are
  free for its next chunk; when a running request needs a block and none is free, preempt
  the lowest-priority running request (recompute or swap).
- `guaranteed_no_evict` (TensorRT-LLM's default, GUARANTEED_NO_EVICT): every admitted request
  is promised the blocks of its whole length (`max_kv_tokens`: prompt + max_tokens; on a PD
  prefill worker the prompt alone, since its KV leaves for the decode side after the prompt),
  and a waiting request is admitted only when its own promise fits in the free blocks less
  those already promised (`reserved_blocks`). Running requests therefore always find their
  blocks: nothing is ever preempted or swapped (`preemption_mode` has no effect).

Under `guaranteed_no_evict`:
- prefix-cache hits count toward the prompt: a hit held by another request costs nothing, a
  hit revived from the free queue costs one free block (`promise`);
- chunked prefill allocates the promise chunk by chunk; admission is decided once;
- a PD decode worker promises a remote request its whole length before its KV arrives;
- an n > 1 parent promises only its own length; at the fork a child (sharing the parent's full
  prompt blocks) starts only if its remaining length fits what is not promised, otherwise it
  waits as an independent request and later finds the prompt in the prefix cache;
- a request whose length exceeds the whole pool is rejected on arrival (as under
  `max_utilization`), so no request waits forever: once the running requests finish, every
  block is free again.

The reservation is recomputed once per schedule (O(running requests)) and only under this
policy; `max_utilization` never calls into this module.

- `reserve_ratio` (SGLang's admission, PrefillAdder and `new_token_ratio` at v0.5.6): a waiting
  request is admitted only when its prompt rest plus its output budget (max_tokens, at most
  4096: CLIP_MAX_NEW_TOKENS) is less than the free blocks less `ratio` x the running
  requests' remaining output budgets (each at most 4096). Running requests then grow as under
  `max_utilization` and are preempted (SGLang "retracts") when blocks run out. The ratio starts
  at 0.7 (SGLANG_INIT_NEW_TOKEN_RATIO), falls by (0.7 - 0.098) / 600 after every step that
  decodes, down to 0.098 (x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR 0.14), all scaled by
  `schedule_conservativeness` (`reserve_ratios`); it starts over when the engine idles
  (nothing running or waiting: SGLang's self_check_during_idle), and after a preemption is
  re-estimated from the requests still running: (their output tokens + 20 x their count) /
  (their max_tokens + 1), at most 1 (ScheduleBatch.retract_decode). A PD decode worker admits
  remote requests as under `max_utilization`. One deviation, so that nothing waits forever:
  an idle engine admits the head request whatever its budget asks.
  A request whose client set `ignore_eos` meets another test when prefix caching is off (SGLang
  with the radix cache disabled: PrefillAdder.add_one_req_ignore_eos, v0.5.7), since it will
  surely run to max_tokens: its prompt rest must fit the free blocks less the estimate, and
  (`FinishOrder`) every running request, this one included, must be able to finish with
  nothing preempted: taken in order of tokens left (max_tokens x 1 for an ignore_eos request, x
  the ratio for another, less its output), the free tokens when each finishes, counting those
  freed by the ones before it, must stay above one per request still running (with blocks of
  more than one token, each request's tokens left count one block less a token more: SGLang's
  page is a token). Under a sliding window SGLang skips that second test, and so does kvpd.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable

from simulator.core.block_pool import KVCacheBlock, num_revived
from simulator.core.kv_cache_manager import KVCacheManager
from simulator.core.request import Request, RequestStatus

RUNNING = RequestStatus.RUNNING


def max_kv_tokens(req: Request, role: str) -> int:
    """Tokens of KV `req` may hold in a pool of a scheduler with `role`, at most."""
    if role == "prefill":
        return req.num_prompt_tokens
    return req.num_prompt_tokens + req.max_tokens


def blocks_to_completion(kvm: KVCacheManager, req: Request, role: str, num_hits: int = 0,
                         revived: int = 0) -> int:
    """Blocks `req` may still take from the free pool before it finishes: its whole length
    less the table entries it holds (and `num_hits` prefix hits about to join them, `revived`
    of which leave the free queue); with a sliding window at most the blocks it holds at
    once (`KVCacheManager.blocks_to_grow`)."""
    held = kvm.req_to_blocks.get(req.request_id)
    return kvm.blocks_to_grow(max_kv_tokens(req, role), (len(held) if held else 0) + num_hits,
                              revived, req.request_id)


def promise(kvm: KVCacheManager, req: Request, hits: list[KVCacheBlock], role: str) -> int:
    """Free blocks that admitting `req` with prefix hits `hits` commits: its whole length less
    the hits and the blocks it holds, plus each hit revived from the free queue."""
    return blocks_to_completion(kvm, req, role, len(hits), num_revived(hits))


def reserved_blocks(kvm: KVCacheManager, running: Iterable[Request],
                    waiting_for_kv: Iterable[Request], role: str) -> int:
    """Blocks promised to admitted requests (RUNNING ones, and those holding blocks while their
    KV is in flight) that they have not allocated yet."""
    total = 0
    for req in running:
        if req.status == RUNNING:
            total += blocks_to_completion(kvm, req, role)
    for req in waiting_for_kv:
        total += blocks_to_completion(kvm, req, role)
    return total


# SGLang's estimate of what running requests still need (schedule_policy.py, environ.py, v0.5.6),
# at --schedule-conservativeness 1
RATIO_INIT = 0.7
RATIO_MIN_FACTOR = 0.14
RATIO_DECAY_STEPS = 600
RATIO_MIN = RATIO_INIT * RATIO_MIN_FACTOR
RATIO_DECAY = (RATIO_INIT - RATIO_MIN) / RATIO_DECAY_STEPS

RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096


def reserve_ratios(conservativeness: float) -> tuple[float, float, float]:
    """(start, floor, decay per decoding step) of SGLang's ratio at its
    --schedule-conservativeness (Scheduler.__init__: init = min(0.7 x c, 1), min = min(init x
    0.14, 1), decay = (init - min) / 600)."""
    init = min(RATIO_INIT * conservativeness, 1.0)
    floor = min(init * RATIO_MIN_FACTOR, 1.0)
    return init, floor, (init - floor) / RATIO_DECAY_STEPS


def output_budget(req: Request) -> int:
    """`req`'s remaining output tokens as SGLang counts them (at most CLIP_MAX_NEW_TOKENS)."""
    return min(max(req.max_tokens - req.num_output_tokens, 0), CLIP_MAX_NEW_TOKENS)


def ratio_reserved_blocks(kvm: KVCacheManager, running: Iterable[Request], ratio: float) -> int:
    """Blocks `reserve_ratio` keeps for the running requests' outputs: `ratio` x their output
    budgets, in blocks (rounded up)."""
    tokens = ratio * sum(output_budget(r) for r in running if r.status == RUNNING)
    return -int(-tokens // kvm.block_size)


def ratio_need(kvm: KVCacheManager, req: Request, hits: list[KVCacheBlock]) -> int:
    """Free blocks admitting `req` (prefix hits `hits`) asks for under `reserve_ratio`: its
    prompt rest and its whole output budget, plus each hit revived from the free queue."""
    held = kvm.req_to_blocks.get(req.request_id)
    return kvm.blocks_to_grow(req.num_tokens + output_budget(req),
                              (len(held) if held else 0) + len(hits), num_revived(hits),
                              req.request_id)


def ratio_after_preemption(running: Iterable[Request]) -> float:
    """SGLang's re-estimate after a retraction, from the requests still running."""
    reqs = [r for r in running if r.status == RUNNING]
    decoded = sum(r.num_output_tokens for r in reqs)
    budget = sum(r.max_tokens for r in reqs)
    return min(1.0, (decoded + RETRACT_DECODE_STEPS * len(reqs)) / (budget + 1))



# SGLang's admission of an ignore_eos request with the radix cache off (schedule_policy.py,
# v0.5.7): tokens kept free per request still running
IGNORE_EOS_RESERVE_TOKENS = 1


def _left_and_held(req: Request, ratio: float) -> tuple[float, int] | None:
    """(tokens left, tokens held) of `req` as SGLang's ignore-EOS test counts them: max_tokens
    x (1 for an ignore_eos request, else `ratio`) less its output; the prompt plus the output
    so far. None when it has nothing left."""
    left = req.max_tokens * (1.0 if req.sampling_params.ignore_eos else ratio) \
        - req.num_output_tokens
    if left <= 0:
        return None
    return left, req.num_prompt_tokens + req.num_output_tokens


class FinishOrder:
    """One schedule's ignore-EOS admission (`reserve_ratio`): the running requests' (tokens
    left, tokens held) in order of tokens left, built at the first ignore_eos request it
    judges and kept up to date as requests are admitted."""

    def __init__(self, running: list[Request], ratio: float) -> None:
        self._running = running
        self._ratio = ratio
        self._states: list[tuple[float, int]] | None = None

    def admits(self, kvm: KVCacheManager, req: Request, prompt_blocks: int) -> bool:
        """Whether admitting `req` (taking `prompt_blocks` free blocks for its prompt rest)
        leaves every running request able to finish without a preemption: at the finish of
        each, in order of tokens left, the free tokens (now, plus those freed by the requests
        that finished before it, less the tokens left of this one times the requests still
        running) stay above IGNORE_EOS_RESERVE_TOKENS per request still running. SGLang
        counts tokens (its page is one token); in blocks of bs tokens each request's tokens
        left count bs - 1 more, so the test keeps SGLang's promise at any block size
        (identical at bs = 1). Under a sliding window SGLang skips it: True. An admitted
        `req` joins the order."""
        if kvm.sliding_window:
            return True
        if self._states is None:
            self._states = sorted(
                (s for s in (_left_and_held(r, self._ratio) for r in self._running
                             if r.status == RUNNING) if s is not None),
                key=lambda s: s[0])
        trial = list(self._states)
        own = _left_and_held(req, self._ratio)
        if own is not None:
            insort(trial, own, key=lambda s: s[0])
        bs = kvm.block_size
        free = (kvm.num_free_blocks - prompt_blocks) * bs
        slack = bs - 1  # a request growing by k tokens takes at most ceil(k / bs) blocks
        freed = 0
        n = len(trial)
        for i, (left, held) in enumerate(trial):
            live = n - i
            if free + freed - (left + slack) * live <= IGNORE_EOS_RESERVE_TOKENS * live:
                return False
            freed += held
        self._states = trial
        return True

    def add(self, req: Request) -> None:
        """`req` was admitted by the budget test: it runs too (once the order is built)."""
        if self._states is not None:
            own = _left_and_held(req, self._ratio)
            if own is not None:
                insort(self._states, own, key=lambda s: s[0])
