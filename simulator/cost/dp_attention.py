"""The step time of a replica that runs data-parallel attention (`cluster.dp_attention`).

Each of the replica's tp GPUs is an attention rank with requests of its own: it runs the
attention side of every layer (QKV and output projections, attention, norms, the LM head and
sampling, the per-layer kernel floors, the host's per-step work) for its own tokens with the
whole attention weights. Then all tp GPUs run the MoE layers together over every rank's
tokens, the experts split ep ways (ep = tp: each GPU its E / ep experts) or tp ways (ep = 1):
the hidden states are all-gathered before the experts and reduce-scattered after, together
the bytes of one all-reduce per layer. That is what the engines do by default: SGLang without
an all-to-all backend (`--moe-a2a-backend none`), vLLM's `allgather_reducescatter` all2all
backend, TensorRT-LLM's allgather / reducescatter around its MoE. With
`cluster.moe_a2a_backend: all_to_all` (DeepEP-style) each rank instead dispatches its own
tokens to their experts' ranks and combines them back, so the MoE layers' traffic is the
busiest rank's all-to-all (the experts model's `ep_all_to_all` at that rank's tokens); the
dense layers (DeepSeek's first three) still gather and scatter. The ranks meet at every
layer, so a step takes the slowest rank's attention side plus the shared MoE side:

    step = max over ranks r of attention(rank r's batch) + moe(all ranks' tokens) + exchange

`attention(...)` is the `attention` cost model's operators of that side for the rank's batch
(a model on one GPU: tp = 1); `moe(...)` and the collectives are the `experts` cost model's
(tp GPUs, ep) for the step's tokens, which is all they depend on (cached by token count).
"""

from __future__ import annotations

import dataclasses

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.costmodel import CostModel
from simulator.cost.moe_cost import stage_layer_split
from simulator.cost.op_cost import OpCost, StepBreakdown

# the operators each side runs (simulator/cost/breakdown.py names)
ATTENTION_OPS = frozenset({"qkv_proj", "attn_prefill", "attn_decode", "attn_decode_setup",
                           "linear_attn", "o_proj", "norm_act_rope", "layer_overhead", "lm_head",
                           "sampling", "step_overhead", "scheduler_host"})
EXPERT_OPS = frozenset({"mlp", "moe_experts"})
GATHER_OP = "tp_allreduce"  # two all-reduces per layer at tp: half of it is gather + scatter
A2A_OP = "ep_all_to_all"  # the experts model's dispatch + combine (moe_a2a_backend all_to_all)
# priced by the rank's own tokens instead of the step's (the experts model's TP + EP form)
REPLACED_OPS = frozenset({A2A_OP})


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
        self.all_to_all = experts.all_to_all
        self._expert_s: dict[tuple[int, int], float] = {}
        self._attention_mlp_s: dict[int, float] = {}  # the one-GPU model's MLP ops by tokens

    def attention_ops(self, shape: BatchShape) -> list[OpCost]:
        """One rank's attention-side operators for its batch `shape`."""
        return [op for op in explain_step(self.attention, shape).ops if op.name in ATTENTION_OPS]

    def expert_ops(self, shape: BatchShape, busiest: BatchShape | None = None) -> list[OpCost]:
        """The shared side's operators for the step's tokens over all ranks, `shape`: the MoE
        (or dense MLP) layers and `dp_gather_scatter`, the all-gather before them and the
        reduce-scatter after (one all-reduce's bytes: half the experts model's two per layer).
        With the all-to-all, `ep_all_to_all` of the rank with the most tokens, `busiest`
        (default `shape`), and the gather and scatter of the dense layers only."""
        ops = explain_step(self.experts, shape).ops
        out = [op for op in ops if op.name in EXPERT_OPS]
        share = 0.5  # gather + scatter: one of the two all-reduces per layer
        if self.all_to_all:  # the experts model's all-reduces: one per layer + one per dense
            dense, _ = stage_layer_split(self.experts.model,
                                         self.experts.shard.layers_per_stage, 0)
            share = dense / (self.experts.shard.layers_per_stage[0] + dense)
            rank_ops = explain_step(self.experts, busiest or shape).ops
            out += [op for op in rank_ops if op.name == A2A_OP]
        if share > 0:
            out += [dataclasses.replace(op, name="dp_gather_scatter", bytes=share * op.bytes,
                                        time_s=share * op.time_s, memory_s=share * op.memory_s)
                    for op in ops if op.name == GATHER_OP]
        return out

    def attention_s(self, shape: BatchShape) -> float:
        """Seconds of one rank's attention side for its batch `shape` (0 for an idle rank):
        the one-GPU model's whole step (its fast path) less its MoE / MLP operators, which
        depend on the token count alone (cached by it); equal to the sum of
        `attention_ops(shape)`, which `explain_step` would price ~15x slower."""
        t = shape.num_tokens
        if t <= 0:
            return 0.0
        mlp = self._attention_mlp_s.get(t)
        if mlp is None:
            mlp = self._attention_mlp_s[t] = sum(
                op.time_s for op in explain_step(self.attention, shape).ops
                if op.name in EXPERT_OPS)
        return self.attention.step_time(shape) - mlp

    def expert_s(self, shape: BatchShape, busiest: BatchShape | None = None) -> float:
        """Seconds of the shared side for the step's tokens over all ranks, `shape` (they
        depend on the token count alone, and with the all-to-all on the busiest rank's:
        cached by them)."""
        t = shape.num_tokens
        if t <= 0:
            return 0.0
        b = busiest or shape
        key = (t, b.num_tokens if self.all_to_all else 0)
        cached = self._expert_s.get(key)
        if cached is None:
            cached = self._expert_s[key] = sum(op.time_s for op in self.expert_ops(shape, b))
        return cached

    def _busiest(self, busy: list[BatchShape]) -> BatchShape | None:
        """The rank shape with the most tokens, whose tokens the all-to-all moves (None
        without an all-to-all: nothing depends on it)."""
        return max(busy, key=lambda s: s.num_tokens) if self.all_to_all else None

    def step_time(self, shapes: list[BatchShape]) -> float:
        """Seconds of one lockstep step whose ranks computed `shapes` (idle ranks may be left
        out: they wait at every layer)."""
        busy = [s for s in shapes if s.num_tokens > 0]
        if not busy:
            return 0.0
        return (max(self.attention_s(s) for s in busy)
                + self.expert_s(merged_shape(busy), self._busiest(busy)))

    def breakdown(self, shapes: list[BatchShape]) -> StepBreakdown:
        """`step_time`'s operators: the slowest rank's attention side, then the MoE side over
        all ranks' tokens with `dp_gather_scatter` (half the experts model's two all-reduces
        per layer); its `total_s` is `step_time(shapes)`."""
        busy = [s for s in shapes if s.num_tokens > 0]
        if not busy:
            raise ValueError("no rank has tokens to compute")
        slow = max(busy, key=self.attention_s)
        total = merged_shape(busy)
        ops = self.attention_ops(slow) + self.expert_ops(total, self._busiest(busy))
        desc = {**self.experts.describe(), "dp_attention": True,
                "busiest_rank": {"num_tokens": slow.num_tokens, "num_reqs": slow.num_reqs}}
        return StepBreakdown(sum(op.time_s for op in ops), ops, total.num_tokens,
                             total.num_reqs, desc)
