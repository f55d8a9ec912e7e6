"""Decode bursts: many consecutive all-decode steps applied to the core at once.

A backend without token ids (the simulator) may run the next k steps of an all-decode batch
as one *burst*: `max_decode_burst` says how many steps the core would schedule with this
batch if no request arrived and no KV landed, `burst_segments` gives the batch shape of each
run of steps (for the cost model's closed-form step times), and `update_burst` applies the
steps that ran (`StepResult.step_end_times`) to the requests and their blocks, exactly as
stepping one by one would, timestamps included.

A burst may *lead* with a step that completes prompts (a colocated core with nothing left
waiting, every scheduled prompt finishing this step, no sliding window): from step 2 on
the batch is all-decode, and a prompt of `n` new tokens after `before` decodes exactly as a
decode whose context before step 1 was `before + n - 1` (its slots, blocks and tokens).

A burst normally ends at the first request to reach `max_tokens`. With
`Scheduler.burst_past_finishes` (set by a backend when nothing outside the replica looks at
its state between steps: one replica or a stateless router, no closed loop) and nothing
waiting, it runs on past finishing requests: each leaves the batch after its last step, its
blocks are freed there (before the others' later blocks are allocated, so the pool's free
queue and peak usage match step-by-step), and the next steps' shape is the rest's.

This module imports neither simpy nor the scheduler (the scheduler calls it).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sized
from typing import Protocol

from simulator.core.batch_shape import BatchShape
from simulator.core.config import SchedulerConfig
from simulator.core.kv_cache_manager import NEVER_CACHED, KVCacheManager
from simulator.core.request import Request
from simulator.core.scheduler_output import SchedulerOutput


class WaitingQueue(Sized, Protocol):
    def peek(self) -> Request: ...


class BurstCore(Protocol):
    """The scheduler state a burst reads (`simulator.core.scheduler.Scheduler`)."""

    config: SchedulerConfig
    kv_cache_manager: KVCacheManager
    block_size: int
    running: list[Request]
    burst_past_finishes: bool

    @property
    def waiting(self) -> WaitingQueue: ...


def _remaining(out: SchedulerOutput) -> list[int]:
    """Steps until each scheduled request reaches `max_tokens` (1 = this step is its last):
    noted on `out` by `max_decode_burst` (nothing changes them before the burst's update)."""
    rems = out.remaining
    if rems is None:
        rems = [req.sampling_params.max_tokens - req.num_output_tokens for req in out.reqs]
    return rems


def burst_decode_before(out: SchedulerOutput) -> list[int]:
    """Each request's context before step 1 had step 1 been a decode: `before + n - 1` for
    `n` new tokens (`before` itself for a decode), noted on `out`."""
    vb = out.decode_before
    if vb is None:
        vb = out.decode_before = out.num_computed_before if not out.shape.num_prefill_reqs else [
            before + n - 1 for before, n in zip(out.num_computed_before, out.num_new_tokens)]
    return vb


def max_decode_burst(core: BurstCore, out: SchedulerOutput, max_steps: int) -> int:
    """How many consecutive steps of the batch `out` (all-decode from step 2 on) the core
    would schedule if no request arrived, no KV landed and no token id stopped a request:
    bounded by the nearest `max_tokens` (the farthest, past finishes: see the module
    docstring) and by free blocks. 1 means "one step only"."""
    if (
        max_steps <= 1
        or not out.reqs
        or len(out.reqs) != len(core.running)
        or out.preempted_req_ids
        or out.blocks_to_swap_in
        or out.blocks_to_copy
        or out.kv_to_receive
        or core.config.role == "prefill"
    ):
        return 1
    kvm = core.kv_cache_manager
    if out.shape.num_prefill_reqs and (
        core.waiting or core.config.role != "colocated" or kvm.sliding_window or out.shape.window
    ):
        return 1  # step 2 could admit a request, or a lead step is not modelled here
    cfg = core.config
    if (core.waiting and len(core.running) < cfg.max_num_seqs
            and len(out.reqs) < cfg.max_num_batched_tokens
            and kvm.has_evictable_hits(core.waiting.peek())):
        # the next request's cached prefix sits in the free queue: a decode's new block may
        # evict part of it, which changes what its admission needs at the next step
        return 1
    past = (core.burst_past_finishes and not core.waiting and not kvm.sliding_window
            and not out.shape.window)
    rems = out.remaining = _remaining(out)
    # prompts in steps of their own: a one-token chunk (decode-shaped) that ends a prompt frees
    # the blocks that prompt was promised (`Scheduler._schedule_prompts`) for an admission at
    # step 2
    promised = bool(core.waiting) and not cfg.mixed_batches
    for req, before, n in zip(out.reqs, out.num_computed_before, out.num_new_tokens):
        if promised and before < req.num_prompt_tokens:
            return 1
        if before + n != req.num_tokens or (req.sampling_params.n > 1 and not req.num_forked):
            return 1  # this step does not sample, or a fork is due
    k = min(max_steps, max(rems) if past else min(rems))
    shape = out.shape
    if shape.num_decodes_below_window and shape.min_window_gap < k:
        k = shape.min_window_gap  # the window-capped sums stay linear (BatchShape.advanced)
    groups = kvm.sliding_groups
    if kvm.sliding_window or groups:
        if kvm.max_step_tokens < k:
            k = kvm.max_step_tokens  # a burst's blocks stay within max_blocks_held
        if core.waiting and not core.config.mixed_batches:
            return 1  # a slid-out block may let a whole prompt in (`Scheduler._admit_waiting`)
        if core.waiting and len(core.running) < core.config.max_num_seqs:
            # a block sliding out could admit a waiting request: end before one does
            # (step j frees once (before + j - window + 1) // bs passes the freed ones)
            w, skipped, _ = kvm.sliding_tables()
            for req, before in zip(out.reqs, out.num_computed_before):
                j = (skipped.get(req.request_id, 0) + 1) * core.block_size + w - 1 - before
                if j < k:
                    k = max(j, 1)
    if k <= 1:
        return 1
    bs = core.block_size
    free = kvm.num_free_blocks
    if cfg.append_needs_free_block:
        free -= 1  # every append wants a block free: the burst must leave one
        if free < 0:
            return 1
    # tokens each request's blocks hold beyond step 1's, and the steps it runs at most
    slack = [len(ids) * bs - before - 1 for ids, before in zip(out.block_ids, burst_decode_before(out))]
    per_block = 1 + groups  # a new block position: its table block and a block per sliding group
    if len(slack) * (-(-(k - 1) // bs)) * per_block <= free:
        return k

    def blocks_needed(steps: int) -> int:
        # no credit for blocks freed mid-burst: a bound, so a burst never needs a preemption
        need = 0
        for s, r in zip(slack, rems):
            extra = (steps if steps < r else r) - 1
            if extra > s:
                need += -(-(extra - s) // bs) * per_block
        return need

    lo, hi = 1, k  # blocks_needed(lo) == 0 <= free
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if blocks_needed(mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def burst_segments(out: SchedulerOutput, k: int) -> Iterator[tuple[BatchShape, int]]:
    """The burst of `k` steps from `out` as runs of steps of one batch shape each, lazily:
    (shape of the run's first step, number of steps). One run unless step 1 leads with
    prompts or requests finish before step k; then each run after the first is the requests
    left after the previous one's, all decoding."""
    rems = _remaining(out)
    ends = sorted({r for r in rems if r < k} | ({1} if out.shape.num_prefill_reqs else set()))
    if not ends:
        yield out.shape, k
        return
    yield out.shape, ends[0]
    ctx = [before + 1 for before in burst_decode_before(out)]  # context at step 1, as decodes
    for m, e in enumerate(ends):
        alive = [c for c, r in zip(ctx, rems) if r > e]
        n = len(alive)
        longest = max(alive) + e
        shape = BatchShape(num_reqs=n, num_tokens=n, num_decode_reqs=n,
                           decode_context_tokens=sum(alive) + e * n, max_context=longest,
                           max_decode_context=longest)
        yield shape, (ends[m + 1] if m + 1 < len(ends) else k) - e


def update_burst(core: BurstCore, out: SchedulerOutput, times, finish: Callable[[Request, float], None]) -> bool:
    """Apply the `len(times)` steps of a burst from `out` that ran (end times `times`, s): each
    request computes min(its remaining, len(times)) tokens; those reaching `max_tokens` finish
    (via `finish(req, time)`) after their last step, in step-by-step order. True if any did."""
    kvm = core.kv_cache_manager
    k = len(times)
    bs = core.block_size
    slides = kvm.sliding_window or kvm.sliding_groups
    rems = _remaining(out)
    steps = [r if r < k else k for r in rems]
    first = times[0]
    times = array("d", times)  # (extends the requests' token-time arrays by copying)
    any_done = False
    cached = kvm.num_cached_blocks
    alive = list(zip(out.reqs, burst_decode_before(out), out.block_ids, steps, rems))
    start = 1  # step 1's blocks were allocated by schedule()
    for e in sorted(set(steps)):
        needs: list[tuple[str, int]] = []  # blocks to take, in request order, in one go
        total = 0
        for req, before, ids, _, _ in alive:
            # blocks for steps start+1 .. e, all at once; with a window from `before`, so that
            # these steps free nothing here (_burst_slide)
            end = before + e
            if not slides and end > len(ids) * bs and cached[req.request_id] == NEVER_CACHED:
                # nothing of it can be cached and nothing slides: take the blocks, as
                # allocate_slots would (peak usage included)
                need = -(-end // bs) - len(ids)
                needs.append((req.request_id, need))
                total += need
            elif end > len(ids) * bs or req.prompt_token_ids is not None:
                if needs:  # the earlier requests take theirs first
                    _take(kvm, needs, total)
                    needs, total = [], 0
                req.num_computed_tokens = before if slides else before + start
                if not kvm.allocate_slots(req, end - req.num_computed_tokens):
                    raise RuntimeError("decode burst exceeded the blocks max_decode_burst() allowed")
        if needs:
            _take(kvm, needs, total)
        if e == k and slides:  # (one run only) slid-out blocks leave before any request finishes
            _burst_slide(core, out, k)
        rest = []
        for item in alive:
            req, before, _, s, rem = item
            if s != e:
                rest.append(item)
                continue
            req.num_computed_tokens = before + s
            if req.first_token_time is None:
                req.first_token_time = first
            req.num_output_tokens += s
            req.token_times.extend(times if s == k else times[:s])
            if rem == s:  # check_stop without a token id: its blocks go before later steps'
                finish(req, times[s - 1])
                any_done = True
        alive = rest
        start = e
    return any_done


def _take(kvm: KVCacheManager, needs: list[tuple[str, int]], total: int) -> None:
    """Take `total` free blocks for the (request id, blocks) of `needs`, in order."""
    if total > kvm.block_pool.num_free_blocks:
        raise RuntimeError("decode burst exceeded the blocks max_decode_burst() allowed")
    kvm.append_blocks_each(needs)


def _burst_slide(core: BurstCore, out: SchedulerOutput, k: int) -> None:
    """Free the blocks that slid out during steps 2..k of a burst in the order stepping one
    by one frees them (step, then request, then block), after all the burst's allocations:
    the prefix cache's eviction order then equals the step-by-step one."""
    kvm = core.kv_cache_manager
    bs = core.block_size
    w, skipped, free = kvm.sliding_tables()
    events = []
    for order, (req, before) in enumerate(zip(out.reqs, out.num_computed_before)):
        rid = req.request_id
        # step j (1 .. k-1) frees the blocks before (before + j - w + 1) // bs
        for b in range(skipped.get(rid, 0), (before + k - w) // bs):
            # (a request's blocks due at one step leave latest first, as one step frees them)
            events.append((max(1, (b + 1) * bs + w - 1 - before), order, -(b + 1), rid))
    events.sort()
    for _, _, first, rid in events:
        free(rid, -first)

