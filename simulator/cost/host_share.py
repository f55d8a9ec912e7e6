"""Host sharing: engines on one host (kvpd's CPU validation runs 1P1D as two processes on one
machine) slow each other down while both are in a step.

A step's time splits into memory seconds m and the rest k (the cost model's decomposition).
While a neighbour is in a step whose memory share of time is f:
- memory streams at 1 - (1 - s) f of the bandwidth (`cluster.host_memory_share` = s; two
  pure streams: s each): m becomes m / (1 - (1 - s) f);
- the rest runs at c of its speed alone (`cluster.host_compute_share` = c: a busy neighbour
  core takes shared caches and clock headroom): k becomes k / c.
A step alone takes m + k. The price holds while the neighbour's state holds: a step
progresses at 1 / (its price now) of its work per second, so a neighbour that starts or ends
a step part-way through changes the rest of it (`finish_s`). The simulator (`SimReplica`) and
`kvpd validate`'s check on the real PD workers' steps price steps with these functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from simulator.cost.costmodel import CostModel

REFERENCE_SHARE = 0.5  # bandwidth of the reference model that splits out memory seconds


def contended_cost_model(cm: CostModel, share: float) -> CostModel:
    """`cm` on a device that streams memory at `share` x its bandwidth."""
    acc = dataclasses.replace(cm.accelerator,
                              mem_bw_bytes_per_s=cm.accelerator.mem_bw_bytes_per_s * share)
    return CostModel(cm.model, acc, cm.dtype, cm.tp, cm.pp, cm.params,
                     kv_cache_dtype=cm.kv_cache_dtype, link=cm.link, ep=cm.ep, ep_link=cm.ep_link,
                     allreduce=cm.allreduce, attention_backend=cm.attention_backend,
                     moe_a2a_backend=cm.moe_a2a_backend, fused_moe_config=cm.fused_moe_config)


def memory_seconds(alone_s: float, contended_s: float, share: float) -> float:
    """Memory seconds of a step from its time alone and at `share` < 1 of the bandwidth
    (memory seconds scale with 1 / bandwidth: t(s) - t(1) = m (1/s - 1))."""
    return max(0.0, (contended_s - alone_s) / (1.0 / share - 1.0))


def shared_time(alone_s: float, memory_s: float, memory_share: float, compute_share: float,
                neighbour_fraction: float | None) -> float:
    """A step's seconds when it starts beside a neighbour in a step spending
    `neighbour_fraction` of it on memory (None: no neighbour in a step: `alone_s`)."""
    f = neighbour_fraction
    if f is None:
        return alone_s
    rest = (alone_s - memory_s) / compute_share
    return rest + memory_s / (1.0 - (1.0 - memory_share) * f)


class HostSharing:
    """Prices steps of one engine on a shared host: `memory_seconds` of a step or a
    decode burst (from the cost model) and `price` (a step's seconds beside a neighbour)."""

    def __init__(self, cm: CostModel, memory_share: float = 1.0, compute_share: float = 1.0) -> None:
        if not (0 < memory_share <= 1 and 0 < compute_share <= 1):
            raise ValueError(f"host shares must be in (0, 1], got memory {memory_share}, "
                             f"compute {compute_share}")
        self.memory_share = memory_share
        self.compute_share = compute_share
        self.reference = contended_cost_model(cm, REFERENCE_SHARE)

    def memory_seconds(self, shape, alone_s: float) -> float:
        """Memory seconds of one step of `shape` that takes `alone_s` alone."""
        return memory_seconds(alone_s, self.reference.step_time(shape), REFERENCE_SHARE)

    def memory_seconds_run(self, shape, alone_s: list[float]) -> list[float]:
        """Memory seconds of a decode burst of len(alone_s) steps from `shape`."""
        slow = self.reference.decode_run_list(shape, len(alone_s))
        return [memory_seconds(a, c, REFERENCE_SHARE) for a, c in zip(alone_s, slow)]

    def price(self, alone_s: float, memory_s: float, neighbour_fraction: float | None) -> float:
        return shared_time(alone_s, memory_s, self.memory_share, self.compute_share,
                           neighbour_fraction)

    def finish_s(self, alone_s: float, memory_s: float, start: float,
                 neighbour_steps: Iterable[tuple[float, float, float]]) -> float:
        """Seconds a step started at `start` (s) takes beside a neighbour whose steps are
        `neighbour_steps`: (start s, end s, memory fraction) in time order, not overlapping.
        Each stretch of wall time does 1 / (the price then) of the step's work."""
        t, work = start, 1.0
        for t0, t1, f in neighbour_steps:
            if t1 <= t:
                continue
            for until, frac in ((t0, None), (t1, f)):  # the gap before the step, then the step
                if until <= t:
                    continue
                full = self.price(alone_s, memory_s, frac)
                if work * full <= until - t:
                    return t + work * full - start
                work -= (until - t) / full
                t = until
        return t + work * alone_s - start
