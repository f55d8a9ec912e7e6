"""`SimDPGroup`: the attention ranks of one data-parallel-attention replica, stepped together.

A replica with `cluster.dp_attention` is tp attention ranks, each a `SimReplica` with a
scheduler and KV pool of its own that the router sends requests to (SGLang's DP controller
and vLLM's DP coordinator balance requests over the ranks, as kvpd's routers do over
replicas). The ranks run no engine loop of their own: the group steps them in lockstep, as
their MoE layers need every rank at every layer. Each step every rank schedules its own
requests; if any has work, the step takes `DPAttentionCost.step_time` of all their batches
(the slowest rank's attention plus the shared MoE side) and every rank's step ends then; a
rank with nothing scheduled idles through it (SGLang runs an idle batch for it). With nothing
to do on any rank the group sleeps until an arrival wakes it. Steps run one at a time (no
decode bursts).
"""

from __future__ import annotations

import simpy

from simulator.cluster.replica import SimReplica
from simulator.cluster.timeline import Timeline
from simulator.core.scheduler_output import StepResult
from simulator.cost.dp_attention import DPAttentionCost


class SimDPGroup:
    def __init__(self, env: simpy.Environment, name: str, ranks: list[SimReplica],
                 cost: DPAttentionCost, timeline: Timeline) -> None:
        self.env = env
        self.name = name
        self.ranks = ranks
        self.cost = cost
        self.timeline = timeline
        self.num_steps = 0
        self._wake = env.event()
        for r in ranks:
            r.on_wake = self.wake
        self.process = env.process(self._run())

    def wake(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    def _sleep(self):
        self._wake = self.env.event()
        yield self._wake

    def _run(self):
        env = self.env
        ranks = self.ranks
        while True:
            if not any(r.scheduler.has_unfinished_requests() for r in ranks):
                yield from self._sleep()
                continue
            now = env.now
            outs = [r.scheduler.schedule(now) for r in ranks]
            busy = [not o.is_empty for o in outs]
            for r, out, b in zip(ranks, outs, busy):
                if not b:  # nothing to run on this rank: its bookkeeping, at once
                    r.report_finished(r.scheduler.update(out, StepResult(0.0), now))
            if not any(busy):
                if not any(r.scheduler.running for r in ranks) \
                        and not any(o.preempted_req_ids for o in outs):
                    yield from self._sleep()  # until an arrival
                continue
            dt = self.cost.step_time([o.shape for o, b in zip(outs, busy) if b]) \
                + self.cost.loop_overhead_s
            yield env.timeout(dt)
            end = env.now
            self.num_steps += 1
            for r, out, b in zip(ranks, outs, busy):
                if not b:
                    continue
                r.mark_busy(now, end)
                self.timeline.record_step(r.name, now, [end], out, r.scheduler)
                r.report_finished(r.scheduler.update(out, StepResult(end - now), end))
