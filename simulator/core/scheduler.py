"""`Scheduler`: iteration-level (ORCA) continuous batching with vLLM v1's token budget.

Each step serves RUNNING requests first (decodes and unfinished prompt chunks), then
admits WAITING ones, within `max_num_batched_tokens` and `max_num_seqs`. When a
running request needs a block and none is free, the lowest-priority running request
is preempted (recompute or swap). `batching="static"` admits a new batch only when
the previous one has fully finished (the request-level baseline). Roles `prefill`
and `decode` split a request across two schedulers for PD disaggregation.

`capacity_policy="guaranteed_no_evict"` reserves each admitted request's whole length
instead and never preempts (`simulator.core.capacity`). With `recv_interval` > 1, arrivals wait
in an inbox until SGLang's receive counter lets them in (`simulator.core.recv_gate`).

Time is a number passed in; this module imports neither simpy nor torch.
"""

from __future__ import annotations

from simulator.core.batch_wait import BatchWait
from simulator.core.block_pool import KVCacheBlock, num_revived
from simulator.core.capacity import (
    FinishOrder,
    blocks_to_completion,
    promise,
    ratio_after_preemption,
    ratio_need,
    ratio_reserved_blocks,
    reserve_ratios,
    reserved_blocks,
)
from simulator.core.config import CacheConfig, SchedulerConfig
from simulator.core.decode_burst import max_decode_burst, update_burst
from simulator.core.kv_cache_manager import KVCacheManager
from simulator.core.parallel_sampling import ParallelSampling
from simulator.core.pd_handoff import PDHandoff
from simulator.core.recv_gate import RecvGate
from simulator.core.request import Request, RequestStatus
from simulator.core.request_queue import make_queue
from simulator.core.scheduler_output import SchedulerOutput, StepResult

RUNNING = RequestStatus.RUNNING
REMOTE = RequestStatus.WAITING_FOR_REMOTE_KV


class Scheduler(PDHandoff, ParallelSampling):
    def __init__(self, config: SchedulerConfig, cache_config: CacheConfig) -> None:
        config.validate_with(cache_config)
        self.config = config
        self.cache_config = cache_config
        # blocks slide out of the window (freed) only when every layer slides, colocated
        frees = cache_config.free_outside_window and config.role == "colocated"
        # (a swapped-in request resumes with up to the whole budget, whatever the threshold)
        step_tokens = config.max_num_batched_tokens
        self.kv_cache_manager = KVCacheManager(
            num_gpu_blocks=cache_config.num_gpu_blocks,
            block_size=cache_config.block_size,
            enable_prefix_caching=cache_config.enable_prefix_caching,
            num_cpu_blocks=cache_config.num_cpu_blocks,
            block_bytes=cache_config.block_bytes,
            sliding_window=cache_config.sliding_window if frees else 0,
            max_step_tokens=step_tokens,
            state_blocks=cache_config.state_blocks,
            sliding_groups=cache_config.sliding_groups,
            group_window=cache_config.sliding_window if cache_config.sliding_groups else 0,
        )
        self._window = cache_config.sliding_window  # batch shapes track it for the cost model
        self.block_size = cache_config.block_size
        self.waiting = make_queue(config.policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_req_ids: list[str] = []  # freed since the last schedule()
        self._finished_pending: list[Request] = []  # finished outside update()
        self._pending_copies: list[tuple[int, int]] = []
        self.waiting_for_kv: dict[str, Request] = {}  # decode role: blocks held, KV in flight
        self.transferring: dict[str, Request] = {}  # prefill role: handed off, blocks held
        self._kv_ready: list[Request] = []
        self.step_id = 0
        self.num_preemptions = 0
        self._no_evict = config.capacity_policy == "guaranteed_no_evict"
        self._by_ratio = config.capacity_policy == "reserve_ratio"
        self._whole_prompt = config.prompt_allocation == "whole_prompt"
        self._append_reserve = config.append_needs_free_block
        # blocks an admission leaves free, and a request may never hold beyond the pool's: the
        # watermark (vLLM V0: int(watermark x blocks)), and with append_needs_free_block the
        # one block every append wants free
        self._kept = max(int(config.admission_watermark * cache_config.num_gpu_blocks),
                         1 if config.append_needs_free_block else 0)
        # reserve_ratio's share of the running outputs: start, floor, decay per decoding step
        self._ratio_init, self._ratio_min, self._ratio_decay = reserve_ratios(
            config.schedule_conservativeness)
        self.new_token_ratio = self._ratio_init
        # decode bursts may run past finishing requests when nothing waits: set by a backend
        # whose replica state nobody reads between steps (`simulator.core.decode_burst`)
        self.burst_past_finishes = False
        # SGLang's --scheduler-recv-interval: arrivals wait in the inbox until the gate opens
        self._gate = RecvGate(config.recv_interval) if config.recv_interval > 1 else None
        self._inbox: list[Request] = []
        # TensorRT-LLM's batch waiting: waiting requests held back in decoding steps
        self._batch_wait = (BatchWait(config.batch_wait_timeout_iters,
                                      config.batch_wait_max_tokens_ratio
                                      * config.max_num_batched_tokens)
                            if config.batch_waits else None)
        self._held = False  # the step just scheduled held its waiting requests back
        self._wait_steady = True  # ... and its check counted no running prompt
        self._burst_tokens: int | None = None  # what the checks of a burst's later steps count

    # ------------------------------------------------------------------ intake
    def add_request(self, req: Request, now: float | None = None) -> None:
        """Queue a request, or finish it as REJECTED (reported by the next update()) when it
        could never be served."""
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in the scheduler")
        if req.is_finished:
            raise ValueError(f"request {req.request_id!r} is already finished")
        reason = self.rejection_reason(req)
        if reason is not None:
            req.finish(RequestStatus.FINISHED_REJECTED, now if now is not None else req.arrival_time, reason)
            self._finished_pending.append(req)
            return
        if req.status == REMOTE:
            req.num_computed_tokens = 0  # nothing of it is in this replica's pool yet
        else:
            req.status = RequestStatus.WAITING
        self.requests[req.request_id] = req
        enqueue = self._inbox.append if self._gate is not None else self.waiting.add
        if req.sampling_params.n > 1 and req.num_prompt_tokens == 1 and not req.num_forked:
            for child in self._make_children(req):  # nothing to share: independent requests
                self.requests[child.request_id] = child
                enqueue(child)
        enqueue(req)

    def rejection_reason(self, req: Request) -> str | None:
        """Why `req` could never be served here (None if it can): longer than max_model_len,
        more blocks than the whole pool (less the admission watermark, which it must leave
        free when admitted), or a prompt over the step budget with chunking off."""
        cfg = self.config
        total = req.num_prompt_tokens + req.max_tokens
        if total > cfg.max_model_len:
            return (
                f"prompt ({req.num_prompt_tokens} tokens) + max_tokens ({req.max_tokens}) = "
                f"{total} exceeds max_model_len ({cfg.max_model_len})"
            )
        need = total if cfg.role != "prefill" else req.num_prompt_tokens + 1
        kvm = self.kv_cache_manager
        blocks = kvm.max_blocks_held(need)
        if blocks > kvm.num_gpu_blocks - self._kept:
            window = kvm.sliding_window or kvm.group_window
            at_once = f" at once (sliding window {window})" if window else ""
            kept = (f", {self._kept} of them kept free (admission_watermark, "
                    "append_needs_free_block)" if self._kept else "")
            state = (f" ({kvm.state_blocks} of them its linear-attention state)"
                     if kvm.state_blocks else "")
            return (
                f"needs {blocks} KV blocks{at_once} for {need} tokens{state} but the whole pool has "
                f"{kvm.num_gpu_blocks}{kept}"
            )
        if not cfg.enable_chunked_prefill and req.num_prompt_tokens > cfg.max_num_batched_tokens:
            return (
                f"prompt ({req.num_prompt_tokens} tokens) exceeds max_num_batched_tokens "
                f"({cfg.max_num_batched_tokens}) and chunked prefill is off"
            )
        return None

    def abort_request(self, request_id: str, now: float, reason: str = "aborted",
                      report: bool = True) -> bool:
        """Finish a request as ABORTED and free its blocks; False if it is unknown.
        `report=False`: the next step does not list it as finished (the caller gave it up)."""
        return self.finish_request(request_id, now, RequestStatus.FINISHED_ABORTED, reason,
                                   report)

    def finish_request(self, request_id: str, now: float, status: RequestStatus,
                       reason: str | None = None, report: bool = True) -> bool:
        """Finish a queued or running request with `status` from outside the step (an abort,
        or a stop string the engine's detokenizer found) and free its blocks; False if it
        is unknown."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        if req.status == RUNNING:
            self.running.remove(req)
        elif request_id in self.waiting_for_kv:
            del self.waiting_for_kv[request_id]
        elif request_id in self.transferring:
            del self.transferring[request_id]
        elif req in self._inbox:
            self._inbox.remove(req)
        else:
            self.waiting.remove(req)
        req.finish(status, now, reason)
        self._free(req)
        if report:
            self._finished_pending.append(req)
        return True

    # ---------------------------------------------------------------- schedule
    def schedule(self, now: float) -> SchedulerOutput:
        if self._gate is not None and self._gate.opens(not self.running and not self.waiting):
            for req in self._inbox:
                self.waiting.add(req)
            self._inbox.clear()
        cfg = self.config
        kvm = self.kv_cache_manager
        out = SchedulerOutput(step_id=self.step_id)
        window = self._window
        if window:
            out.shape.window = window
        out.finished_req_ids, self.finished_req_ids = self.finished_req_ids, []
        out.blocks_to_copy, self._pending_copies = self._pending_copies, []
        budget = cfg.max_num_batched_tokens
        threshold = cfg.long_prefill_token_threshold
        separate = not cfg.mixed_batches and cfg.role == "colocated"
        if separate and self._prefill_pending():
            # prompts in a step of their own; only if none can run do the decodes step (also
            # when a running prompt's next chunk found no block and preempted itself: the
            # decodes' step is what frees blocks, else that prompt is readmitted and preempts
            # itself again, step after step)
            self._schedule_prompts(out, budget, threshold, now)
            if out.reqs:
                if self._by_ratio:
                    self._update_ratio(out)
                return out

        # 1. running requests: decodes and unfinished prompt chunks
        running = self.running
        block_ids = kvm.req_to_block_ids
        num_cached = kvm.num_cached_blocks
        bs = self.block_size
        caching = kvm.enable_prefix_caching
        # blocks that slide out are freed the step they do
        slides = kvm.sliding_window or kvm.sliding_groups
        # the fast path appends to out's lists directly (its requests, running[i - nd:i],
        # and their one new token each when folded in) and sums the decodes' shape here
        before_add, ids_add = out.num_computed_before.append, out.block_ids.append
        nd = dctx = maxd = 0
        touch = self._append_reserve  # V0: appending to a running request wants a free block
        i = 0
        n_running = len(running)  # (changed only by a preemption, after which it is re-read)
        while i < n_running and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            num_new = req.num_prompt_tokens + req.num_output_tokens - computed
            if num_new == 1:
                rid = req.request_id
                ids = block_ids[rid]
                # fast path: a decode whose token fits its last block and completes no block
                # the prefix cache would register (allocate_slots would change nothing)
                if computed and computed < len(ids) * bs and not (
                    touch and not kvm.block_pool.num_free_blocks) and not (
                    caching and (computed + 1) % bs == 0 and (computed + 1) // bs > num_cached[rid]
                ) and not (slides and kvm.slides_out(rid, computed)):
                    before_add(computed)
                    ids_add(ids)
                    nd += 1
                    computed += 1
                    dctx += computed
                    if computed > maxd:
                        maxd = computed
                    budget -= 1
                    i += 1
                    continue
            if nd:  # fold the fast-path decodes in before anything may rebuild the shape
                self._fold_decodes(out, running[i - nd:i], dctx, maxd)
                nd = dctx = maxd = 0
            if num_new > 1:
                num_new = self._cap_prefill(req, num_new, threshold)
            if num_new > budget:
                num_new = budget
            budget += self._allocate_or_preempt(req, num_new, out)
            # running[:i] are exactly the requests scheduled so far (victims left both)
            i = len(out.reqs)
            n_running = len(running)
        if nd:
            self._fold_decodes(out, running[i - nd:i], dctx, maxd)

        # 2. waiting requests (none while preempting, none mid-batch when static, none into
        # a decode step when prompts run in steps of their own)
        if not separate and not (self._batch_wait is not None and self._holds_waiting(out, budget)):
            self._admit_waiting(out, budget, threshold, now)
        if self._by_ratio:
            self._update_ratio(out)
        return out

    def _holds_waiting(self, out: SchedulerOutput, budget: int) -> bool:
        """TensorRT-LLM's batch waiting (`simulator.core.batch_wait`) for a step that decodes:
        whether the waiting requests that could join it wait. They are counted in queue order
        while seats and the step's tokens last (their whole token counts), with the running
        prompt chunks already in the step; one token per decode."""
        self._held, self._wait_steady, self._burst_tokens = False, True, None
        gen = out.shape.num_decode_reqs
        seats = self.config.max_num_seqs - len(self.running)
        if not gen or not self.waiting or seats <= 0 or budget <= 0 or out.preempted_req_ids:
            return False  # no context request could join: nothing is counted
        running = sum(req.num_tokens for req, before in zip(out.reqs, out.num_computed_before)
                      if before < req.num_prompt_tokens)
        self._wait_steady = not running
        ctx = running + self._waiting_context_tokens(seats, budget)
        assert self._batch_wait is not None
        self._held = self._batch_wait.holds(ctx, gen)
        return self._held

    def _waiting_context_tokens(self, seats: int, budget: int) -> int:
        """The whole token counts of the waiting requests that could join a step, in queue
        order while `seats` and the step's `budget` tokens last (no KV check)."""
        ctx = 0
        for req in self.waiting:
            if seats <= 0 or budget <= 0:
                break
            ctx += req.num_tokens
            budget -= req.num_tokens - req.num_computed_tokens
            seats -= 1
        return ctx

    def _decode_step_wait_tokens(self) -> int | None:
        """What the batch-waiting check of an all-decode step of the running requests counts
        (None: the check does not apply: nothing waits, or no seat or token is left)."""
        n = len(self.running)
        seats, budget = self.config.max_num_seqs - n, self.config.max_num_batched_tokens - n
        if not n or not self.waiting or seats <= 0 or budget <= 0:
            return None
        return self._waiting_context_tokens(seats, budget) + n

    def _update_ratio(self, out: SchedulerOutput) -> None:
        """reserve_ratio after a step: re-estimated after a preemption, else one decay when the
        step decodes (SGLang's update_running_batch; `simulator.core.capacity`)."""
        if out.preempted_req_ids:
            self.new_token_ratio = ratio_after_preemption(self.running)
        elif out.shape.num_decode_reqs:
            self._decay_ratio(1)

    def _decay_ratio(self, steps: int) -> None:
        """`steps` decode steps of reserve_ratio's decay (one subtraction each, as step by step)."""
        r = self.new_token_ratio
        for _ in range(steps):
            r = max(r - self._ratio_decay, self._ratio_min)
        self.new_token_ratio = r

    def _prefill_pending(self) -> bool:
        """Whether a prompt could run: a request waits, or a running one has prompt tokens
        left (`_prompt_work`)."""
        return bool(self.waiting) or any(_prompt_work(req) for req in self.running)

    def _schedule_prompts(self, out: SchedulerOutput, budget: int, threshold: int,
                          now: float) -> None:
        """A step of prompt work only (`SchedulerConfig.mixed_batches` False): the running
        requests' pending prompt chunks, then waiting requests admitted into what is left."""
        for req in list(self.running):
            if budget <= 0:
                break
            num_new = _prompt_work(req)
            if not num_new or req.status != RUNNING:  # a decode, or preempted just now
                continue
            if num_new > 1:
                num_new = self._cap_prefill(req, num_new, threshold)
            num_new = min(num_new, budget)
            budget += self._allocate_or_preempt(req, num_new, out)
        # blocks the running prompts may still take to finish: no admission may take them
        promised = sum(self._blocks_to_hold(req) for req in self.running if _prompt_work(req))
        self._admit_waiting(out, budget, threshold, now, promised)

    def _blocks_to_hold(self, req: Request) -> int:
        """Blocks `req` may still take from the free pool before its last token so far
        (`KVCacheManager.blocks_to_grow`)."""
        kvm = self.kv_cache_manager
        rid = req.request_id
        return kvm.blocks_to_grow(req.num_tokens, len(kvm.req_to_blocks.get(rid) or ()), 0, rid)

    def _allocate_or_preempt(self, req: Request, num_new: int, out: SchedulerOutput) -> int:
        """Schedule `num_new` tokens of running `req` into `out`, preempting victims until its
        blocks fit (or it is the victim); returns the change in the step's token budget."""
        kvm = self.kv_cache_manager
        delta = 0
        while (self._append_reserve and not kvm.num_free_blocks) or not kvm.allocate_slots(req, num_new):
            if self._no_evict:
                raise RuntimeError(
                    f"guaranteed_no_evict: request {req.request_id!r} found no block "
                    "although its whole length was reserved at admission"
                )
            victim = self._pick_victim()
            delta += self._preempt(victim, out)
            if victim is req:
                return delta
        out.add(req, num_new, kvm.req_to_block_ids[req.request_id])
        return delta - num_new

    def _admit_waiting(self, out: SchedulerOutput, budget: int, threshold: int,
                       now: float, promised: int = -1) -> None:
        """Admit waiting requests into `out` within `budget` tokens (none while preempting,
        none mid-batch when static). `promised` >= 0 (prompts in steps of their own): a
        request is admitted only when its whole prompt fits the free blocks beyond the
        `promised` ones, which the running prompts still need, as an engine that runs prompt
        batches first reserves them (else its decodes could never run)."""
        cfg = self.config
        kvm = self.kv_cache_manager
        running = self.running
        if out.preempted_req_ids or (cfg.batching == "static" and running):
            return
        waiting = self.waiting
        no_evict = self._no_evict
        reserved = 0
        if no_evict and waiting:  # (what is promised, and the blocks kept free beside it)
            reserved = reserved_blocks(kvm, running, self.waiting_for_kv.values(),
                                       cfg.role) + self._kept
        by_ratio = self._by_ratio
        estimated = 0
        if by_ratio and waiting:
            estimated = ratio_reserved_blocks(kvm, running, self.new_token_ratio)
        # reserve_ratio's test for ignore_eos requests without prefix caching
        finish_order = FinishOrder(running, self.new_token_ratio) if by_ratio and waiting else None
        # an admission leaves the watermark free, and with append_needs_free_block at least the
        # one block the request's next chunk wants free (else it preempts itself, and again)
        whole_prompt, kept = self._whole_prompt, self._kept
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            req = waiting.peek()
            if req.status == REMOTE:
                if not self._admit_remote(req, out, reserved):
                    break
                if no_evict:
                    reserved += blocks_to_completion(kvm, req, cfg.role)
                continue
            if req.is_swapped:
                # a resumed request may continue in chunks, whatever the chunking knob
                computed = req.num_computed_tokens
                num_new = req.num_tokens - computed
                if num_new > 1:  # no threshold, but a fork point and first_token_from_decode
                    num_new = self._cap_prefill(req, num_new, 0, computed)
                num_new = min(num_new, budget)
                # every host block comes back (a whole-prompt request holds blocks beyond its
                # computed tokens), then the step's tokens take what more they need
                need = max(kvm.blocks_needed(req.num_computed_tokens + num_new)
                           - kvm.cpu_skipped_blocks.get(req.request_id, 0),  # slid out
                           len(kvm.req_to_cpu_blocks.get(req.request_id, ())))
                if need > kvm.num_free_blocks:
                    break
                mapping = kvm.swap_in(req)
                assert mapping is not None  # (the blocks it needs are free: checked above)
                req.is_swapped = False
                out.blocks_to_swap_in.extend(mapping)
                out.swap_in_bytes += len(mapping) * kvm.block_bytes
                hits: list[KVCacheBlock] = []
                num_hit = 0
                take_rest = False
            else:
                # (where blocks slide out of a window its table never holds them all at once:
                # they are taken per chunk, as the admission check caps them)
                take_rest = whole_prompt and not kvm.sliding_window
                # an unforked parent must compute >= 1 prompt token before its fork point
                fork_limit = (req.num_prompt_tokens - 2 if req.sampling_params.n > 1
                              and not req.num_forked else None)
                hits, num_hit = kvm.get_computed_blocks(req, fork_limit)
                num_new = req.num_tokens - req.num_computed_tokens - num_hit
                if num_new > 1:
                    num_new = self._cap_prefill(req, num_new, threshold, req.num_computed_tokens + num_hit)
                if num_new > budget:
                    if not cfg.enable_chunked_prefill and num_new <= cfg.max_num_batched_tokens:
                        break  # the whole prompt must fit one step's budget
                    num_new = budget
                if no_evict and promise(kvm, req, hits, cfg.role) > kvm.num_free_blocks - reserved:
                    break  # its whole length does not fit what is not yet promised
                if finish_order is not None:
                    need = ratio_need(kvm, req, hits)
                    if running and req.sampling_params.ignore_eos and not kvm.enable_prefix_caching:
                        # it surely runs to max_tokens: its prompt must fit what is not
                        # estimated, and every running request must be able to finish
                        prompt = kvm.blocks_to_grow(req.num_tokens, len(hits), num_revived(hits),
                                                    req.request_id)
                        if (prompt > kvm.num_free_blocks - estimated
                                or not finish_order.admits(kvm, req, prompt)):
                            break
                    elif running and need >= kvm.num_free_blocks - estimated:
                        break  # its prompt and output budget do not fit what is not estimated
                    else:
                        finish_order.add(req)
                    estimated += need  # (an idle engine takes the head request whatever it asks)
                if promised >= 0 and (kvm.blocks_to_grow(req.num_tokens, len(hits),
                                                         num_revived(hits), req.request_id)
                                      > kvm.num_free_blocks - promised):
                    break  # its whole prompt does not fit beyond the running prompts' rest
                if whole_prompt or kept:
                    # the blocks it takes now (all of its tokens', or this chunk's) must leave
                    # `kept` free
                    upto = req.num_tokens if whole_prompt else req.num_computed_tokens + num_hit + num_new
                    if kvm.blocks_to_grow(upto, len(hits), num_revived(hits),
                                          req.request_id) > kvm.num_free_blocks - kept:
                        break
            if not kvm.allocate_slots(req, num_new, hits):
                break
            if take_rest:  # the blocks of all its tokens at once (they fit: checked above)
                kvm.allocate_slots(req, req.num_tokens - req.num_computed_tokens, cache=False)
            waiting.pop()
            if promised >= 0:
                promised += self._blocks_to_hold(req)
            if no_evict:
                reserved += blocks_to_completion(kvm, req, cfg.role)
            req.num_computed_tokens += num_hit
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            req.status = RUNNING
            running.append(req)
            out.new_req_ids.append(req.request_id)
            out.add(req, num_new, kvm.req_to_block_ids[req.request_id])
            budget -= num_new

    def _fold_decodes(self, out: SchedulerOutput, decodes: list[Request], dctx: int, maxd: int) -> None:
        """Add `decodes` (fast-path decodes whose contexts before and block tables `out`
        already ends with; contexts summing to `dctx`, the longest `maxd`) to `out`'s requests
        and batch shape, with their sliding-window sums if tracked."""
        nd = len(decodes)
        out.reqs.extend(decodes)
        out.num_new_tokens.extend([1] * nd)
        shape = out.shape
        shape.add_decodes(nd, dctx, maxd)
        if shape.window:
            for before in out.num_computed_before[-nd:]:
                shape.add_window_decode(before + 1)

    def _cap_prefill(self, req: Request, num_new: int, threshold: int, computed: int | None = None) -> int:
        """`num_new` (> 1) prompt tokens of `req` after `computed`, capped by the per-step
        threshold, a parallel-sampling fork point and, with `first_token_from_decode`, one
        token short of the end (that last token runs as a decode)."""
        if computed is None:
            computed = req.num_computed_tokens
        if threshold and num_new > threshold:
            num_new = threshold
        num_new = self._cap_last_token(req, num_new, computed)
        if req.sampling_params.n > 1 and not req.num_forked and req.parent_request_id is None:
            fork_point = req.num_prompt_tokens - 1
            if computed < fork_point:
                num_new = min(num_new, fork_point - computed)
        return num_new

    def _cap_last_token(self, req: Request, num_new: int, computed: int) -> int:
        """`num_new` tokens of `req` after `computed`, one short of its end with
        `first_token_from_decode` (that last token then runs as a decode)."""
        if self.config.first_token_from_decode:
            short = req.num_tokens - 1 - computed
            if 0 < short < num_new:
                return short
        return num_new

    def _pick_victim(self) -> Request:
        if self.config.policy == "priority":
            # lowest priority, latest arrival; ties go to the latest admitted, so the
            # oldest request always makes progress (no preemption ping-pong)
            running = self.running
            return running[max(range(len(running)), key=lambda i: (running[i].priority, running[i].arrival_time, i))]
        return self.running[-1]

    def _preempt(self, victim: Request, out: SchedulerOutput) -> int:
        """Preempt `victim`; returns the budget it gave back if it was already scheduled."""
        kvm = self.kv_cache_manager
        self.running.remove(victim)
        returned = out.remove(victim) if victim in out.reqs else 0
        mapping = kvm.swap_out(victim) if self.config.preemption_mode == "swap" else None
        if mapping is not None:
            victim.is_swapped = True
            out.blocks_to_swap_out.extend(mapping)
            out.swap_out_bytes += len(mapping) * kvm.block_bytes
        else:
            kvm.free(victim, preempted=True)
            victim.num_computed_tokens = 0
        victim.status = RequestStatus.PREEMPTED
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(victim)
        out.preempted_req_ids.append(victim.request_id)
        return returned

    # ------------------------------------------------------------------ update
    def update(self, out: SchedulerOutput, result: StepResult, now: float) -> list[Request]:
        """Apply a finished step at time `now` (s); returns the requests that finished
        (including those rejected or aborted since the last update)."""
        finished, self._finished_pending = self._finished_pending, []
        if result.step_end_times is not None and len(result.step_end_times) > 1:
            def finish(req: Request, end: float) -> None:
                self._finish(req, RequestStatus.FINISHED_LENGTH, end, finished)

            if update_burst(self, out, result.step_end_times, finish):
                self.running = [r for r in self.running if r.status == RUNNING]
            if self._by_ratio:  # the burst's steps after the first decoded too
                self._decay_ratio(len(result.step_end_times) - 1)
        else:
            self._update_step(out, result.sampled_token_ids, now, finished)
        if self._gate is not None:
            self._gate.stepped(out.shape.num_prefill_reqs > 0,
                               len(result.step_end_times) if result.step_end_times else 1)
        if (self._batch_wait is not None and self._burst_tokens is not None
                and result.step_end_times is not None and len(result.step_end_times) > 1):
            self._batch_wait.burst(len(result.step_end_times), self._burst_tokens)
        if self._by_ratio and not self.running and not self.waiting:
            # the engine idles: SGLang starts its ratio over (self_check_during_idle)
            self.new_token_ratio = self._ratio_init
        self.step_id += 1
        return finished

    def _update_step(self, out: SchedulerOutput, sampled, now: float, finished: list[Request]) -> None:
        prefill_role = self.config.role == "prefill"
        removed = False
        for i, req in enumerate(out.reqs):
            if req.status != RUNNING:
                continue
            num_computed = out.num_computed_before[i] + out.num_new_tokens[i]
            req.num_computed_tokens = num_computed
            if num_computed < req.num_tokens:
                if (
                    req.sampling_params.n > 1
                    and not req.num_forked
                    and req.parent_request_id is None
                    and num_computed == req.num_prompt_tokens - 1
                ):
                    self._fork(req)
                continue
            token = sampled[i] if sampled is not None else None
            req.append_output_token(token, now)
            stop = req.check_stop(token)
            if stop is not None:
                self._finish(req, stop, now, finished)
                removed = True
            elif prefill_role:
                req.status = REMOTE
                self.transferring[req.request_id] = req
                self._kv_ready.append(req)
                removed = True
        if removed:
            self.running = [r for r in self.running if r.status == RUNNING]

    def max_decode_burst(self, out: SchedulerOutput, max_steps: int) -> int:
        """How many steps of the all-decode batch `out` a backend without token ids may run
        at once (`simulator.core.decode_burst`); 1 means "one step only"."""
        if self._by_ratio and self.waiting:
            return 1  # reserve_ratio's decay may let a waiting request in at any step
        if self._inbox and self._gate is not None:  # end before the check that takes them in
            max_steps = min(max_steps, self._gate.steps_before_open(out.shape.num_prefill_reqs > 0))
        if self._batch_wait is not None:
            if not self._wait_steady:
                return 1  # a running prompt was counted: the next step's check counts otherwise
            if self._held:  # end before the step that lets the waiting requests in
                max_steps = min(max_steps, self._batch_wait.steps_before_release())
            # the later steps' checks (held back or tried in vain: step 1 left them waiting)
            self._burst_tokens = self._decode_step_wait_tokens()
        return max_decode_burst(self, out, max_steps)

    # ----------------------------------------------------------------- helpers
    def _finish(self, req: Request, status: RequestStatus, now: float, finished: list[Request]) -> None:
        req.finish(status, now)
        self._free(req)
        finished.append(req)

    def _free(self, req: Request) -> None:
        self.kv_cache_manager.free(req)
        self.requests.pop(req.request_id, None)
        self.finished_req_ids.append(req.request_id)

    # ------------------------------------------------------------------ status
    def has_unfinished_requests(self) -> bool:
        return bool(
            self.running or self.waiting or self.waiting_for_kv or self._finished_pending
            or self._inbox
        )

    def get_stats(self) -> dict[str, float]:
        kvm = self.kv_cache_manager
        return {
            "num_running": len(self.running),
            "num_waiting": len(self.waiting) + len(self._inbox),
            "num_waiting_for_kv": len(self.waiting_for_kv),
            "num_transferring": len(self.transferring),
            "kv_usage": kvm.usage,
            "num_free_blocks": kvm.num_free_blocks,
            "num_preemptions": self.num_preemptions,
        }


def _prompt_work(req: Request) -> int:
    """Tokens a running request still has to compute before it decodes: its prompt's (or a
    recompute's) rest, 0 for a decode (one token after it has sampled before)."""
    n = req.num_tokens - req.num_computed_tokens
    return n if n > 1 or (n == 1 and req.num_output_tokens == 0) else 0
