"""How a model is split over a replica's tensor-parallel (TP) x pipeline-parallel (PP) GPUs.

Follows vLLM: attention heads, FFN columns and the vocabulary are split TP ways; KV heads
are split when there are at least `tp` of them and replicated otherwise; layers are split
into PP contiguous stages. Shared by the cost model and the memory plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.cost.dtypes import matrix_weight_bytes, normalize_dtype
from simulator.cost.models import ModelSpec
from simulator.cost.moe_cost import mla_terms, stage_layer_split


@dataclass(frozen=True)
class ShardPlan:
    """Per-GPU slice of a model (counts per TP rank; layers per PP stage)."""

    tp: int
    pp: int
    heads: int  # query heads per rank
    kv_heads: int  # KV heads per rank (replicated when num_kv_heads < tp)
    ffn: int  # FFN columns per rank (per expert: moe_intermediate / (tp / ep))
    vocab: int  # vocabulary rows per rank (ceil)
    layers_per_stage: tuple[int, ...]
    ep: int = 1  # expert-parallel degree, dividing tp: each rank holds num_experts / ep
    # experts, each split tp / ep ways (1: every expert split tp ways; tp: whole experts)

    def layer_matrix_params(self, model: ModelSpec) -> int:
        """Attention + all experts' MLP weights of one layer on one rank."""
        mlp = (3 if model.gated_mlp else 2) * model.hidden_size * self.ffn
        return self.attention_params(model) + model.num_experts * mlp

    def attention_params(self, model: ModelSpec) -> float:
        """Attention weights (QKV and output projections; MLA's latent ones) of one layer on
        one rank."""
        return sum(self.attention_split(model))

    def attention_split(self, model: ModelSpec) -> tuple[float, float]:
        """(input projections, output projection) weights of one layer's attention on one
        rank: q/k/v (MLA's latent ones; a linear-attention layer's q/k/v, gate and rates) and
        o (a linear-attention layer's out_proj)."""
        if model.is_mla:
            t = mla_terms(model, self.tp)
            return t.w_qkv, t.w_o
        d, hd = model.hidden_size, model.head_dim
        q = self.heads * (2 if model.attn_output_gate else 1)
        qkv, o = d * (q + 2 * self.kv_heads) * hd, self.heads * hd * d
        if not model.has_linear_attention:
            return qkv, o
        # the layers' mean: linear-attention layers assumed spread evenly over the stages
        share = model.num_linear_layers / model.num_layers
        lin = self.linear_attention_params(model)
        lin_o = model.linear_value_heads * model.linear_value_head_dim * d / self.tp
        return (qkv + share * (lin - lin_o - qkv), o + share * (lin_o - o))

    def linear_attention_params(self, model: ModelSpec) -> float:
        """Matrices of one linear-attention layer on one rank: its heads split tp ways."""
        return model.linear_attn_matrix_params / self.tp

    def stage_layer_params(self, model: ModelSpec, s: int) -> float:
        """Attention + MLP weights of stage `s`'s layers on one rank, for MoE (dense first
        layers, shared experts, E/ep whole experts with EP) and MLA models."""
        dense, moe = stage_layer_split(model, self.layers_per_stage, s)
        n_mats = 3 if model.gated_mlp else 2
        attn = self.attention_params(model)
        routed = (model.num_experts / self.ep) * n_mats * model.expert_width * self.ffn
        dense_mlp = (model.dense_mlp_params if model.is_moe else model.expert_matrix_params)
        fixed = model.shared_expert_params / self.tp + model.latent_proj_params
        return (self.layers_per_stage[s] * attn + moe * (routed + fixed)
                + dense * dense_mlp / self.tp)

    def stage_weight_bytes(self, model: ModelSpec, dtype: str,
                           matrix_bytes: float | None = None) -> list[float]:
        """Weight bytes on one GPU of each PP stage (embeddings on the first, LM head and
        final norm on the last; a tied LM head is stored again on the last stage when pp>1).
        `matrix_bytes`: bytes per matrix weight (default: `dtype`'s, int4 with 128-groups)."""
        dt = normalize_dtype(dtype)
        hi = 4.0 if dt == "fp32" else 2.0  # norms, biases, embeddings stay in 16 bits
        d = model.hidden_size
        p = model.embed_proj_dim or d
        variant = (model.is_moe or model.is_mla or model.has_linear_attention
                   or bool(model.mlp_free_layer_ids))
        mb = matrix_weight_bytes(dt) if matrix_bytes is None else matrix_bytes
        per_layer = (self.layer_matrix_params(model) * mb
                     + model.layer_small_params * hi)
        embed = (self.vocab * p + model.num_learned_positions * d
                 + (2 * p * d if p != d else 0)) * hi
        norm = (model.norm_params if model.final_norm else 0) * hi
        lm_head = (self.vocab * p + (self.vocab if model.lm_head_bias else 0)) * hi
        out = []
        for s, layers in enumerate(self.layers_per_stage):
            b = layers * per_layer
            if variant:
                b = (self.stage_layer_params(model, s) * mb
                     + layers * model.small_params / model.num_layers * hi)
            if s == 0:
                b += embed
            if s == self.pp - 1:
                b += norm
                if not model.tie_word_embeddings or self.pp > 1:
                    b += lm_head
            out.append(b)
        return out


def split_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Contiguous stage sizes; the first `num_layers % pp` stages get one extra layer
    (the last stage also runs the LM head, so it gets the smaller share)."""
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if s < extra else 0) for s in range(pp))


def shard_model(model: ModelSpec, tp: int = 1, pp: int = 1, ep: int = 1) -> ShardPlan:
    """The per-GPU slice of `model` for TP x PP (x EP for the experts); raises ValueError
    saying why a degree is invalid."""
    check_ep(model, tp, ep)
    for label, v in (("tensor-parallel degree tp", tp), ("pipeline-parallel degree pp", pp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{label} must be a positive integer, got {v!r}")
    name = model.name
    if model.num_heads % tp:
        raise ValueError(
            f"tp={tp} does not divide num_heads={model.num_heads} of {name}: each tensor-parallel "
            f"rank must hold whole attention heads (valid tp: {_divisors(model.num_heads)})")
    kv = model.num_kv_heads
    if kv >= tp and kv % tp:
        raise ValueError(f"tp={tp} does not divide num_kv_heads={kv} of {name}: KV heads are "
                         "split across ranks, so tp must divide them")
    if kv < tp and tp % kv:
        raise ValueError(f"tp={tp} is not a multiple of num_kv_heads={kv} of {name}: with more "
                         "ranks than KV heads each KV head is replicated an equal number of times")
    moe_tp = tp // ep  # the ranks that split each expert (all tp of them without EP)
    if model.ffn_size % moe_tp:
        what = (f"tp / ep = {moe_tp}" if ep > 1 else f"tp={tp}")
        raise ValueError(f"{what} does not divide ffn_size={model.ffn_size} of {name}: each rank "
                         "holds an equal slice of the MLP" + (" (of each expert)" if ep > 1 else ""))
    if model.linear_kind == "mamba2":  # (vLLM replicates the B/C groups when tp is a multiple)
        groups = model.linear_key_heads
        split = ([(groups, "n_groups")] if groups and tp % groups else []) + [
            (model.linear_value_heads, "mamba_num_heads")]
    else:
        split = [(model.linear_key_heads, "linear_num_key_heads"),
                 (model.linear_value_heads, "linear_num_value_heads")]
    for heads, key in split:
        if heads and heads % tp:
            raise ValueError(f"tp={tp} does not divide {key}={heads} of {name}: each rank "
                             f"holds whole linear-attention heads (valid tp: {_divisors(heads)})")
    if pp > model.num_layers:
        raise ValueError(f"pp={pp} exceeds the {model.num_layers} layers of {name}")
    return ShardPlan(
        tp=tp, pp=pp, heads=model.num_heads // tp, kv_heads=max(1, kv // tp),
        ffn=model.ffn_size // moe_tp, vocab=-(-model.vocab_size // tp),
        layers_per_stage=split_layers(model.num_layers, pp), ep=ep)


def check_ep(model: ModelSpec, tp: int, ep: int) -> None:
    """ValueError unless `ep` is 1 or, for an MoE model, divides both tp and its experts: the
    attention's TP group holds the experts in ep groups of tp / ep ranks, each group E / ep
    experts split tp / ep ways (ep = tp: whole experts per rank, as vLLM's
    --enable-expert-parallel within a TP group; 1 < ep < tp: SGLang's --ep-size, TensorRT-LLM's
    moe_expert_parallel_size beside moe_tensor_parallel_size)."""
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ValueError(f"expert-parallel degree ep must be a positive integer, got {ep!r}")
    if ep == 1:
        return
    if not model.is_moe:
        raise ValueError(f"ep={ep}: {model.name} is a dense model with no experts to split; "
                         "use ep: 1")
    if model.num_experts % ep:
        raise ValueError(f"ep={ep} does not divide the {model.num_experts} experts of "
                         f"{model.name}: each rank must hold the same number of whole experts "
                         f"(valid ep: {_divisors(model.num_experts)})")
    if tp % ep:
        raise ValueError(f"ep={ep} does not divide tp={tp}: the attention's tensor-parallel GPUs "
                         f"hold the experts in ep groups of tp / ep GPUs (valid ep: "
                         f"{[e for e in _divisors(tp) if model.num_experts % e == 0]})")


def check_a2a(backend: str, ep: int, tp: int, *, a2a: str, ep_key: str, tp_key: str) -> None:
    """ValueError unless the MoE all-to-all `backend` is "none" or has whole experts on other
    GPUs to reach (`ep` = `tp` > 1); `a2a`, `ep_key` and `tp_key` name where the caller read
    them."""
    if backend != "none" and ep == 1:
        raise ValueError(f"{a2a} {backend}, but {ep_key} is 1: an all-to-all dispatches tokens "
                         f"to experts held on other GPUs, so it needs {ep_key} = {tp_key} > 1")
    if backend != "none" and ep != tp:
        raise ValueError(f"{a2a} {backend} with {ep_key} = {ep} < {tp_key} = {tp}: the "
                         "all-to-all is modelled for whole experts per GPU only "
                         f"({ep_key} = {tp_key}); use moe_a2a_backend none")


def check_dp_ep(ep: int, tp: int, *, dp: str, ep_key: str, tp_key: str) -> None:
    """ValueError where data-parallel attention meets expert-parallel groups smaller than TP
    (1 < `ep` < `tp`): it is modelled with the experts split tp ways or whole per GPU; `dp`,
    `ep_key` and `tp_key` name where the caller read them."""
    if 1 < ep < tp:
        raise ValueError(f"{dp} with {ep_key} = {ep} < {tp_key} = {tp}: data-parallel attention "
                         f"is modelled with the experts split tp ways ({ep_key} 1) or whole per "
                         f"GPU ({ep_key} = {tp_key})")


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 64) + 1) if n % k == 0]
