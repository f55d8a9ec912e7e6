"""Which all-reduce a serving engine runs for tensor parallelism, and what that costs per call.

One TP all-reduce of S bytes among tp GPUs over the scale-up link costs
`link.allreduce_fixed_s(tp)` plus 2 (tp - 1)/tp x S / (group bandwidth x efficiency)
(`allreduce_seconds`). Links with a fit in `links.yaml` (NVLink, Infinity Fabric) take it from
published communicator benchmarks of the engines' own kernels (vLLM's custom all-reduce,
TensorRT-LLM's and SGLang's one-/two-shot kernels, symmetric memory, under CUDA graphs);
others are a ring of 2 (tp - 1) hops at the cost model's `comm_efficiency`. An engine that
calls NCCL instead pays NCCL's fixed per-call work on top (proxy/protocol set-up, the extra
graph nodes NCCL inserts per call).

Large messages (a prefill's hidden states: tens to hundreds of MB) go to NCCL in every engine,
whose NVLink SHARP or ring reaches more of the link than the fit above, which was taken at
0.5-4 MiB. Where the link has a large-message fit, a call costs the cheaper of the two lines
(`large_allreduce_seconds`); the two cross once (`large_allreduce_crossover`).

`ALLREDUCE_EXTRA_S[impl]`: seconds each all-reduce call costs beyond that.
"""

from __future__ import annotations

import math

from simulator.cost.hardware import Link

# vLLM PR #2192 "Custom all reduce kernels" (2023-12-19), its latency table: Llama-70B,
# A100-80G, TP4, batch 64, 256 in / 256 out (benchmark_latency.py): 16.37 s with NCCL, 14.57 s
# with the custom kernels. The 1.80 s difference over 256 decode steps x 80 layers x 2
# all-reduces per layer = 1.80 / (256 x 160) = 44 us per call.
NCCL_EXTRA_PER_CALL_S = 1.80 / (256 * 160)

ALLREDUCE_EXTRA_S: dict[str, float] = {
    "custom": 0.0,  # the ring model as is
    "nccl": NCCL_EXTRA_PER_CALL_S,
}
ALLREDUCE_IMPLS = tuple(ALLREDUCE_EXTRA_S)


def allreduce_extra_s(impl: str) -> float:
    """Seconds one all-reduce call of `impl` costs beyond the ring model."""
    if impl not in ALLREDUCE_EXTRA_S:
        raise ValueError(f"all-reduce {impl!r} unknown; allowed: {', '.join(ALLREDUCE_IMPLS)}")
    return ALLREDUCE_EXTRA_S[impl]


def allreduce_seconds(link: Link, tp: int, nbytes: float, comm_efficiency: float,
                      impl: str = "custom") -> float:
    """Seconds of one all-reduce of `nbytes` among `tp` GPUs over `link`, as the cost model
    prices it (`comm_efficiency` applies where the link has no all-reduce fit)."""
    if tp <= 1:
        return 0.0
    ring = 2.0 * (tp - 1) / tp
    small = (link.allreduce_fixed_s(tp) + allreduce_extra_s(impl)
             + ring * nbytes * link.allreduce_seconds_per_byte(tp, comm_efficiency))
    large = large_allreduce_seconds(link, tp, nbytes)
    return small if large is None else min(small, large)


def large_allreduce_seconds(link: Link, tp: int, nbytes: float) -> float | None:
    """Seconds of NCCL's all-reduce of `nbytes` among `tp` GPUs on the link's large-message
    line (None where the link has no such fit)."""
    per_byte = link.large_allreduce_seconds_per_byte(tp)
    if per_byte is None or link.large_allreduce_call_s is None:
        return None
    return link.large_allreduce_call_s + nbytes * per_byte


def large_allreduce_crossover(link: Link, tp: int, comm_efficiency: float,
                              impl: str = "custom") -> tuple[float, float]:
    """(message bytes above which the large-message line is the cheaper, seconds it saves per
    message byte beyond them): (inf, 0) where it never is."""
    per_byte = link.large_allreduce_seconds_per_byte(tp)
    if per_byte is None or link.large_allreduce_call_s is None:
        return math.inf, 0.0
    ring = 2.0 * (tp - 1) / tp
    saved = ring * link.allreduce_seconds_per_byte(tp, comm_efficiency) - per_byte
    if saved <= 0:
        return math.inf, 0.0
    extra = link.large_allreduce_call_s - link.allreduce_fixed_s(tp) - allreduce_extra_s(impl)
    return max(0.0, extra / saved), saved

