"""`SimReplica`: one serving replica (a TP x PP group) as a SimPy process.

It runs the shared core's engine step with a cost-model clock: `schedule(now)`,
a duration from the cost model (plus PCIe time for swap traffic), then
`update(output, result, end)`. With nothing to do it sleeps on an event (no
polling). Runs of all-decode steps, led or not by a step that completes prompts, are
simulated as one *decode burst* (`Scheduler.max_decode_burst`); an arrival or a KV
landing during a burst cuts it at the step in progress, so results equal step-by-step
simulation. A router that reads KV usage (`least_kv_usage`) reads it mid-burst as stepping
one by one would have left it (`kv_usage`: the blocks the steps scheduled by now took).

Replicas sharing one host (`cluster.host_memory_share`, `host_compute_share`) slow each
other while both are in a step (`simulator.cost.host_share`); a neighbour starting or ending a
step wakes the others, which re-price the rest of the step in progress.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator
from heapq import heappush
from itertools import accumulate

import simpy
from simpy.events import NORMAL

from simulator.cluster.links import SimLink
from simulator.cluster.timeline import Timeline
from simulator.core.batch_shape import BatchShape
from simulator.core.decode_burst import burst_decode_before, burst_segments
from simulator.core.request import Request
from simulator.core.scheduler import Scheduler
from simulator.core.scheduler_output import StepResult
from simulator.cost.host_share import HostSharing


def _until(env: simpy.Environment, t: float) -> simpy.Event:
    """An event that fires with env.now == `t` exactly (s, t >= now). `timeout(t - now)` fires
    at now + (t - now), which can round an ulp or two off `t` (no delay lands on `t` when the
    sum rounds on a tie), so a decode burst's planned ends and the same steps one by one would
    drift apart, and for some (now, t) no float delay lands on `t`. Scheduled as SimPy 4's
    Timeout schedules itself (its private `_queue` and `_eid`; pyproject keeps simpy < 5 and
    tests/test_sim_burst_property.py fails if they change), at `t` instead of now + delay."""
    if t < env.now:
        raise ValueError(f"_until: {t} s is before now ({env.now} s)")
    event = simpy.Event(env)
    event._ok, event._value = True, None  # triggered, as a Timeout is when made
    heappush(env._queue, (t, NORMAL, next(env._eid), event))
    return event


class SimReplica:
    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        scheduler: Scheduler,
        cost_model,
        pcie: SimLink | None,
        timeline: Timeline,
        *,
        max_decode_burst: int = 1024,
        on_finished: Callable[[SimReplica, list[Request]], None] | None = None,
        on_kv_ready: Callable[[SimReplica, list[Request]], None] | None = None,
        on_kv_to_receive: Callable[[SimReplica, list[tuple[Request, int]]], None] | None = None,
        start: bool = True,
    ) -> None:
        """`start`: run the replica's own engine loop (False: something else steps its
        scheduler, e.g. a data-parallel attention group, `simulator.cluster.dp_group`)."""
        self.env = env
        self.name = name
        self.scheduler = scheduler
        self.cost_model = cost_model
        self.pcie = pcie
        self.timeline = timeline
        self.max_decode_burst = max_decode_burst
        self.on_finished = on_finished
        self.on_kv_ready = on_kv_ready
        self.on_kv_to_receive = on_kv_to_receive
        self._wake = env.event()
        self.outstanding_tokens = 0  # prompt + max output tokens of requests not yet finished
        self.num_steps = 0
        # busy time: closed runs of back-to-back steps plus the open one [start, end] (s);
        # summed per run, so a decode burst and the same steps one by one give equal sums
        self._busy_closed = 0.0
        self._busy_start = self._busy_end = 0.0
        # host sharing (`cluster.host_memory_share`, `host_compute_share`): a step runs
        # slower while a neighbour (a replica on the same host) is in a step
        self.host_sharing: HostSharing | None = None
        self.neighbours: list[SimReplica] = []
        self.in_step = False
        self.mem_fraction = 0.0  # of the step in progress: memory seconds / step seconds
        self.loop_overhead_s = cost_model.params.loop_overhead_s  # host s per step, outside it
        self.pending_host_s = 0.0  # host s of KV landings the next step waits for (`kv_landed`)
        # when the idle spell in progress began (None: busy); the next step pays
        # CostParams.wake_extra_s of it
        self._idle_since: float | None = None
        # who steps this replica when it does not (`start` False): woken in its place
        self.on_wake: Callable[[], None] | None = None
        # `kv_usage` mid-burst (set by a cluster whose router reads it): the burst's
        # (free blocks before step 2, block size, each request's context before step 1 and
        # table length) and its steps' planned end times (s)
        self.track_burst_usage = False
        self._burst_blocks: tuple[int, int, list[int], list[int]] | None = None
        self._burst_ends: list[float] = []
        self.process = env.process(self._run()) if start else None

    # ---- intake (called by routers and the PD link) ----
    def submit(self, req: Request) -> None:
        self.assign(req)
        self.admit(req)

    def assign(self, req: Request) -> None:
        """Count `req` as this replica's (routers read `outstanding_tokens`) before it reaches
        the scheduler: at once, or after an API server's handling (`admit`)."""
        req.annotations.setdefault("replicas", []).append(self.name)
        req.annotations["replica"] = self.name
        self.outstanding_tokens += req.num_prompt_tokens + req.max_tokens

    def admit(self, req: Request) -> None:
        """Hand an assigned request to the scheduler (now)."""
        self.scheduler.add_request(req, self.env.now)
        self.wake()

    def kv_landed(self, num_tokens: int) -> None:
        """A PD decode replica wrote `num_tokens` tokens of received KV into its pool: host
        time (`kv_land_s` + `kv_land_token_s` per token, `CostParams`) its next step waits for."""
        if num_tokens <= 0:  # the whole prompt was cached here: nothing to write
            return
        p = self.cost_model.params
        self.pending_host_s += p.kv_land_s + p.kv_land_token_s * num_tokens

    def wake(self) -> None:
        if self.on_wake is not None:  # stepped by a group: wake it instead
            self.on_wake()
            return
        if not self._wake.triggered:
            self._wake.succeed()

    @property
    def busy_s(self) -> float:
        """Seconds this replica spent in steps (and their swap transfers)."""
        return self._busy_closed + (self._busy_end - self._busy_start)

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV pool in use now; inside a decode burst, what stepping one by one
        would show: the blocks of the steps scheduled by now (each step's are taken when it is
        scheduled, and a step ending now has let the next one be scheduled)."""
        pool = self.scheduler.kv_cache_manager.block_pool
        if self._burst_blocks is None:
            return 1.0 - pool.num_free_blocks / pool.num_blocks  # (BlockPool.usage)
        free, bs, before, held = self._burst_blocks
        ends = self._burst_ends
        j = min(len(ends), 1 + bisect_right(ends, self.env.now))  # steps scheduled
        for b, n in zip(before, held):
            need = -(-(b + j) // bs) - n
            if need > 0:
                free -= need
        return 1.0 - free / pool.num_blocks

    # ---- the engine loop ----
    def _run(self):
        env = self.env
        sched = self.scheduler
        while True:
            if not sched.has_unfinished_requests():
                yield from self._sleep()
                continue
            now = env.now
            out = sched.schedule(now)
            if out.kv_to_receive and self.on_kv_to_receive:
                self.on_kv_to_receive(self, out.kv_to_receive)
            if out.is_empty:
                self.report_finished(sched.update(out, StepResult(0.0), now))
                if not sched.running and not out.preempted_req_ids:
                    yield from self._sleep()  # until an arrival or a KV transfer event
                continue
            swap_bytes = out.swap_in_bytes + out.swap_out_bytes
            if swap_bytes and self.pcie is not None:
                yield self.pcie.transfer(swap_bytes)
            k = sched.max_decode_burst(out, self.max_decode_burst) if self.max_decode_burst > 1 else 1
            start = env.now
            if k > 1 and self.track_burst_usage:
                self._burst_blocks = (self.scheduler.kv_cache_manager.num_free_blocks,
                                      sched.block_size, burst_decode_before(out),
                                      [len(ids) for ids in out.block_ids])
            ends = yield from self._steps(out.shape, k, burst_segments(out, k) if k > 1 else None)
            self._burst_blocks = None
            handoff = self._handoff_s(out) if self.on_kv_ready else 0.0
            if handoff > 0:  # the prefill worker hands KV and first tokens over, then steps on
                yield env.timeout(handoff)
                ends[-1] = env.now
            result = StepResult(ends[-1] - start, None, ends if len(ends) > 1 else None)
            end = env.now
            self.mark_busy(now, end, result.num_steps)
            self.timeline.record_step(self.name, start, ends, out, sched)
            self.report_finished(sched.update(out, result, end))
            if self.on_kv_ready is not None:
                ready = sched.pop_kv_ready()
                if ready:
                    self.on_kv_ready(self, ready)

    def mark_busy(self, start: float, end: float, num_steps: int = 1) -> None:
        """Count `num_steps` steps from `start` to `end` (s) in `busy_s` and `num_steps`."""
        if start != self._busy_end:  # a new run of steps begins
            self._busy_closed += self._busy_end - self._busy_start
            self._busy_start = start
        self._busy_end = end
        self.num_steps += num_steps

    def _steps(self, shape: BatchShape, k: int,
               segments: Iterator[tuple[BatchShape, int]] | None = None):
        """Run the next `k` steps from `shape` (k > 1: a decode burst); returns their end
        times (s), each reached exactly (`_until`). A wake-up (an arrival, a KV landing, a
        neighbour starting or ending a step) cuts a burst at the step in progress, so bursts equal step-by-step simulation.
        `segments`: the burst as runs of one batch shape each (`burst_segments`: after a lead
        step, past finishing requests), priced in chunks (`_in_chunks`), each only once the
        previous has run uncut.
        Alone on its host the step in progress then ends as planned. Sharing a host
        (`simulator.cost.host_share`), a step progresses at 1 / (its price while the
        neighbours' state holds) of its work per second: a wake-up re-prices the rest of the
        step in progress."""
        env = self.env
        segments = _in_chunks(segments if segments is not None else iter(((shape, k),)))
        base, mem = self._begin_steps(*next(segments))
        if k == 1 and self.host_sharing is None:  # nothing can change its price
            yield env.timeout(base[0])
            return [env.now]
        if len(base) == 1 and k > 1:  # a one-step first run (a lead step): price the next too
            self._price_more(base, mem, next(segments))
        ends: list[float] = []
        work = 1.0  # of step len(ends) still to do
        while len(ends) < len(base):
            seg = env.now  # (a planned end exactly, or a wake-up under host sharing)
            prices = self._prices(base[len(ends):] if ends else base, mem[len(ends):])
            plan = list(accumulate(prices if work == 1.0 else [work * prices[0], *prices[1:]],
                                   initial=seg))
            del plan[0]
            if self._burst_blocks is not None:  # (what `kv_usage` reads mid-burst)
                self._burst_ends = ends + plan
            self._wake = wake = env.event()
            timer = _until(env, plan[-1])
            yield _first_of(env, timer, wake)
            now = env.now
            # (plan is non-decreasing: the steps that ended by now lead it)
            done = len(plan) if timer.processed else bisect_right(plan, now)
            ends.extend(plan[:done] if done < len(plan) else plan)
            if len(ends) == len(base):
                nxt = next(segments, None) if not self._wake.triggered else None
                if nxt is None:
                    break
                self._price_more(base, mem, nxt)
                continue
            if self.host_sharing is None:
                # nothing re-prices the step in progress: it ends as planned. A wake-up just as
                # a step ended was caused at that instant, after the next step was scheduled
                # there (step by step, that step's end event predates it), so it runs too
                ends.append(plan[done])
                yield _until(env, plan[done])
                break
            if done and plan[done - 1] == now:
                break  # woken just as a step ended: none in progress
            began = plan[done - 1] if done else seg  # the step in progress began then
            work = (1.0 if done else work) - (now - began) / prices[done]
            base, mem = base[:len(ends) + 1], mem[:len(ends) + 1]  # cut after it
            segments = iter(())
        self._leave_step()
        return ends

    def _price_more(self, base: list[float], mem: list[float], segment: tuple[BatchShape, int]) -> None:
        """Extend a burst's prices (`base`, `mem`, in place) with the next run of steps."""
        more, more_mem = self._run_times(*segment)
        base.extend(more)
        mem.extend(more_mem)

    def _run_times(self, shape: BatchShape, n: int) -> tuple[list[float], list[float]]:
        """Seconds alone (loop overhead included) and memory seconds (empty without host
        sharing) of `n` all-decode steps from `shape`."""
        cm = self.cost_model
        lo = self.loop_overhead_s  # the loop's host time streams no memory
        hs = self.host_sharing
        if hs is None:
            return cm.decode_run_list(shape, n, lo), []
        alone = cm.decode_run_list(shape, n)
        # (elementwise: the same float additions as decode_run_list's)
        return ([t + lo for t in alone] if lo else alone), hs.memory_seconds_run(shape, alone)

    def _handoff_s(self, out) -> float:
        """Host seconds a prefill replica spends handing off the prompts `out` completes (they
        sample a first token): `kv_handoff_step_s` once, `kv_handoff_s` each and
        `kv_handoff_token_s` per prompt token (`CostParams`)."""
        p = self.cost_model.params
        if not (p.kv_handoff_step_s or p.kv_handoff_s or p.kv_handoff_token_s):
            return 0.0
        done = [req.num_prompt_tokens for req, before, n in zip(
            out.reqs, out.num_computed_before, out.num_new_tokens)
            if before + n == req.num_tokens and req.num_output_tokens == 0]
        if not done:
            return 0.0
        return p.kv_handoff_step_s + p.kv_handoff_s * len(done) + p.kv_handoff_token_s * sum(done)

    def _begin_steps(self, shape: BatchShape, k: int) -> tuple[list[float], list[float]]:
        """Seconds alone and memory seconds of the next `k` steps from `shape`; with host sharing, marks
        this replica in a step (its memory fraction from the first step) and wakes its
        neighbours to re-price theirs."""
        cm = self.cost_model
        # all-decode steps take the arithmetic of a decode burst whether or not they run as
        # one, so bursts and single steps give bit-identical times
        decode = not shape.num_prefill_reqs and shape.num_reqs > 0
        hs = self.host_sharing
        lo = self.loop_overhead_s  # the loop's host time streams no memory
        if k > 1:
            base, mem = self._run_times(shape, k)
        else:
            base = [cm.decode_step_time(shape) if decode else cm.step_time(shape)]
            if hs is None:
                mem = []
            elif not decode:
                mem = [hs.memory_seconds(shape, base[0])]
            else:
                mem = hs.memory_seconds_run(shape, base)
            if lo:
                base[0] += lo
        if self.pending_host_s:  # KV written into the pool since the last step began
            base[0] += self.pending_host_s
            self.pending_host_s = 0.0
        if self._idle_since is not None:  # the first step after an idle spell (0 s if none)
            base[0] += cm.params.wake_extra_s(self.env.now - self._idle_since)
            self._idle_since = None
        if hs is None:
            return base, mem
        self.mem_fraction = mem[0] / base[0] if base[0] > 0 else 0.0
        self.in_step = True
        for n in self.neighbours:
            n.wake()
        return base, mem

    def _prices(self, base: list[float], mem: list[float]) -> list[float]:
        """Seconds of steps (alone `base`, memory `mem`) at the neighbours' state now: a
        step beside a neighbour in a step streams memory at 1 - (1 - s) f of the bandwidth
        (f: the busiest neighbour's memory share of its step) and computes at c of its
        speed."""
        hs = self.host_sharing
        if hs is None:
            return base
        busy = [n.mem_fraction for n in self.neighbours if n.in_step]
        f = max(busy) if busy else None
        return [hs.price(b, m, f) for b, m in zip(base, mem)]

    def _leave_step(self) -> None:
        if self.host_sharing is not None:
            self.in_step = False
            for n in self.neighbours:
                n.wake()

    def _sleep(self):
        if self._idle_since is None:  # (a wake-up that finds nothing to do keeps the spell)
            self._idle_since = self.env.now
        self._wake = self.env.event()
        yield self._wake

    def report_finished(self, finished: list[Request]) -> None:
        """Hand the requests a step finished to `on_finished` (its own loop's, or a group's)."""
        if not finished:
            return
        for req in finished:
            self.outstanding_tokens -= req.num_prompt_tokens + req.max_tokens
        if self.on_finished is not None:
            self.on_finished(self, finished)


FIRST_CHUNK_STEPS = 32


def _in_chunks(segments: Iterator[tuple[BatchShape, int]],
               size: int = FIRST_CHUNK_STEPS) -> Iterator[tuple[BatchShape, int]]:
    """`segments` (runs of all-decode steps of one shape each) cut into runs of at most
    `size`, then 2 `size`, 4 `size`, ... steps. A burst is priced one run at a time and most are
    cut by an arrival long before their end; the doubling keeps the timers of a long uncut burst
    to O(log k). The times are those of the whole run (`BatchShape.advanced` is exact)."""
    for shape, n in segments:
        while n > size:
            yield shape, size
            shape = shape.advanced(size)
            n -= size
            size *= 2
        yield shape, n


def _first_of(env: simpy.Environment, a: simpy.Event, b: simpy.Event) -> simpy.Event:
    """An event that succeeds when the first of `a` and `b` is processed: `a | b` (a simpy
    AnyOf) with the same scheduling (one event, scheduled from the first one's callbacks),
    without the condition's value bookkeeping. Neither may have been processed yet."""
    first = env.event()

    def fire(_event: simpy.Event) -> None:
        if not first.triggered:
            first.succeed()

    a.callbacks.append(fire)
    b.callbacks.append(fire)
    return first
