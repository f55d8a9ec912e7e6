"""Per-stage roofline terms of mixtures of experts, expert parallelism and multi-head latent
attention, for `CostModel._stage_coefs` (kept apart from the dense terms).

Experts (per rank, over the stage's MoE layers):
- routed experts: each token runs `k` of `E`; T tokens touch E x (1 - (1 - k/E)^T) distinct
  experts on average (uniform, independent routing), and only those experts' weights stream
  from memory, so a decode step's bytes grow with the batch until every expert is hot.
  With tensor parallelism (ep = 1) every rank holds a 1/tp column slice of every expert;
  with expert parallelism (ep = tp) a rank holds E/ep whole experts and computes 1/ep of
  the token-expert pairs (routing balanced on average; imbalance is not modelled).
- always read: the router (d x E), shared experts, and the dense MLPs of the stage's dense
  layers (DeepSeek's first k), TP-split.
- communication: TP all-reduces the hidden state twice per layer. With EP it stays so by
  default (`moe_a2a_backend` "none"): every rank holds every token after the attention's
  all-reduce, runs its own experts' share of the token-expert pairs, and the MLP's
  all-reduce sums the partial outputs, as the engines do without an all-to-all backend
  (vLLM v0.11 fused_moe/layer.py: `use_all2all_kernels = dp_size > 1 and use_ep`, the output
  then all-reduced; SGLang `--moe-a2a-backend none`; TensorRT-LLM's all-to-all needs
  attention DP). With `moe_a2a_backend` "all_to_all" (DeepEP-, pplx-style kernels) the MoE
  layers replace the MLP's all-reduce by a dispatch of each token to its k experts' ranks and
  a combine back: 2 x k x (ep-1)/ep x d x activation bytes per token, plus two link
  latencies, over the scale-up link (or the scale-out link when the EP group spans nodes,
  `ep_link`).

MLA (DeepSeek-V2/V3), per layer and rank: the cache holds `kv_lora_rank + qk_rope_head_dim`
per token (replicated on every TP rank, as vLLM does). Prefill attention runs the expanded
form: K/V rebuilt per head, 2 x heads x (d_qk + d_v) FLOPs per query-key pair; decode runs
the absorbed form (FlashMLA): each query attends to the latent itself, 2 x heads x
(2 x kv_lora_rank + rope) FLOPs per pair, reading only the latent per context token.

DeepSeek Sparse Attention (DeepSeek-V3.2), on top of MLA: each query attends to the
`index_topk` keys a lightning indexer scores highest, so the attention above is priced over
min(context, top-k) keys (the batch shape's window-capped sums), at prefill too in the
absorbed (MQA) form: the report instantiates DSA under MLA's MQA mode, every selected latent
shared by all heads, and FlashMLA's sparse prefill and decode kernels run it so. The indexer scores every key:
2 x index_n_heads x index_head_dim FLOPs per pair in FP8 (twice the BF16 rate), reading its
FP8 key per context token; it is replicated on every TP rank, its projections join the QKV
weights. `CostModel` adds it as a share of the attention's own per-pair and per-token prices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from simulator.cost.models import ModelSpec

# how MoE layers under expert parallelism reach the experts (module docstring)
MoEA2ABackend = Literal["none", "all_to_all"]
MOE_A2A_BACKENDS: tuple[str, ...] = get_args(MoEA2ABackend)


def expected_experts_hit(num_experts: float, k: int, experts_total: int, tokens: float) -> float:
    """Distinct experts among `num_experts` (a rank's share) that `tokens` tokens routing to
    `k` of `experts_total` touch: num_experts x (1 - (1 - k/E)^T)."""
    return num_experts * (1.0 - (1.0 - k / experts_total) ** tokens)


def stage_layer_split(model: ModelSpec, layers_per_stage: tuple[int, ...], s: int) -> tuple[int, int]:
    """(dense-MLP layers, MoE layers) of pipeline stage `s`: the dense layers at
    `model.dense_layer_ids` that fall in the stage (the first ones when no positions are known);
    a dense model's layers are all dense. Layers with no MLP (`mlp_free_layer_ids`) are
    neither."""
    start = sum(layers_per_stage[:s])
    end = start + layers_per_stage[s]
    n = layers_per_stage[s] - sum(1 for i in model.mlp_free_layer_ids if start <= i < end)
    if not model.is_moe:
        return n, 0
    if model.dense_layer_ids:
        dense = sum(1 for i in model.dense_layer_ids if start <= i < end)
    else:
        dense = max(0, min(model.num_dense_layers, end) - start)
    return dense, n - dense


@dataclass(frozen=True)
class MoETerms:
    """One stage's MLP on one rank (FLOPs and bytes; sums over the stage's layers)."""

    flops_per_token: float  # routed (k experts) + shared + router + dense MLPs
    expert_bytes: float  # weights of one routed expert on this rank, summed over MoE layers
    experts_per_rank: float  # routed experts each rank holds (E, or E/ep with EP)
    fixed_bytes: float  # router + shared experts + dense MLPs, read every step
    act_bytes_per_token: float
    mlp_elementwise_bytes_per_token: float  # activation and top-k sum passes (see moe_terms)
    alltoall_bytes_per_token: float  # EP dispatch + combine (0 without an all-to-all)
    alltoall_latency_s: float
    moe_layers: int
    dense_layers: int


def moe_terms(model: ModelSpec, tp: int, ep: int, dense_layers: int, moe_layers: int,
              wb: float, ab: float, link_latency_s: float,
              dense_wb: float | None = None, all_to_all: bool = False) -> MoETerms:
    """The MLP terms of a stage with `dense_layers` dense and `moe_layers` MoE layers: routed
    experts at `wb` bytes per weight, shared experts and dense MLPs at `dense_wb` (default
    `wb`; 16-bit when the quantization covers the experts only), the router at `ab`;
    `all_to_all`: the EP dispatch and combine run (else no all-to-all bytes)."""
    dwb = wb if dense_wb is None else dense_wb
    d, k, E = model.hidden_size, model.experts_per_token, model.num_experts
    x = model.expert_width  # the routed experts' width (LatentMoE: its latent)
    n_mats = 3 if model.gated_mlp else 2
    # E/ep experts per rank, each column-split tp/ep ways (ep 1: every expert split tp ways;
    # ep = tp: whole experts); a rank computes 1/ep of the token-expert pairs
    moe_tp = tp // ep
    w_expert, per_rank, share = n_mats * x * model.ffn_size / moe_tp, E / ep, 1.0 / ep
    # the shared experts (column-split tp ways) and LatentMoE's projections (replicated, as
    # vLLM's ReplicatedLinear fc1/fc2_latent_proj)
    w_shared = model.shared_expert_params / tp + model.latent_proj_params
    w_dense = (model.dense_mlp_params if model.is_moe else model.expert_matrix_params) / tp
    router = d * E
    flops = (moe_layers * 2 * (k * share * w_expert + w_shared + router)
             + dense_layers * 2 * w_dense)
    f_rank = model.ffn_size / moe_tp
    latent = 2 * (d + x) if model.moe_latent_size else 0  # the projections' in and out
    act = (moe_layers * ((k * share * (2 * x + n_mats * f_rank) + latent
                          + (2 * d + n_mats * model.shared_expert_ffn_size / tp
                             if model.shared_expert_ffn_size else 0)) * ab + 2 * d * ab)
           + dense_layers * (2 * d + n_mats * model.dense_ffn_size / tp) * ab)
    # vLLM's fused MoE runs the activation (`silu_and_mul`: reads 2x, writes 1x the
    # intermediate of each of a token's k experts on this rank) and the top-k reduction
    # (`moe_sum`: reads k, writes one hidden state) as kernels of their own between the two
    # grouped GEMMs (vllm/model_executor/layers/fused_moe/fused_moe.py, fused_experts_impl),
    # so, like a dense MLP's SiLU x up, their bytes add to the step, not hide under the GEMMs
    elementwise = (moe_layers * (k * share * n_mats * f_rank + (k + 1) * x
                                 + n_mats * model.shared_expert_ffn_size / tp)
                   + dense_layers * n_mats * model.dense_ffn_size / tp) * ab
    a2a_on = all_to_all and ep > 1
    a2a = moe_layers * 2 * k * (ep - 1) / ep * x * ab if a2a_on else 0.0
    return MoETerms(
        flops_per_token=flops, expert_bytes=moe_layers * w_expert * wb, experts_per_rank=per_rank,
        fixed_bytes=moe_layers * (router * ab + w_shared * dwb) + dense_layers * w_dense * dwb,
        act_bytes_per_token=act, mlp_elementwise_bytes_per_token=elementwise,
        alltoall_bytes_per_token=a2a,
        alltoall_latency_s=moe_layers * 2 * link_latency_s if a2a_on else 0.0,
        moe_layers=moe_layers, dense_layers=dense_layers)


@dataclass(frozen=True)
class MLATerms:
    """MLA attention of one layer on one rank (multiply by the stage's layers)."""

    w_qkv: float  # q (LoRA) + KV down projection + latent up projection weights
    w_o: float
    qkv_act_bytes_per_token: float  # per-token in/out of those projections, elements
    prefill_flops_per_pair: float
    decode_flops_per_pair: float
    kv_elems_per_token: float  # latent + rope key, cached and read
    index_flops_per_pair: float = 0.0  # sparse attention's indexer: scores over every key
    index_bytes_per_token: float = 0.0  # its FP8 key (+ scale), cached and read


def mla_terms(model: ModelSpec, tp: int) -> MLATerms:
    """MLA weights and attention costs per layer on one of `tp` ranks (heads split tp ways;
    the q/KV down projections and the latent are replicated)."""
    d, h = model.hidden_size, model.num_heads / tp
    qr, kr, rope = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
    dqk, dv, nope = model.head_dim, model.v_head_dim, model.qk_nope_head_dim
    w_q = d * qr + qr * h * dqk if qr else d * h * dqk
    w_kv = d * (kr + rope) + kr * h * (nope + dv)
    n, dk = model.index_n_heads, model.index_head_dim  # (0 without sparse attention)
    share = model.index_layer_share  # layers with an indexer of their own (GLM-5.2: some reuse)
    return MLATerms(
        w_qkv=w_q + w_kv + model.mean_indexer_params, w_o=h * dv * d,
        qkv_act_bytes_per_token=(d + (qr or 0) + h * dqk + kr + rope + h * (nope + dv)
                                 + (n * dk + dk + n) * share),
        # sparse attention runs both in MLA's MQA (absorbed) form: the top-k latents are
        # shared by all heads (DeepSeek-V3.2's report; FlashMLA's sparse kernels)
        prefill_flops_per_pair=(2 * h * (2 * kr + rope) if model.is_sparse_attention
                                else 2 * h * (dqk + dv)),
        decode_flops_per_pair=2 * h * (2 * kr + rope),
        kv_elems_per_token=kr + rope,
        index_flops_per_pair=2 * n * dk * share,
        index_bytes_per_token=model.mean_indexer_key_bytes)
