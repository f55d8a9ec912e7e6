"""Per-stage precomputation of `CostModel` (a mixin): each operator's FLOPs and bytes per
unit (token, request, query-key pair, context token) for a stage's layers, folded with the
part's rates and kernel shape terms into the seconds-per-unit constants (`StageCoefs`) that
`CostModel.step_time` multiplies. MoE and MLA replace the dense terms (`moe_cost.py` says how
each is priced); the linears carry tile/wave, grouped-GEMM and dequantization terms.

The mixin reads the attributes `CostModel.__init__` sets (model, shard, accelerator,
precision, kernels, params, tp, ep, all_to_all, link, ep_link, allreduce, _ar_extra).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from simulator.cost.collectives import large_allreduce_crossover
from simulator.cost.dtypes import dtype_bytes
from simulator.cost.grouped_gemm import ExpertShape, MoELinearCost, expert_stream_factor
from simulator.cost.kernels import query_group, triton_block_q
from simulator.cost.linear_cost import LinearCost, SummedLinearCost
from simulator.cost.moe_cost import mla_terms, moe_terms, stage_layer_split
from simulator.cost.params import CostParams
from simulator.cost.stage_coefs import StageCoefs

# Sampling reads the fp32 logits of each request about three times (softmax, top-k/top-p
# filtering, the draw) in vLLM's sampler; order of magnitude, absorbed by calibration.
SAMPLING_PASSES = 3
LOGIT_BYTES = 4  # logits are upcast to fp32 before sampling (vLLM LogitsProcessor)


class StageTerms:
    """The precomputation half of `CostModel` (see the module docstring)."""

    def _linear_costs(self, s: int, L: int, Lm: int, last: bool) -> dict[str, LinearCost]:
        """Tensor-core seconds of stage `s`'s linears (`L` layers, `Lm` of them with an MLP)
        against their rows (tokens, or requests for the LM head), with the part's kernel
        shape terms."""
        m, sh, acc, pr, k = self.model, self.shard, self.accelerator, self.precision, self.kernels
        d, hd = m.hidden_size, m.head_dim
        hq, hkv, f = sh.heads, sh.kv_heads, sh.ffn
        peak = acc.peak_flops(pr.compute)
        eff = self.params.gemm_compute_efficiency
        tile = getattr(k, "tile", None)
        sms = acc.sm_count
        wo = k.weight_only if pr.weight_only else None
        alu = (acc.fp32_tflops or 0.0) * 1e12
        kh = k.k_half(peak * eff, sms)  # (0 for parts without a kernel profile)

        def rate(part: str) -> tuple[float, float, Any, float]:
            """(peak, efficiency, weight-only terms, short-K term) of `part`'s GEMMs: the
            replica's own inside the quantization scope, the activations' 16 bits outside it
            (`Precision.of`)."""
            if pr.covers(part):
                return peak, eff, wo, kh
            dp = pr.of(part)
            p_, e_ = self._gemm_rate(dp.compute)
            return p_, e_, k.weight_only if dp.weight_only else None, k.k_half(p_ * e_, sms)
        if m.is_mla:  # q (LoRA) down/up, KV down, latent up; o from the heads' values
            h = m.num_heads // self.tp
            qr, kr, rope = m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim
            qkv = ([(qr, d), (h * hd, qr)] if qr else [(h * hd, d)])
            qkv += [(kr + rope, d), (h * (m.qk_nope_head_dim + m.v_head_dim), kr)]
            if m.is_sparse_attention:  # the indexer's q (from the q LoRA), k and head weights
                n, dk = m.index_n_heads, m.index_head_dim
                own = m.index_layer_share  # (outputs scaled where layers share one: GLM-5.2)
                qkv += [(max(1, round(n * dk * own)), qr or d), (max(1, round(dk * own)), d),
                        (max(1, round(n * own)), d)]
            o = [(d, h * m.v_head_dim)]
        else:  # (a gated attention's q_proj also emits the output gate)
            qkv = [((hq * (2 if m.attn_output_gate else 1) + 2 * hkv) * hd, d)]
            o = [(d, hq * hd)]

        def attn_linear(mats: list[tuple[int, int]], lin: list[tuple[int, int]],
                        part: str) -> Any:
            """The attention-side GEMMs of the stage's L layers at `part`'s rate: with
            linear-attention layers, the softmax layers' and theirs, each over its share of the
            layers."""
            a_peak, a_eff, a_wo, a_kh = rate(part)
            if not m.has_linear_attention:
                return LinearCost(mats, L, a_peak, a_eff, tile, sms, a_wo, alu, k_half=a_kh)
            share = m.num_linear_layers / m.num_layers
            return SummedLinearCost([
                LinearCost(mats, L * (1.0 - share), a_peak, a_eff, tile, sms, a_wo, alu,
                           k_half=a_kh),
                LinearCost(lin, L * share, a_peak, a_eff, tile, sms, a_wo, alu, k_half=a_kh)])

        lin_in, lin_out = self._linear_attention_gemms()
        m_peak, m_eff, m_wo, m_kh = rate("mlp")  # dense MLPs, shared experts, router
        out = {
            "qkv_proj": attn_linear(qkv, lin_in, "qkv"),
            "o_proj": attn_linear(o, lin_out, "o_proj"),
            "mlp": (self._moe_linear(s, peak, eff, wo, alu, m_kh,
                                     None if pr.covers("mlp") else 1.0 / (m_peak * m_eff),
                                     m_wo is not None) if m.is_moe else LinearCost(
                [(2 * f, d), (d, f)] if m.gated_mlp else [(f, d), (d, f)],
                Lm, m_peak, m_eff, tile, sms, m_wo, alu, k_half=m_kh)),
        }
        if last:  # the LM head stays 16-bit (vLLM quantizes the decoder layers only)
            pdim = m.embed_proj_dim or d
            gem = [(sh.vocab, pdim)] + ([(pdim, d)] if pdim != d else [])
            ab_peak, bf16_eff = self._gemm_rate("fp32" if pr.dtype == "fp32" else "bf16")
            out["lm_head"] = LinearCost(
                gem, 1, ab_peak, bf16_eff, tile, acc.sm_count, table_rows=1024,
                k_half=k.k_half(ab_peak * bf16_eff, sms))
        return out

    def _linear_attention_gemms(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(N, K) of a linear-attention layer's input projections (q, k, v and the output
        gate z; the per-head decay and write rates a, b) and output projection on one rank
        (empty lists for a model without such layers)."""
        m, tp = self.model, self.tp
        if not m.has_linear_attention:
            return [], []
        v = m.linear_value_heads * m.linear_value_head_dim // tp
        d = m.hidden_size
        return ([(m.linear_conv_dim // tp + v, d), (m.linear_rate_outputs // tp, d)],
                [(d, v)])

    def _linear_attention_terms(self, raw: dict[str, Any], L: int, part_wb: tuple[float, float],
                                ab: float, rate: dict[str, float]) -> None:
        """Put the stage's linear-attention layers (Gated DeltaNet, Mamba-2) in `raw`: their
        share of the attention projections (`part_wb`: bytes per weight of the input and
        output projections), the softmax attention
        scaled to the other layers, and the `linear_attn` operator (kernels.yaml
        linear_attention, mamba2)."""
        m, tp = self.model, self.tp
        share = m.num_linear_layers / m.num_layers
        Ll = L * share  # (the layers of each kind assumed spread evenly over the stages)
        (n_in, d), (n_ab, _) = self._linear_attention_gemms()[0]
        v = n_in - m.linear_conv_dim // tp  # value dims on this rank
        heads = m.linear_value_heads / tp

        def blend(softmax: tuple[float, ...], linear: tuple[float, ...]) -> tuple[float, ...]:
            """An operator's (per-token FLOPs, weight bytes, activation bytes) over the stage:
            the softmax layers' share of `softmax` (L layers' worth) plus `linear` (per layer)."""
            return tuple(f * (1.0 - share) + Ll * g for f, g in zip(softmax, linear, strict=True))

        w_in, w_out = (n_in + n_ab) * d, v * d
        qwb, owb = part_wb
        raw["qkv_proj"] = blend(raw["qkv_proj"], (2 * w_in, w_in * qwb, (d + n_in + n_ab) * ab))
        raw["o_proj"] = blend(raw["o_proj"], (2 * w_out, w_out * owb, (v + d) * ab))
        raw["attn"] = blend(raw["attn"], (0.0, 0.0, 0.0))
        raw["attn_decode"] = blend(raw["attn_decode"], (0.0, 0.0))
        # convolution in and out, the gate z and the gated norm, per token
        conv = m.linear_conv_dim / tp
        ew_flops, ew_bytes = raw["elementwise"]
        raw["elementwise"] = (ew_flops, ew_bytes + Ll * (2 * conv + 3 * v) * ab)
        # one request's state on this rank per layer, read and written by each decode (the
        # recurrent kernel); a prompt chunk's reads and writes are in the measured kernel times
        state = m.linear_state_bytes(self.precision.dtype) / m.num_linear_layers / tp
        dk, dv = m.linear_key_head_dim, m.linear_value_head_dim
        if m.linear_kind == "mamba2":
            # Mamba-2's SSD per prompt token and head (128-token chunks): the chunk state
            # and its read-out (2 x 2 N P) and the in-chunk C B^T and its product with X
            # (2 x 128 x (N + P)); N = state (dk), P = head dim (dv)
            kernel, prefill_flops = "mamba2", Ll * heads * (4.0 * dk * dv + 2.0 * 128 * (dk + dv))
        else:
            # FLOPs per prompt token and value head of Gated DeltaNet's chunked algorithm
            # (64-token chunks): the state's read-out and update (3 x 2 dk dv) and the
            # in-chunk products (2 x 64 x (2 dk + dv) for K K^T, W, U and the masked Q K^T V)
            kernel = "linear_attention"
            prefill_flops = Ll * heads * (6.0 * dk * dv + 2.0 * 64 * (2 * dk + dv))
        la = getattr(self.kernels, kernel, None)
        if la is not None:  # the measured chunked kernels (latency-bound)
            call_s, token_s = Ll * la.call_s, Ll * (la.token_s + la.token_head_s * heads)
        else:  # a roofline of the chunk algorithm's FLOPs
            call_s, token_s = 0.0, prefill_flops * rate["attn_c"]
        decode_bytes = Ll * 2.0 * state
        raw["linear_attn"] = {"call_s": call_s, "token_s": token_s,
                              "prefill_flops": prefill_flops,
                              "prefill_bytes": Ll * (2 * conv + v) * ab,
                              "decode_flops": Ll * heads * 4.0 * dk * dv,
                              "decode_bytes": decode_bytes,
                              "decode_s": decode_bytes * rate["attn_m"],
                              "measured": la is not None, "kernel": kernel}

    def _gemm_rate(self, compute: str) -> tuple[float, float]:
        """(peak FLOP/s, efficiency) of GEMMs multiplying in `compute`: this replica's own
        efficiency for its precision's compute dtype, the part's default for another (the
        16-bit LM head, the matrices a quantization scope leaves out)."""
        acc = self.accelerator
        eff = (self.params.gemm_compute_efficiency if compute == self.precision.compute
               else CostParams.default_for(acc, compute).gemm_compute_efficiency)
        return acc.peak_flops(compute), eff

    def _moe_linear(self, s: int, peak: float, eff: float, wo: Any, alu: float,
                    k_half: float = 0.0, dense_rate: float | None = None,
                    dense_dequant: bool = True) -> LinearCost | SummedLinearCost:
        """The MLP of an MoE stage per token on one rank: its k routed experts (1/ep of the
        pairs with EP), shared experts, router, and the dense first layers' MLPs. With the
        part's `grouped_gemm` terms the routed experts run as a grouped GEMM (rows per expert,
        tile padding, short K, a ceiling below dense: simulator/cost/grouped_gemm.py); without
        them (parts with no kernel profile) they are one dense GEMM with the layer counts
        folded into the output widths. `k_half`: the dense GEMMs' short-K term (the routed
        experts' is the grouped GEMM's own); `dense_rate` / `dense_dequant`: their seconds per
        FLOP and whether they dequantize, when the quantization scope leaves them out (None:
        scope all, the experts' rate)."""
        m, tp, ep = self.model, self.tp, self.ep
        dense, moe = stage_layer_split(m, self.shard.layers_per_stage, s)
        d, kx, x = m.hidden_size, m.experts_per_token, m.expert_width

        def mats(ffn: float, copies: float, width: float = d) -> list[tuple[float, float]]:
            up = [(copies * 2 * ffn, width)] if m.gated_mlp else [(copies * ffn, width)]
            return up + [(copies * width, ffn)] if ffn else []

        rest = [(moe * m.num_experts, d)]
        if m.moe_latent_size:  # LatentMoE's projections down to the latent and back
            rest += [(moe * x, d), (moe * d, x)]
        if m.shared_expert_ffn_size:
            rest += mats(m.shared_expert_ffn_size / tp, moe)
        if dense:
            rest += mats(m.dense_ffn_size / tp, dense)
        rest = [g for g in rest if g[0] > 0]
        grouped = getattr(self.kernels, "grouped_gemm", None)
        if grouped is None or not moe:
            routed = [g for g in mats(self.shard.ffn, moe * kx / ep, x) if g[0] > 0]
            if dense_rate is None or not rest:  # (scope all: every matrix at the experts' rate)
                return LinearCost(routed + rest, 1, peak, eff, None, None, wo, alu)
            # the matrices outside the quantization scope at their own rate (no dequantization
            # unless they are quantized too)
            out_of_scope = LinearCost(rest, 1, 1.0 / dense_rate, 1.0, None, None,
                                      wo if dense_dequant else None, alu)
            if not routed:  # a pipeline stage of dense layers only
                return out_of_scope
            return SummedLinearCost([LinearCost(routed, 1, peak, eff, None, None, wo, alu),
                                     out_of_scope])
        experts = ExpertShape(self._expert_gemms(), moe, kx, m.num_experts, ep)
        return MoELinearCost(rest, experts, self._grouped_for_compute(grouped), peak, eff, wo, alu,
                             dense_k_half=k_half, dense_rate=dense_rate,
                             dense_dequant=dense_dequant)

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

    def _expert_stream(self) -> float:
        """Seconds to stream the routed experts' weights over those bytes at the part's
        `weight_stream_efficiency` (`grouped_gemm.expert_stream_factor`; 1 without the part's
        `grouped_gemm.stream_efficiency`)."""
        k = self.kernels
        g = getattr(k, "grouped_gemm", None)
        if g is None or g.stream_efficiency is None:
            return 1.0
        w8a8 = self.precision.compute in ("fp8", "int8") and g.fp8_k_half is not None
        return expert_stream_factor(self._expert_gemms(), g.fp8_k_half if w8a8 else g.k_half,
                                    g.stream_efficiency, k.weight_stream_efficiency)

    def _expert_gemms(self) -> tuple[tuple[float, float], ...]:
        """(N, K) of one routed expert's GEMMs on a rank: gate/up (fused when gated), down;
        its width is the shard's (moe_intermediate / (tp / ep): whole with ep = tp)."""
        m = self.model
        f_rank, x = self.shard.ffn, m.expert_width
        up = (2 * f_rank, x) if m.gated_mlp else (f_rank, x)
        return (up, (x, f_rank))

    def _fp8_kv_relative(self) -> float:
        """The decode KV-read rate of an FP8 cache over a 16-bit one's per byte, for this
        replica (1: a 16-bit cache, MLA's latent, or a part without a measured figure)."""
        if self.precision.kv_cache_dtype != "fp8" or self.model.is_mla:
            return 1.0
        return float(getattr(self.kernels, "attn_decode_fp8_kv_relative", 1.0))

    def _stage_coefs(self, s: int) -> dict[str, Any]:
        """Raw per-unit FLOPs/bytes of every operator of stage `s`, and the same folded with
        the rates into seconds per unit (`fast`) for `step_time`."""
        m, sh, p, acc, pr = self.model, self.shard, self.params, self.accelerator, self.precision
        L = sh.layers_per_stage[s]
        last = s == self.pp - 1
        d, hd = m.hidden_size, m.head_dim
        hq, hkv, f = sh.heads, sh.kv_heads, sh.ffn
        wb = pr.matrix_weight_bytes
        # bytes per weight of the q/k/v projections, the output projection and the dense MLPs
        # (shared experts, router): `wb` inside the quantization scope, 16-bit outside it
        qwb, owb, mwb = (pr.of(part).matrix_weight_bytes for part in ("qkv", "o_proj", "mlp"))
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
            # decode's KV-cache reads (an FP8 cache converts each element: kernels.yaml
            # attn_decode.fp8_kv_relative; grouped-query attention, not MLA's latent)
            "attn_kv_m": 1.0 / (bw * p.attn_memory_efficiency * self._fp8_kv_relative()),
            "link": 1.0 / (self.link.bandwidth_bytes_per_s * p.comm_efficiency),
            "allreduce": self.link.allreduce_seconds_per_byte(self.tp, p.comm_efficiency),
            "ep_link": 1.0 / (self.ep_link.bandwidth_bytes_per_s * p.comm_efficiency),
        }
        n_mats = 3 if m.gated_mlp else 2
        hq_q = hq * (2 if m.attn_output_gate else 1)  # q_proj's outputs (with the gate)
        w_qkv, w_o, w_e = d * (hq_q + 2 * hkv) * hd, hq * hd * d, n_mats * d * f
        kv_tok, qo_tok = 2 * hkv * hd * kvb, 2 * hq * hd * ab
        tp = self.tp
        ring = 2.0 * (tp - 1) / tp  # ring all-reduce moves 2 (tp-1)/tp of the message
        Lm = sum(stage_layer_split(m, sh.layers_per_stage, s))  # the layers with an MLP
        raw = {
            # (flops per token, weight bytes, activation bytes per token), L layers
            "qkv_proj": (L * 2 * w_qkv, L * w_qkv * qwb, L * (d + (hq_q + 2 * hkv) * hd) * ab),
            "o_proj": (L * 2 * w_o, L * w_o * owb, L * (hq * hd + d) * ab),
            "mlp": (Lm * 2 * (m.experts_per_token * w_e + (d * m.num_experts if m.is_moe else 0)),
                    Lm * w_e * wb,  # per expert touched
                    Lm * (m.experts_per_token * (2 * d + n_mats * f) * ab
                          + (2 * d * ab if m.is_moe else 0))),
            "router_bytes": L * d * m.num_experts * ab if m.is_moe else 0.0,
            # attention: flops per query-key pair, KV bytes per context token, bytes per new token
            "attn": (L * 4 * hq * hd, L * kv_tok, L * (qo_tok + kv_tok)),
            # (the norms and residual adds: 4 d per sublayer, attention's and the MLP's)
            "elementwise": ((L + Lm) * 5 * d + Lm * 4 * n_mats * f,  # nominal FLOPs, reported only
                            ((L + Lm) * 4 * d + L * 2 * (hq + hkv) * hd) * ab),  # + the MLP's, below
            "mlp_elementwise": Lm * n_mats * f * ab,  # SiLU x up: reads 2f, writes f
            # one all-reduce after each sublayer (attention's, the MLP's)
            "allreduce": ((L + Lm) * ring * d * ab,
                          (L + Lm) * (self.link.allreduce_fixed_s(tp) + self._ar_extra)),
            "allreduce_calls": L + Lm,
            "layers": L,
        }
        raw["attn_decode"] = raw["attn"][:2]
        raw["ep_alltoall"] = (0.0, 0.0)
        if m.is_moe or m.is_mla:
            self._variant_terms(raw, s, L, wb, (qwb, owb, mwb), ab, kvb, ring, rate)
        if m.has_linear_attention:
            self._linear_attention_terms(raw, L, (qwb, owb), ab, rate)
        ew_flops, ew_bytes = raw["elementwise"]
        raw["elementwise"] = (ew_flops, ew_bytes + raw.pop("mlp_elementwise"))
        lin = self._linear_costs(s, L, Lm, last)
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
        akv = rate["attn_kv_m"]
        E, kx = m.num_experts, m.experts_per_token
        E_rank = raw.get("experts_per_rank", float(E))
        k_rank = kx / self.ep  # experts one token reaches on one rank (GEMV passes)
        fs = raw.get("expert_stream", 1.0)  # the routed experts' streaming time factor
        lm = raw.get("lm_head", (0.0, 0.0, 0.0))
        gather = raw.get("gather", (0.0, 0.0))
        send = raw.get("pp_send", (0.0, 0.0))
        head = lin.get("lm_head")
        # attention shape terms (0 for parts without a kernel profile): FlashAttention's
        # per-query work (the causal diagonal's included) as `half_keys` extra keys, decode's
        # per-request KV tokens
        a_peak = acc.peak_flops("fp32" if self.dtype == "fp32" else "bf16")
        half_keys = k.prefill_half_keys(a_peak * p.attn_compute_efficiency, acc.sm_count, hd)
        req_tokens = getattr(k, "attn_decode_request_tokens", 0.0)
        # vLLM's Triton unified attention: each block of BLOCK_Q query tokens re-reads the K/V
        # it attends to (seconds per query-key pair; it replaces FlashAttention's one read)
        reread = (raw["attn"][1] / triton_block_q(hq, hkv) / (bw * k.triton_reread_bandwidth)
                  if self.attention_backend == "triton_attn" else 0.0)
        # vLLM's FlashAttention-2 call: decodes read their K/V once per query head beside
        # prompt tokens (dmix), and in every step where every layer slides (FA2 packs a GQA
        # group only without a window: `always`)
        unpacked = (float(query_group(hq, hkv)) if self.attention_backend == "flash_attn_2"
                    else 1.0)
        all_slide = bool(m.sliding_window) and m.num_sliding_layers == m.num_layers
        always, dmix = (unpacked, 1.0) if all_slide else (1.0, unpacked)
        fast = StageCoefs(
            lin["qkv_proj"].per_row, raw["qkv_proj"][1] * gm, raw["qkv_proj"][2] * gm,
            lin["o_proj"].per_row, raw["o_proj"][1] * gm, raw["o_proj"][2] * gm,
            lin["mlp"].per_row, raw["mlp"][1] * gm * fs, raw["mlp"][2] * gm,
            raw["router_bytes"] * gm, E_rank, 1.0 - kx / E,
            raw["attn"][0] * ac, 0.0 if reread else raw["attn"][1] * am, raw["attn"][2] * am,
            raw["elementwise"][1] * gm,
            raw["allreduce"][0] * rate["allreduce"] + raw["ep_alltoall"][0] * rate["ep_link"],
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
            (raw["mlp"][1] * fs * (k_rank if E > 1 else 1) + raw["router_bytes"]) * rate["gemv_m"],
            lm[1] * rate["gemv_m"],
            p.linear_token_factors, p.lm_head_row_factors,
            L * p.decode_attn_overhead_s,
            # shaped linears (None: linear in the rows), attention shape terms
            lin["qkv_proj"] if lin["qkv_proj"].shaped else None,
            lin["o_proj"] if lin["o_proj"].shaped else None,
            lin["mlp"] if lin["mlp"].shaped else None,
            head if head and head.shaped else None,
            raw["attn"][0] * ac * half_keys, req_tokens * raw["attn_decode"][1] * akv,
            # decode attention per query-key pair and per context token (MLA: absorbed form)
            raw["attn_decode"][0] * ac, raw["attn_decode"][1] * akv * always,
            # one row of each linear, and a decode request's fixed attention seconds
            lin["qkv_proj"].seconds(1) if lin["qkv_proj"].shaped else lin["qkv_proj"].per_row,
            lin["o_proj"].seconds(1) if lin["o_proj"].shaped else lin["o_proj"].per_row,
            lin["mlp"].seconds(1) if lin["mlp"].shaped else lin["mlp"].per_row,
            raw["attn"][2] * am + req_tokens * raw["attn_decode"][1] * akv,
            reread, dmix,
            # linear-attention layers: seconds per step with prompt tokens, per prompt token,
            # per decode request (0 without them)
            *((la["call_s"], la["token_s"], la["decode_s"]) if (la := raw.get("linear_attn"))
              else (0.0, 0.0, 0.0)),
            *self._large_allreduce(raw["allreduce_calls"], d * ab),
        )
        return {"raw": raw, "rate": rate, "fast": fast, "last": last, "linear": lin,
                "half_keys": half_keys, "req_tokens": req_tokens, "reread": reread,
                "decode_kv_always": always}

    def _large_allreduce(self, calls: float, msg_bytes_per_token: float) -> tuple[float, float]:
        """(tokens above which NCCL's large-message line prices the TP all-reduces, seconds it
        saves per token beyond them): (inf, 0) where the link has no such line."""
        cross, saved = large_allreduce_crossover(self.link, self.tp, self.params.comm_efficiency,
                                                 self.allreduce)
        if not calls or not math.isfinite(cross):
            return math.inf, 0.0
        return cross / msg_bytes_per_token, calls * msg_bytes_per_token * saved

    def _layer_floor(self, s: int, L: int) -> float:
        """Seconds of stage `s`'s per-layer fixed costs: `layer_overhead_s` per layer, or with
        the part's default kernel floor, its seconds per dependent kernel x the kernels of each
        layer (more for MoE, shared-expert, MLA and q/k-norm layers; the dense GEMM kernels at
        `gemm_kernel_s` where the part has one; kernels.yaml)."""
        p, k, m = self.params, self.kernels, self.model
        floor = getattr(k, "layer_floor_s", 0.0)
        if not (floor and p.device is None and p.layer_overhead_s == floor):
            return L * p.layer_overhead_s
        dense, moe = stage_layer_split(m, self.shard.layers_per_stage, s)
        return (k.kernel_s * (dense * k.layer_kernels(m, False) + moe * k.layer_kernels(m, True))
                + dense * k.layer_gemm_extra_s(m, False) + moe * k.layer_gemm_extra_s(m, True)
                + moe * k.moe_call_extra_s() + (L - dense - moe) * k.mlp_free_layer_s(m))

    def _variant_terms(self, raw: dict[str, Any], s: int, L: int, wb: float,
                       part_wb: tuple[float, float, float], ab: float, kvb: float, ring: float,
                       rate: dict[str, float]) -> None:
        """Replace the dense terms of stage `s` by those of an MoE and/or MLA model
        (simulator/cost/moe_cost.py says how each is priced); `wb`: bytes per routed-expert
        weight; `part_wb`: those of the q/k/v projections, the output projection and the dense
        MLPs (each `wb` inside the quantization scope, 16-bit outside it)."""
        m, tp, ep = self.model, self.tp, self.ep
        qwb, owb, mwb = part_wb
        if m.is_mla:
            t = mla_terms(m, tp)
            h = m.num_heads / tp
            raw["qkv_proj"] = (L * 2 * t.w_qkv, L * t.w_qkv * qwb, L * t.qkv_act_bytes_per_token * ab)
            raw["o_proj"] = (L * 2 * t.w_o, L * t.w_o * owb, L * (h * m.v_head_dim + m.hidden_size) * ab)
            kv_tok = t.kv_elems_per_token * kvb
            qo_tok = h * (m.head_dim + m.v_head_dim) * ab
            raw["attn"] = (L * t.prefill_flops_per_pair, L * kv_tok, L * (qo_tok + kv_tok))
            raw["attn_decode"] = (L * t.decode_flops_per_pair, L * kv_tok)
        if m.is_moe:
            dense, moe = stage_layer_split(m, self.shard.layers_per_stage, s)
            mt = moe_terms(m, tp, ep, dense, moe, wb, ab, self.ep_link.latency_s, dense_wb=mwb,
                           all_to_all=self.all_to_all)
            raw["mlp"] = (mt.flops_per_token, mt.expert_bytes, mt.act_bytes_per_token)
            raw["expert_stream"] = self._expert_stream()
            raw["router_bytes"] = mt.fixed_bytes  # router + shared experts + dense MLPs
            raw["experts_per_rank"] = mt.experts_per_rank
            raw["moe_layers"] = moe
            raw["mlp_elementwise"] = mt.mlp_elementwise_bytes_per_token
            if self.all_to_all:  # the MoE layers' MLP all-reduce becomes the all-to-all
                n_ar = L + dense
                raw["allreduce"] = (n_ar * ring * m.hidden_size * ab,
                                    n_ar * (self.link.allreduce_fixed_s(tp) + self._ar_extra))
                raw["allreduce_calls"] = n_ar
                raw["ep_alltoall"] = (mt.alltoall_bytes_per_token, mt.alltoall_latency_s)
