"""Which all-reduce a serving engine runs for tensor parallelism, and what that costs per call.

The cost model prices a TP all-reduce as a ring over the scale-up link (bytes / bandwidth
plus 2 (tp - 1) hop latencies, simulator/cost/costmodel.py): the one-shot/two-shot kernels of
vLLM's custom all-reduce (and TensorRT-LLM's AllReduce plugin, SGLang's) come close to that
for the small messages of serving steps. An engine that calls NCCL instead pays NCCL's fixed
per-call work on top (proxy/protocol set-up, the extra graph nodes NCCL inserts per call).

`ALLREDUCE_EXTRA_S[impl]`: seconds each all-reduce call costs beyond the ring model.
"""

from __future__ import annotations

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
