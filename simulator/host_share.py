"""Host sharing (`cluster.host_memory_share` = s): engines on one host share its memory
bandwidth. A step that starts while a neighbour is in a step whose memory share of time is
f streams at 1 - (1 - s) f of the bandwidth (two pure streams: s each). The simulator
(`SimReplica`) and `kvpd validate`'s check on the real PD workers' steps price steps with
these functions.
"""

from __future__ import annotations

import dataclasses

from simulator.costmodel import CostModel


def contended_cost_model(cm: CostModel, share: float) -> CostModel:
    """`cm` on a device that streams memory at `share` x its bandwidth."""
    acc = dataclasses.replace(cm.accelerator,
                              mem_bw_bytes_per_s=cm.accelerator.mem_bw_bytes_per_s * share)
    return CostModel(cm.model, acc, cm.dtype, cm.tp, cm.pp, cm.params,
                     kv_cache_dtype=cm.kv_cache_dtype, link=cm.link)


def memory_fraction(alone_s: float, contended_s: float, share: float) -> float:
    """Share of a step's time spent on memory, from its time alone and at `share` of the
    bandwidth (memory seconds scale with 1 / bandwidth: t(s) - t(1) = m (1/s - 1))."""
    if alone_s <= 0 or share >= 1:
        return 0.0
    return (contended_s - alone_s) / (1.0 / share - 1.0) / alone_s


def shared_time(alone_s: float, contended_s: float, share: float, neighbour_fraction: float) -> float:
    """A step's seconds when it starts beside a neighbour spending `neighbour_fraction` of
    its step on memory (0: the time alone; 1: at `share` of the bandwidth)."""
    f = neighbour_fraction
    if f <= 0.0 or share >= 1:
        return alone_s
    g = (1.0 / (1.0 - (1.0 - share) * f) - 1.0) / (1.0 / share - 1.0)  # 0 (f = 0) .. 1 (f = 1)
    return alone_s + g * (contended_s - alone_s)
