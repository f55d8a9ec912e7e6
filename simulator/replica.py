"""`SimReplica`: one serving replica (a TP x PP group) as a SimPy process.

It runs the shared core's engine step with a cost-model clock: `schedule(now)`,
a duration from the cost model (plus PCIe time for swap traffic), then
`update(output, result, end)`. With nothing to do it sleeps on an event (no
polling). Runs of identical all-decode steps are simulated as one *decode burst*
(`Scheduler.max_decode_burst`); an arrival or a KV landing during a burst cuts
it at the step in progress, so results equal step-by-step simulation.

Replicas sharing one host (`cluster.host_memory_share`, `host_compute_share`) stretch a
step that starts while a neighbour is in a step (`simulator.host_share`); a neighbour
starting or ending a step wakes the others, so a burst is re-priced from its next step.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate

import simpy

from simulator.core.batch_shape import BatchShape
from simulator.core.request import Request
from simulator.core.scheduler import Scheduler
from simulator.core.scheduler_output import StepResult
from simulator.host_share import HostSharing
from simulator.links import SimLink
from simulator.timeline import Timeline


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
    ) -> None:
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
        self.busy_s = 0.0
        # host sharing (`cluster.host_memory_share`, `host_compute_share`): prices a step
        # that starts while a neighbour (a replica on the same host) is in a step
        self.host_sharing: HostSharing | None = None
        self.neighbours: list[SimReplica] = []
        self.in_step = False
        self.mem_fraction = 0.0  # of the step in progress: memory seconds / step seconds
        self.process = env.process(self._run())

    # ---- intake (called by routers and the PD link) ----
    def submit(self, req: Request) -> None:
        req.annotations.setdefault("replicas", []).append(self.name)
        req.annotations["replica"] = self.name
        self.outstanding_tokens += req.num_prompt_tokens + req.max_tokens
        self.scheduler.add_request(req, self.env.now)
        self.wake()

    def wake(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    @property
    def kv_usage(self) -> float:
        return self.scheduler.kv_cache_manager.usage

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
                self._finish(sched.update(out, StepResult(0.0), now))
                if not sched.running and not out.preempted_req_ids:
                    yield from self._sleep()  # until an arrival or a KV transfer event
                continue
            swap_bytes = out.swap_in_bytes + out.swap_out_bytes
            if swap_bytes and self.pcie is not None:
                yield self.pcie.transfer(swap_bytes)
            k = sched.max_decode_burst(out, self.max_decode_burst) if self.max_decode_burst > 1 else 1
            start = env.now
            durations = self._durations(out.shape, k)
            if k == 1:
                duration = durations[0]
                yield env.timeout(duration)
                result = StepResult(duration)
            else:
                ends = yield from self._burst(durations, start)
                result = StepResult(ends[-1] - start, None, ends if len(ends) > 1 else None)
            self._leave_step()
            end = env.now
            self.busy_s += end - now
            self.num_steps += result.num_steps
            self.timeline.record_step(self.name, start, end, out, result.num_steps, sched)
            self._finish(sched.update(out, result, end))
            if self.on_kv_ready is not None:
                ready = sched.pop_kv_ready()
                if ready:
                    self.on_kv_ready(self, ready)

    def _durations(self, shape: BatchShape, k: int) -> list[float]:
        """Seconds of the next `k` steps from `shape` (k > 1: a decode burst). Sharing a host
        (`simulator.host_share`), a step that starts while a neighbour is in a step streams
        memory at 1 - (1 - s) f of the bandwidth (f: the busiest neighbour's memory share of
        its step) and computes at c of its speed."""
        cm = self.cost_model
        base = [cm.step_time(shape)] if k == 1 else cm.decode_run_times(shape, k).tolist()
        hs = self.host_sharing
        if hs is None:
            return base
        mem = [hs.memory_seconds(shape, base[0])] if k == 1 else hs.memory_seconds_run(shape, base)
        self.mem_fraction = mem[0] / base[0] if base[0] > 0 else 0.0
        busy = [n.mem_fraction for n in self.neighbours if n.in_step]
        f = max(busy) if busy else None
        self.in_step = True
        for n in self.neighbours:  # re-price their bursts from their next step
            n.wake()
        return [hs.price(b, m, f) for b, m in zip(base, mem)]

    def _leave_step(self) -> None:
        if self.host_sharing is not None:
            self.in_step = False
            for n in self.neighbours:
                n.wake()

    def _burst(self, durations: list[float], start: float):
        """Run the burst's decode steps; a wake-up cuts it at the step in progress."""
        env = self.env
        ends = list(accumulate(durations, initial=start))[1:]
        self._wake = env.event()
        timer = env.timeout(ends[-1] - start)
        yield timer | self._wake
        woke_at = env.now
        if woke_at < ends[-1]:  # woken early: finish the step in progress, then stop
            cut = next(j for j, e in enumerate(ends) if e >= woke_at)
            ends = ends[: cut + 1]
            if ends[-1] > woke_at:
                yield env.timeout(ends[-1] - woke_at)
        return ends

    def _sleep(self):
        self._wake = self.env.event()
        yield self._wake

    def _finish(self, finished: list[Request]) -> None:
        if not finished:
            return
        for req in finished:
            self.outstanding_tokens -= req.num_prompt_tokens + req.max_tokens
        if self.on_finished is not None:
            self.on_finished(self, finished)
