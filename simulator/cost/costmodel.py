"""Roofline cost model: the duration of one engine step from its `BatchShape`.

Each operator costs max(FLOPs / (peak x compute efficiency), bytes / (bandwidth x memory
efficiency)); operators run one after another, so the step is their sum plus fixed
overheads. Per layer and per tensor-parallel rank:

- `qkv_proj`, `o_proj`, `mlp` (or `moe_experts`): GEMMs of the step's tokens against the
  rank's weight slice (weights read once per step; MoE reads the experts the tokens hit);
- `attn_prefill`: causal query-key pairs x 4 x heads x head_dim FLOPs, reading the KV of
  the whole context once; `attn_decode`: each decode reads the KV bytes of its context;
- `norm_act_rope`: norms, activation, rotary, residual adds (memory bound);
- `tp_allreduce`: two ring all-reduces of the hidden state per layer over the replica's
  scale-up link: 2 (tp-1)/tp x bytes / (link bandwidth x efficiency) + 2 (tp-1) x latency,
  plus the per-call extra of the engine's all-reduce (`allreduce`: custom or nccl,
  simulator/cost/collectives.py);
- once per step on the last stage: `lm_head` (logits only for each request's last token,
  as vLLM), `sampling`, `logits_gather`; plus `step_overhead` (per step, per token and
  per request) and `layer_overhead`.

Five `CostParams` knobs describe executors that depart from these ideal kernels (defaults:
the ideal, i.e. GPU estimates are unchanged; `kvpd calibrate` fits them on a CPU):
`overlap` (each roofline operator takes max(c, m) + (1 - overlap) x min(c, m)),
`decode_padding` (decode attention over sum_ctx + p x (decodes x max_decode_context - sum_ctx)
KV tokens, as a padded batched kernel), `decode_attn_overhead_s` (fixed seconds per layer
of a step with decodes: setting up the batched decode attention), `gemv_memory_efficiency`
(one-row GEMMs: the linears of a one-token step, the LM head of a one-request step) and
`gemm_row_passes_below` (the per-layer linears of a step with 1 < tokens < that value run
as one GEMV pass per token, as fp32 MKL does for small M).

A calibration may add measured size factors (`CostParams.linear_token_factors`,
`lm_head_row_factors`): the linears of a step of T tokens and the LM head of R requests
take that factor x their roofline time (GEMM kernels are not smooth in the row count).

Sliding-window layers (`ModelSpec.num_sliding_layers` of them, window W) attend to at most W
keys per query: their attention pairs, KV reads and decode contexts are the shape's
window-capped sums (`BatchShape.window`), the full layers' the uncapped ones; the layers of
each kind are assumed spread evenly over the pipeline stages (`attention_sums`).

Pipeline parallelism splits layers into `pp` stages and the batch into `m` micro-batches:
the step takes sum_s t_s + (m - 1) max_s t_s (fill/drain bubble included), with the
activations sent between stages over the scale-up link (`pp_send`).

Everything that depends only on model, hardware, dtype and parallelism is precomputed in
`__init__`; `step_time` is plain float arithmetic (> 100k evaluations/s, see
bench/costmodel.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import decode_run_times, decode_step_time, explain_step
from simulator.cost.collectives import allreduce_extra_s
from simulator.cost.dtypes import dtype_bytes
from simulator.cost.grouped_gemm import ExpertShape, MoELinearCost
from simulator.cost.hardware import Accelerator, Link, get_accelerator, get_link
from simulator.cost.kernels import kernel_profile
from simulator.cost.linear_cost import LinearCost
from simulator.cost.models import ModelSpec, get_model
from simulator.cost.moe_cost import expected_experts_hit, mla_terms, moe_terms, stage_layer_split
from simulator.cost.op_cost import StepBreakdown
from simulator.cost.parallel import shard_model
from simulator.cost.params import CostParams
from simulator.cost.precision import Precision, resolve
from simulator.cost.stage_coefs import StageCoefs

# Sampling reads the fp32 logits of each request about three times (softmax, top-k/top-p
# filtering, the draw) in vLLM's sampler; order of magnitude, absorbed by calibration.
SAMPLING_PASSES = 3
LOGIT_BYTES = 4  # logits are upcast to fp32 before sampling (vLLM LogitsProcessor)


class CostModel:
    """Step durations (seconds) for one replica: a model on TP x PP accelerators."""

    def __init__(self, model: ModelSpec | str, accelerator: Accelerator | str | dict,
                 dtype: str = "bf16", tp: int = 1, pp: int = 1,
                 params: CostParams | None = None, *, kv_cache_dtype: str | None = None,
                 link: Link | str | dict | None = None,
                 quantization: dict[str, Any] | str | None = None, ep: int = 1,
                 ep_link: Link | str | dict | None = None, allreduce: str = "custom") -> None:
        self.model = model if isinstance(model, ModelSpec) else get_model(model)
        self.accelerator = (accelerator if isinstance(accelerator, Accelerator)
                            else get_accelerator(accelerator))
        # refuses a precision the part cannot run, naming what it supports
        self.precision: Precision = resolve(self.accelerator, dtype, quantization, kv_cache_dtype)
        self.dtype = self.precision.dtype
        self.kv_cache_dtype = self.precision.kv_cache_dtype
        self.kernels = kernel_profile(self.accelerator)
        self.tp, self.pp, self.ep = tp, pp, ep
        # the TP all-reduce implementation (simulator/cost/collectives.py): NCCL's per-call extra
        self.allreduce = allreduce
        self._ar_extra = allreduce_extra_s(allreduce) if tp > 1 else 0.0
        self.shard = shard_model(self.model, tp, pp, ep)
        self.params = (params if params is not None
                       else CostParams.default_for(self.accelerator, self.precision.compute))
        self.params.validate("cost params")
        self.params.check_applies(self.accelerator.name, self.model.name)
        if link is None:
            self.link = self.accelerator.intra_node_link()
        else:
            self.link = link if isinstance(link, Link) else get_link(link)
        # the expert-parallel all-to-all: the scale-up link unless told (an EP group across nodes)
        self.ep_link = self.link if ep_link is None else (
            ep_link if isinstance(ep_link, Link) else get_link(ep_link))
        self._stages = [self._stage_coefs(s) for s in range(pp)]
        self._fast = self._stages[0]["fast"]
        # all-decode steps' terms fixed by (tokens, requests, decodes): `breakdown._decode_fixed`
        self._decode_fixed: dict[tuple[int, int, int], tuple[int, list[float], float]] = {}
        p = self.params
        self._step_ovh, self._tok_ovh = p.step_overhead_s, p.token_overhead_s
        self._req_ovh = p.request_overhead_s
        self._microbatches = p.pp_microbatches or pp
        self._padding = float(p.decode_padding)
        m = self.model
        # share of the layers that slide (their attention is capped at the window)
        self._slide = m.num_sliding_layers / m.num_layers if m.sliding_window else 0.0
        self._window = m.sliding_window

    # ------------------------------------------------------------------ precomputation
    def _linear_costs(self, s: int, L: int, last: bool) -> dict[str, LinearCost]:
        """Tensor-core seconds of stage `s`'s linears against their rows (tokens, or
        requests for the LM head), with the part's kernel shape terms."""
        m, sh, acc, pr, k = self.model, self.shard, self.accelerator, self.precision, self.kernels
        d, hd = m.hidden_size, m.head_dim
        hq, hkv, f = sh.heads, sh.kv_heads, sh.ffn
        peak = acc.peak_flops(pr.compute)
        eff = self.params.gemm_compute_efficiency
        tile = getattr(k, "tile", None)
        sms = acc.sm_count
        wo = k.weight_only if pr.weight_only else None
        alu = (acc.fp32_tflops or 0.0) * 1e12
        if m.is_mla:  # q (LoRA) down/up, KV down, latent up; o from the heads' values
            h = m.num_heads // self.tp
            qr, kr, rope = m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim
            qkv = ([(qr, d), (h * hd, qr)] if qr else [(h * hd, d)])
            qkv += [(kr + rope, d), (h * (m.qk_nope_head_dim + m.v_head_dim), kr)]
            o = [(d, h * m.v_head_dim)]
        else:
            qkv, o = [((hq + 2 * hkv) * hd, d)], [(d, hq * hd)]
        out = {
            "qkv_proj": LinearCost(qkv, L, peak, eff, tile, sms, wo, alu),
            "o_proj": LinearCost(o, L, peak, eff, tile, sms, wo, alu),
            "mlp": (self._moe_linear(s, peak, eff, wo, alu) if m.is_moe else LinearCost(
                [(2 * f, d), (d, f)] if m.gated_mlp else [(f, d), (d, f)],
                L, peak, eff, tile, sms, wo, alu)),
        }
        if last:  # the LM head stays 16-bit (vLLM quantizes the decoder layers only)
            pdim = m.embed_proj_dim or d
            gem = [(sh.vocab, pdim)] + ([(pdim, d)] if pdim != d else [])
            ab_peak = acc.peak_flops("fp32" if pr.dtype == "fp32" else "bf16")
            bf16_eff = (self.params.gemm_compute_efficiency if pr.compute in ("bf16", "fp32")
                        else CostParams.default_for(acc, "bf16").gemm_compute_efficiency)
            out["lm_head"] = LinearCost(gem, 1, ab_peak, bf16_eff, tile, acc.sm_count,
                                        table_rows=1024)
        return out

    def _moe_linear(self, s: int, peak: float, eff: float, wo: Any, alu: float) -> LinearCost:
        """The MLP of an MoE stage per token on one rank: its k routed experts (1/ep of the
        pairs with EP), shared experts, router, and the dense first layers' MLPs. With the
        part's `grouped_gemm` terms the routed experts run as a grouped GEMM (rows per expert,
        tile padding, short K, a ceiling below dense: simulator/cost/grouped_gemm.py); without
        them (parts with no kernel profile) they are one dense GEMM with the layer counts
        folded into the output widths."""
        m, tp, ep = self.model, self.tp, self.ep
        dense, moe = stage_layer_split(m, self.shard.layers_per_stage, s)
        d, kx = m.hidden_size, m.experts_per_token

        def mats(ffn: float, copies: float) -> list[tuple[float, float]]:
            up = [(copies * 2 * ffn, d)] if m.gated_mlp else [(copies * ffn, d)]
            return up + [(copies * d, ffn)] if ffn else []

        f_rank = m.ffn_size / (1 if ep > 1 else tp)
        rest = [(moe * m.num_experts, d)]
        if m.shared_expert_ffn_size:
            rest += mats(m.shared_expert_ffn_size / tp, moe)
        if dense:
            rest += mats(m.dense_ffn_size / tp, dense)
        rest = [g for g in rest if g[0] > 0]
        grouped = getattr(self.kernels, "grouped_gemm", None)
        if grouped is None or not moe:
            gemms = [g for g in mats(f_rank, moe * kx / ep) if g[0] > 0] + rest
            return LinearCost(gemms, 1, peak, eff, None, None, wo, alu)
        experts = ExpertShape(tuple(mats(f_rank, 1.0)), moe, kx, m.num_experts, ep)
        return MoELinearCost(rest, experts, self._grouped_for_compute(grouped), peak, eff, wo, alu)

    def _grouped_for_compute(self, g: Any) -> Any:
        """The grouped-GEMM terms at this replica's GEMM precision. W8A8 (fp8 / int8) fused-MoE
        kernels run `fp8_speedup` times as fast as the BF16 kernel at the same shape, not at
        the dense FP8 GEMMs' share of the doubled peak: their `relative` is rescaled so the
        FP8 rate x relative = the BF16 rate x relative x fp8_speedup."""
        pr, acc, k = self.precision, self.accelerator, self.kernels
        if pr.compute not in ("fp8", "int8") or g.fp8_speedup is None:
            return g
        peak_ratio = acc.peak_flops(pr.compute) / acc.peak_flops("bf16")
        rel = g.relative * g.fp8_speedup / (peak_ratio * k.relative(pr.compute))
        return dataclasses.replace(g, relative=min(1.0, rel))

    def _stage_coefs(self, s: int) -> dict[str, Any]:
        """Raw per-unit FLOPs/bytes of every operator of stage `s`, and the same folded with
        the rates into seconds per unit (`fast`) for `step_time`."""
        m, sh, p, acc, pr = self.model, self.shard, self.params, self.accelerator, self.precision
        L = sh.layers_per_stage[s]
        last = s == self.pp - 1
        d, hd = m.hidden_size, m.head_dim
        hq, hkv, f = sh.heads, sh.kv_heads, sh.ffn
        wb = pr.matrix_weight_bytes
        ab = pr.activation_bytes  # activations, norms, embeddings
        kvb = dtype_bytes(pr.kv_cache_dtype)
        bw = acc.mem_bw_bytes_per_s
        k = self.kernels
        rate = {
            "gemm_c": 1.0 / (acc.peak_flops(pr.compute) * p.gemm_compute_efficiency),
            "gemm_m": 1.0 / (bw * p.gemm_memory_efficiency),
            "gemv_m": 1.0 / (bw * p.gemv_memory_efficiency),
            "attn_c": 1.0 / (acc.peak_flops("fp32" if self.dtype == "fp32" else "bf16")
                             * p.attn_compute_efficiency),
            "attn_m": 1.0 / (bw * p.attn_memory_efficiency),
            "link": 1.0 / (self.link.bandwidth_bytes_per_s * p.comm_efficiency),
            "ep_link": 1.0 / (self.ep_link.bandwidth_bytes_per_s * p.comm_efficiency),
        }
        n_mats = 3 if m.gated_mlp else 2
        w_qkv, w_o, w_e = d * (hq + 2 * hkv) * hd, hq * hd * d, n_mats * d * f
        kv_tok, qo_tok = 2 * hkv * hd * kvb, 2 * hq * hd * ab
        tp = self.tp
        ring = 2.0 * (tp - 1) / tp  # ring all-reduce moves 2 (tp-1)/tp of the message
        raw = {
            # (flops per token, weight bytes, activation bytes per token), L layers
            "qkv_proj": (L * 2 * w_qkv, L * w_qkv * wb, L * (d + (hq + 2 * hkv) * hd) * ab),
            "o_proj": (L * 2 * w_o, L * w_o * wb, L * (hq * hd + d) * ab),
            "mlp": (L * 2 * (m.experts_per_token * w_e + (d * m.num_experts if m.is_moe else 0)),
                    L * w_e * wb,  # per expert touched
                    L * (m.experts_per_token * (2 * d + n_mats * f) * ab
                         + (2 * d * ab if m.is_moe else 0))),
            "router_bytes": L * d * m.num_experts * ab if m.is_moe else 0.0,
            # attention: flops per query-key pair, KV bytes per context token, bytes per new token
            "attn": (L * 4 * hq * hd, L * kv_tok, L * (qo_tok + kv_tok)),
            "elementwise": (L * (10 * d + 4 * n_mats * f),  # nominal FLOPs, reported only
                            L * (8 * d + n_mats * f + 2 * (hq + hkv) * hd) * ab),
            "allreduce": (L * 2 * ring * d * ab,
                          L * 2 * (2 * (tp - 1) * self.link.latency_s + self._ar_extra)),
            "layers": L,
        }
        raw["attn_decode"] = raw["attn"][:2]
        raw["ep_alltoall"] = (0.0, 0.0)
        if m.is_moe or m.is_mla:
            self._variant_terms(raw, s, L, wb, ab, kvb, ring, rate)
        lin = self._linear_costs(s, L, last)
        raw["layer_floor_s"] = self._layer_floor(s, L)
        if last:
            pdim = m.embed_proj_dim or d
            w_lm = sh.vocab * pdim + (pdim * d if pdim != d else 0)
            raw["lm_head"] = (2 * w_lm, w_lm * ab, d * ab + sh.vocab * LOGIT_BYTES)
            raw["sampling"] = SAMPLING_PASSES * m.vocab_size * LOGIT_BYTES
            raw["gather"] = ((tp - 1) / tp * m.vocab_size * LOGIT_BYTES,
                             (tp - 1) * self.link.latency_s)
        else:
            raw["pp_send"] = (d * ab, self.link.latency_s)
        gm, ac, am, lk = (rate[k_] for k_ in ("gemm_m", "attn_c", "attn_m", "link"))
        E, kx = m.num_experts, m.experts_per_token
        E_rank = raw.get("experts_per_rank", float(E))
        k_rank = kx / self.ep  # experts one token reaches on one rank (GEMV passes)
        lm = raw.get("lm_head", (0.0, 0.0, 0.0))
        gather = raw.get("gather", (0.0, 0.0))
        send = raw.get("pp_send", (0.0, 0.0))
        head = lin.get("lm_head")
        # attention shape terms (0 for parts without a kernel profile): FlashAttention's
        # per-query work as `half_keys` extra keys, decode's per-request KV tokens
        half_keys = getattr(k, "attn_half_keys", 0.0)
        req_tokens = getattr(k, "attn_decode_request_tokens", 0.0)
        fast = StageCoefs(
            lin["qkv_proj"].per_row, raw["qkv_proj"][1] * gm, raw["qkv_proj"][2] * gm,
            lin["o_proj"].per_row, raw["o_proj"][1] * gm, raw["o_proj"][2] * gm,
            lin["mlp"].per_row, raw["mlp"][1] * gm, raw["mlp"][2] * gm,
            raw["router_bytes"] * gm, E_rank, 1.0 - kx / E,
            raw["attn"][0] * ac, raw["attn"][1] * am, raw["attn"][2] * am,
            raw["elementwise"][1] * gm,
            raw["allreduce"][0] * lk + raw["ep_alltoall"][0] * rate["ep_link"],
            raw["allreduce"][1] + raw["ep_alltoall"][1],
            raw["layer_floor_s"],
            head.per_row if head else 0.0, lm[1] * gm, lm[2] * gm,
            raw.get("sampling", 0.0) * gm,
            gather[0] * lk, gather[1],
            send[0] * lk, send[1],
            1.0 - p.overlap, float(p.gemm_row_passes_below),
            # weight seconds of one GEMV pass (one row) of qkv, o, the MLP (the k experts one
            # token routes to, plus the router) and the LM head
            raw["qkv_proj"][1] * rate["gemv_m"], raw["o_proj"][1] * rate["gemv_m"],
            (raw["mlp"][1] * (k_rank if E > 1 else 1) + raw["router_bytes"]) * rate["gemv_m"],
            lm[1] * rate["gemv_m"],
            p.linear_token_factors, p.lm_head_row_factors,
            L * p.decode_attn_overhead_s,
            # shaped linears (None: linear in the rows), attention shape terms
            lin["qkv_proj"] if lin["qkv_proj"].shaped else None,
            lin["o_proj"] if lin["o_proj"].shaped else None,
            lin["mlp"] if lin["mlp"].shaped else None,
            head if head and head.shaped else None,
            raw["attn"][0] * ac * half_keys, req_tokens * raw["attn_decode"][1] * am,
            # decode attention per query-key pair and per context token (MLA: absorbed form)
            raw["attn_decode"][0] * ac, raw["attn_decode"][1] * am,
            # one row of each linear, and a decode request's fixed attention seconds
            lin["qkv_proj"].seconds(1) if lin["qkv_proj"].shaped else lin["qkv_proj"].per_row,
            lin["o_proj"].seconds(1) if lin["o_proj"].shaped else lin["o_proj"].per_row,
            lin["mlp"].seconds(1) if lin["mlp"].shaped else lin["mlp"].per_row,
            raw["attn"][2] * am + req_tokens * raw["attn_decode"][1] * am,
        )
        return {"raw": raw, "rate": rate, "fast": fast, "last": last, "linear": lin,
                "half_keys": half_keys, "req_tokens": req_tokens}

    def _layer_floor(self, s: int, L: int) -> float:
        """Seconds of stage `s`'s per-layer fixed costs: `layer_overhead_s` per layer, or with
        the part's default kernel floor, its seconds per dependent kernel x the kernels of each
        layer (more for MoE, shared-expert, MLA and q/k-norm layers; kernels.yaml)."""
        p, k, m = self.params, self.kernels, self.model
        floor = getattr(k, "layer_floor_s", 0.0)
        if not (floor and p.device is None and p.layer_overhead_s == floor):
            return L * p.layer_overhead_s
        dense, moe = stage_layer_split(m, self.shard.layers_per_stage, s) if m.is_moe else (L, 0)
        return k.kernel_s * (dense * k.layer_kernels(m, False) + moe * k.layer_kernels(m, True))

    def _variant_terms(self, raw: dict[str, Any], s: int, L: int, wb: float, ab: float,
                       kvb: float, ring: float, rate: dict[str, float]) -> None:
        """Replace the dense terms of stage `s` by those of an MoE and/or MLA model
        (simulator/cost/moe_cost.py says how each is priced)."""
        m, tp, ep = self.model, self.tp, self.ep
        if m.is_mla:
            t = mla_terms(m, tp)
            h = m.num_heads / tp
            raw["qkv_proj"] = (L * 2 * t.w_qkv, L * t.w_qkv * wb, L * t.qkv_act_bytes_per_token * ab)
            raw["o_proj"] = (L * 2 * t.w_o, L * t.w_o * wb, L * (h * m.v_head_dim + m.hidden_size) * ab)
            kv_tok = t.kv_elems_per_token * kvb
            qo_tok = h * (m.head_dim + m.v_head_dim) * ab
            raw["attn"] = (L * t.prefill_flops_per_pair, L * kv_tok, L * (qo_tok + kv_tok))
            raw["attn_decode"] = (L * t.decode_flops_per_pair, L * kv_tok)
        if m.is_moe:
            dense, moe = stage_layer_split(m, self.shard.layers_per_stage, s)
            mt = moe_terms(m, tp, ep, dense, moe, wb, ab, self.ep_link.latency_s)
            raw["mlp"] = (mt.flops_per_token, mt.expert_bytes, mt.act_bytes_per_token)
            raw["router_bytes"] = mt.fixed_bytes  # router + shared experts + dense MLPs
            raw["experts_per_rank"] = mt.experts_per_rank
            raw["moe_layers"] = moe
            raw["elementwise"] = self._moe_elementwise(raw["elementwise"], dense, moe, ab)
            if ep > 1:  # the MoE layers' MLP all-reduce becomes the all-to-all
                n_ar = L + dense
                raw["allreduce"] = (n_ar * ring * m.hidden_size * ab,
                                    n_ar * (2 * (tp - 1) * self.link.latency_s + self._ar_extra))
                raw["ep_alltoall"] = (mt.alltoall_bytes_per_token, mt.alltoall_latency_s)

    def _moe_elementwise(self, dense_terms: tuple[float, float], dense: int, moe: int,
                         ab: float) -> tuple[float, float]:
        """The elementwise passes of an MoE stage per token (FLOPs, bytes). vLLM's fused MoE
        runs the activation (`silu_and_mul`: reads 2 x, writes 1 x the intermediate of each of
        a token's k experts on this rank) and the top-k reduction (`moe_sum`: reads k, writes
        one hidden state) as kernels of their own between the two grouped GEMMs
        (vllm/model_executor/layers/fused_moe/fused_moe.py, fused_experts_impl), so, like a
        dense MLP's SiLU x up, their bytes add to the step rather than hide under the GEMMs.
        The dense terms counted one expert's intermediate; this counts the k experts, the
        shared experts and the dense layers' MLPs."""
        m, sh = self.model, self.shard
        d, ep, tp, kx = m.hidden_size, self.ep, self.tp, m.experts_per_token
        n_mats = 3 if m.gated_mlp else 2
        L = dense + moe
        f_rank = m.ffn_size / (1 if ep > 1 else tp)
        share = 1.0 / ep if ep > 1 else 1.0
        per_moe = (kx * share * n_mats * f_rank + (kx + 1) * d
                   + n_mats * m.shared_expert_ffn_size / tp)
        per_dense = n_mats * m.dense_ffn_size / tp
        flops, nbytes = dense_terms
        nbytes += (moe * per_moe + dense * per_dense - L * n_mats * sh.ffn) * ab
        return flops, nbytes

    def expected_experts_loaded(self, num_tokens: float) -> float:
        """Routed experts whose weights one rank streams per MoE layer for a step of
        `num_tokens` tokens: (E / ep) x (1 - (1 - k/E)^T); 0 for a dense model."""
        m = self.model
        if not m.is_moe or num_tokens <= 0:
            return 0.0
        return expected_experts_hit(m.num_experts / self.ep, m.experts_per_token, m.num_experts,
                                    num_tokens)

    # ------------------------------------------------------------------ public API
    def step_time(self, shape: BatchShape) -> float:
        """Seconds for one engine step computing `shape` (0.0 for an empty step)."""
        T = shape.num_tokens
        if T <= 0:
            return 0.0
        if self._slide:
            P, Pctx, Dctx = self.attention_sums(shape)
        else:
            P, Pctx, Dctx = (shape.prefill_attn_pairs, shape.prefill_context_tokens,
                             self.decode_attn_tokens(shape))
        if self.pp == 1:
            t = self._stage_time(self._fast, T, shape.num_reqs, shape.num_prefill_tokens,
                                 P, Pctx, shape.num_decode_reqs, Dctx)
            return t + self._step_ovh + T * self._tok_ovh + shape.num_reqs * self._req_ovh
        mb = self.num_microbatches(shape)
        times = [self._stage_time(st["fast"], T / mb, shape.num_reqs / mb,
                                  shape.num_prefill_tokens / mb, P / mb, Pctx / mb,
                                  shape.num_decode_reqs / mb, Dctx / mb)
                 for st in self._stages]
        return (sum(times) + (mb - 1) * max(times) + self._step_ovh + T * self._tok_ovh
                + shape.num_reqs * self._req_ovh)

    def decode_attn_tokens(self, shape: BatchShape) -> float:
        """KV tokens (per layer) decode attention reads and multiplies this step: the decodes'
        contexts plus `decode_padding` x the padding to `max_decode_context` (tokens); for a
        model with sliding layers, the layer-weighted mean of full and window-capped ones."""
        D = shape.decode_context_tokens
        if self._padding:
            pad = shape.num_decode_reqs * shape.max_decode_context - D
            if pad > 0:
                D = D + self._padding * pad
        if self._slide and self._windowed(shape):
            Dw = shape.decode_window_tokens
            if self._padding:
                pad = shape.num_decode_reqs * min(shape.max_decode_context, self._window) - Dw
                if pad > 0:
                    Dw = Dw + self._padding * pad
            return D + self._slide * (Dw - D)
        return D

    def attention_sums(self, shape: BatchShape) -> tuple[float, float, float]:
        """(prefill query-key pairs, prefill KV tokens read, decode KV tokens) per layer,
        averaged over the layers: sliding layers take the shape's window-capped sums."""
        P, Pctx = shape.prefill_attn_pairs, shape.prefill_context_tokens
        if self._slide and self._windowed(shape):
            f = self._slide
            P += f * (shape.prefill_window_pairs - P)
            Pctx += f * (shape.prefill_window_context_tokens - Pctx)
        return P, Pctx, self.decode_attn_tokens(shape)

    def _windowed(self, shape: BatchShape) -> bool:
        """Whether `shape` carries this model's window-capped sums (False: priced uncapped,
        e.g. a shape built without the window)."""
        if shape.window == self._window:
            return True
        if shape.window:
            raise ValueError(f"batch shape tracks a {shape.window}-token window but "
                             f"{self.model.name} slides {self._window} tokens")
        return False

    def num_microbatches(self, shape: BatchShape) -> int:
        """Pipeline micro-batches of this step: `pp_microbatches` (default pp), at most one
        per request (1 when pp == 1)."""
        if self.pp == 1:
            return 1
        return max(1, min(self._microbatches, shape.num_reqs))

    @staticmethod
    def _stage_time(fast: StageCoefs, T: float, R: float, Tp: float, P: float, Pctx: float,
                    Rd: float, Dctx: float) -> float:
        """Seconds of one stage for one micro-batch (plain float arithmetic, hot path)."""
        (qc, qm0, qm1, oc, om0, om1, mc, mm0, mm1, rtr, n_exp, hit, ac, akv, aq, el,
         cm1, cm0, lovh, lc, lm0, lm1, smp, g1, g0, s1, s0, ov, passes_below,
         qv, ovv, mv, lmv, lin_f, head_f, dovh, q_lin, o_lin, m_lin, h_lin, aqk, dreq,
         dac, dakv, q1, o1, m1, aqd) = fast
        # each roofline operator: max(c, m) + ov x min(c, m), ov = 1 - overlap
        if T == 1.0 or 1.0 < T < passes_below:  # the linears run as T GEMV passes
            t = 0.0
            for a, b in ((q1, qv + qm1), (o1, ovv + om1), (m1, mv + mm1)):
                t += T * (a + ov * b if a > b else b + ov * a)
        else:
            a = q_lin.seconds(T) if q_lin else T * qc
            b = qm0 + T * qm1
            t = a + ov * b if a > b else b + ov * a
            a = o_lin.seconds(T) if o_lin else T * oc
            b = om0 + T * om1
            t += a + ov * b if a > b else b + ov * a
            a = m_lin.seconds(T) if m_lin else T * mc
            if n_exp > 1:  # MoE: expected number of distinct experts the T tokens hit
                b = mm0 * n_exp * (1.0 - hit ** T) + rtr + T * mm1
            else:
                b = mm0 + T * mm1
            t += a + ov * b if a > b else b + ov * a
        if lin_f and len(lin_f) >= T and int(T) == T:  # measured GEMM size effect
            t *= lin_f[int(T) - 1]
        if Tp:  # prefill attention: pairs, plus each query's fixed work (half_keys)
            a = P * ac + Tp * aqk
            b = Pctx * akv + Tp * aq
            t += a + ov * b if a > b else b + ov * a
        if Rd:  # decode attention: fixed set-up, then its KV reads (+ per-request tokens)
            a = Dctx * dac
            b = Dctx * dakv + Rd * aqd
            t += dovh + (a + ov * b if a > b else b + ov * a)
        t += T * el + cm0 + T * cm1 + lovh
        if lc:  # last stage: LM head (one logit row per request), sampling, logits gather
            a = h_lin.seconds(R) if h_lin else R * lc
            b = (lmv if R == 1.0 else lm0) + R * lm1  # one request: a GEMV
            head = a + ov * b if a > b else b + ov * a
            if head_f and len(head_f) >= R and int(R) == R:
                head *= head_f[int(R) - 1]
            t += head + R * smp + g0 + R * g1
        else:  # activations to the next stage
            t += s0 + T * s1
        return t

    def kv_transfer_bytes(self, num_tokens: int) -> int:
        """KV-cache bytes of `num_tokens` tokens of this model (all layers, cache dtype)."""
        return int(round(num_tokens * self.model.kv_bytes_per_token(self.kv_cache_dtype)))

    def efficiency_sources(self) -> dict[str, tuple[float, str]]:
        """Each efficiency the model uses: (value, where it came from)."""
        from simulator.cost.params import efficiency_sources

        return efficiency_sources(self.params, self.accelerator, self.precision.compute)

    def explain(self, shape: BatchShape) -> StepBreakdown:
        """Per-operator FLOPs, bytes, seconds and bound; `total_s` equals `step_time(shape)`."""
        return explain_step(self, shape)

    def decode_run_times(self, shape: BatchShape, num_steps: int) -> np.ndarray:
        """Seconds of `num_steps` consecutive all-decode steps, contexts growing by one per step
        (element k equals `decode_step_time(shape.advanced(k))` bit for bit, and
        `step_time(shape.advanced(k))` but for the last bits)."""
        return decode_run_times(self, shape, num_steps)

    def decode_step_time(self, shape: BatchShape) -> float:
        """Seconds of one all-decode step, with the arithmetic of `decode_run_times`."""
        return decode_step_time(self, shape)

    def describe(self) -> dict[str, Any]:
        """Model, hardware, dtype and parallelism, for reports."""
        return {"model": self.model.name, "hardware": self.accelerator.name,
                "dtype": self.dtype, "quantization": self.precision.method,
                "gemm_compute": self.precision.compute, "kv_cache_dtype": self.kv_cache_dtype,
                "tp": self.tp, "pp": self.pp, "ep": self.ep, "link": self.link.name,
                "allreduce": self.allreduce,
                "params_source": self.params.source}
