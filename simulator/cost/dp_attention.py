"""The step time of a replica that runs data-parallel attention (`cluster.dp_attention`).

Each of the replica's tp GPUs is an attention rank with requests of its own: it runs the
attention side of every layer (QKV and output projections, attention, norms, the LM head and
sampling, the per-layer kernel floors, the host's per-step work) for its own tokens with the
whole attention weights. Then all tp GPUs run the MoE layers together over every rank's
tokens, the experts split ep ways (ep = tp: each GPU its E / ep experts) or tp ways (ep = 1):
the hidden states are all-gathered before the experts and reduce-scattered after, together
the bytes of one all-reduce per layer. That is what the engines do by default: SGLang without
an all-to-all backend (`--moe-a2a-backend none`), vLLM's `allgather_reducescatter` all2all
backend, TensorRT-LLM's allgather / reducescatter around its MoE; a DeepEP-style dispatch of
each rank's own tokens is not modelled. The ranks meet at every layer, so a step takes the
slowest rank's attention side plus the shared MoE side:

    step = max over ranks r of attention(rank r's batch) + moe(all ranks' tokens) + gather

`attention(...)` is the `attention` cost model's operators of that side for the rank's batch
(a model on one GPU: tp = 1); `moe(...)` and the collectives are the `experts` cost model's
(tp GPUs, ep) for the step's tokens, which is all they depend on (cached by token count).
"""

from __future__ import annotations

import dataclasses

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.costmodel import CostModel
from simulator.cost.op_cost import OpCost, StepBreakdown

# the operators each side runs (simulator/cost/breakdown.py names)
ATTENTION_OPS = frozenset({"qkv_proj", "attn_prefill", "attn_decode", "attn_decode_setup",
                           "o_proj", "norm_act_rope", "layer_overhead", "lm_head", "sampling",
                           "step_overhead"})
EXPERT_OPS = frozenset({"mlp", "moe_experts"})
GATHER_OP = "tp_allreduce"  # two all-reduces per layer at tp: half of it is gather + scatter
# priced by the gather and scatter instead (the experts model's TP + EP dispatch and combine)
REPLACED_OPS = frozenset({"ep_all_to_all"})


def merged_shape(shapes: list[BatchShape]) -> BatchShape:
    """The step's tokens over all ranks as one shape (what the MoE side computes)."""
    out = BatchShape()
    for s in shapes:
        out.num_reqs += s.num_reqs
        out.num_tokens += s.num_tokens
        out.num_decode_reqs += s.num_decode_reqs
        out.decode_context_tokens += s.decode_context_tokens
        out.num_prefill_reqs += s.num_prefill_reqs
        out.num_prefill_tokens += s.num_prefill_tokens
        out.prefill_context_tokens += s.prefill_context_tokens
        out.prefill_attn_pairs += s.prefill_attn_pairs
        out.max_context = max(out.max_context, s.max_context)
        out.max_decode_context = max(out.max_decode_context, s.max_decode_context)
    return out


class DPAttentionCost:
    """Step seconds of a data-parallel-attention replica from its ranks' batch shapes."""

    def __init__(self, attention: CostModel, experts: CostModel) -> None:
        if attention.tp != 1 or attention.pp != 1:
            raise ValueError("the attention side is one GPU's: tp = pp = 1")
        if experts.pp != 1 or experts.tp < 2:
            raise ValueError("the expert side runs over the replica's tp >= 2 GPUs at pp = 1")
        self.attention = attention
        self.experts = experts
        self.loop_overhead_s = attention.params.loop_overhead_s
        self._expert_s: dict[int, float] = {}

    def attention_ops(self, shape: BatchShape) -> list[OpCost]:
        """One rank's attention-side operators for its batch `shape`."""
        return [op for op in explain_step(self.attention, shape).ops if op.name in ATTENTION_OPS]

    def expert_ops(self, shape: BatchShape) -> list[OpCost]:
        """The shared side's operators for the step's tokens over all ranks, `shape`: the MoE
        (or dense MLP) layers and `dp_gather_scatter`, the all-gather before them and the
        reduce-scatter after (one all-reduce's bytes: half the experts model's two per layer)."""
        ops = explain_step(self.experts, shape).ops
        return [op for op in ops if op.name in EXPERT_OPS] + [
            dataclasses.replace(op, name="dp_gather_scatter", bytes=0.5 * op.bytes,
                                time_s=0.5 * op.time_s, memory_s=0.5 * op.memory_s)
            for op in ops if op.name == GATHER_OP]

    def attention_s(self, shape: BatchShape) -> float:
        """Seconds of one rank's attention side for its batch `shape` (0 for an idle rank)."""
        if shape.num_tokens <= 0:
            return 0.0
        return sum(op.time_s for op in self.attention_ops(shape))

    def expert_s(self, shape: BatchShape) -> float:
        """Seconds of the shared side for the step's tokens over all ranks, `shape` (they
        depend on the token count alone: cached by it)."""
        t = shape.num_tokens
        if t <= 0:
            return 0.0
        cached = self._expert_s.get(t)
        if cached is None:
            cached = self._expert_s[t] = sum(op.time_s for op in self.expert_ops(shape))
        return cached

    def step_time(self, shapes: list[BatchShape]) -> float:
        """Seconds of one lockstep step whose ranks computed `shapes` (idle ranks may be left
        out: they wait at every layer)."""
        busy = [s for s in shapes if s.num_tokens > 0]
        if not busy:
            return 0.0
        return max(self.attention_s(s) for s in busy) + self.expert_s(merged_shape(busy))

    def breakdown(self, shapes: list[BatchShape]) -> StepBreakdown:
        """`step_time`'s operators: the slowest rank's attention side, then the MoE side over
        all ranks' tokens with `dp_gather_scatter` (half the experts model's two all-reduces
        per layer); its `total_s` is `step_time(shapes)`."""
        busy = [s for s in shapes if s.num_tokens > 0]
        if not busy:
            raise ValueError("no rank has tokens to compute")
        slow = max(busy, key=self.attention_s)
        total = merged_shape(busy)
        ops = self.attention_ops(slow) + self.expert_ops(total)
        desc = {**self.experts.describe(), "dp_attention": True,
                "busiest_rank": {"num_tokens": slow.num_tokens, "num_reqs": slow.num_reqs}}
        return StepBreakdown(sum(op.time_s for op in ops), ops, total.num_tokens,
                             total.num_reqs, desc)
