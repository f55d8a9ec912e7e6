"""Roofline cost model: the duration of one engine step from its `BatchShape`.

Each operator costs max(FLOPs / (peak x compute efficiency), bytes / (bandwidth x memory
efficiency)); operators run one after another, so the step is their sum plus fixed
overheads. Per layer and per tensor-parallel rank:

- `qkv_proj`, `o_proj`, `mlp` (or `moe_experts`): GEMMs of the step's tokens against the
  rank's weight slice (weights read once per step; MoE reads the experts the tokens hit);
- `attn_prefill`: causal query-key pairs x 4 x heads x head_dim FLOPs, reading the KV of
  the whole context once; `attn_decode`: each decode reads the KV bytes of its context;
- `norm_act_rope`: norms, activation, rotary, residual adds (memory bound);
- `tp_allreduce`: two all-reduces of the hidden state per layer over the replica's
  scale-up link: 2 (tp-1)/tp x bytes / (group bandwidth x efficiency) + a fixed time per
  call, from the link's fit to published communicator benchmarks where it has one (else a
  ring's 2 (tp-1) hop latencies), plus the per-call extra of the engine's all-reduce
  (`allreduce`: custom or nccl): simulator/cost/collectives.py;
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
`__init__` (the per-stage terms: `stage_terms.py`); `step_time` is plain float arithmetic (> 100k evaluations/s, see
bench/costmodel.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.collectives import allreduce_extra_s
from simulator.cost.decode_steps import (
    DecodeTerms,
    decode_run_list,
    decode_run_times,
    decode_step_time,
)
from simulator.cost.dtypes import dtype_bytes
from simulator.cost.eager_dispatch import EagerDispatch
from simulator.cost.hardware import Accelerator, Link, get_accelerator, get_link
from simulator.cost.kernels import (
    FUSED_MOE_CONFIGS,
    check_attention_backend,
    fallback_grouped_gemm,
    kernel_profile,
)
from simulator.cost.models import ModelSpec, get_model
from simulator.cost.moe_cost import MOE_A2A_BACKENDS, expected_experts_hit, mla_terms
from simulator.cost.op_cost import StepBreakdown
from simulator.cost.parallel import shard_model
from simulator.cost.params import CostParams
from simulator.cost.precision import Precision, resolve
from simulator.cost.stage_coefs import StageCoefs
from simulator.cost.stage_terms import StageTerms


class CostModel(StageTerms):
    """Step durations (seconds) for one replica: a model on TP x PP accelerators."""

    def __init__(self, model: ModelSpec | str, accelerator: Accelerator | str | dict,
                 dtype: str = "bf16", tp: int = 1, pp: int = 1,
                 params: CostParams | None = None, *, kv_cache_dtype: str | None = None,
                 link: Link | str | dict | None = None,
                 quantization: dict[str, Any] | str | None = None, ep: int = 1,
                 ep_link: Link | str | dict | None = None, allreduce: str = "custom",
                 attention_backend: str = "flash_attn", moe_a2a_backend: str = "none",
                 fused_moe_config: str = "tuned", eager: EagerDispatch | None = None,
                 host_request_s: float = 0.0, async_scheduling: bool = False) -> None:
        self.model = model if isinstance(model, ModelSpec) else get_model(model)
        self.accelerator = (accelerator if isinstance(accelerator, Accelerator)
                            else get_accelerator(accelerator))
        # refuses a precision the part cannot run, naming what it supports
        self.precision: Precision = resolve(self.accelerator, dtype, quantization, kv_cache_dtype,
                                            model=self.model)  # as released unless said
        self.dtype = self.precision.dtype
        self.kv_cache_dtype = self.precision.kv_cache_dtype
        self.kernels = kernel_profile(self.accelerator)
        # the fused-MoE kernel's config: tuned (or vLLM's defaults from v0.17), or vLLM's
        # fallback before v0.17 for shapes without a tuned file (simulator/engines/fused_moe_fallback.py)
        if fused_moe_config not in FUSED_MOE_CONFIGS:
            raise ValueError(f"fused_moe_config {fused_moe_config!r} unknown; allowed: "
                             f"{', '.join(FUSED_MOE_CONFIGS)}")
        self.fused_moe_config = fused_moe_config
        if fused_moe_config == "legacy_default":
            self.kernels = dataclasses.replace(self.kernels, grouped_gemm=fallback_grouped_gemm(
                self.kernels, self.accelerator.name))
        self.tp, self.pp, self.ep = tp, pp, ep
        # the EP all-to-all (simulator/cost/moe_cost.py): "none" keeps the TP all-reduce
        if moe_a2a_backend not in MOE_A2A_BACKENDS:
            raise ValueError(f"moe_a2a_backend {moe_a2a_backend!r} unknown; allowed: "
                             f"{', '.join(MOE_A2A_BACKENDS)}")
        self.moe_a2a_backend = moe_a2a_backend
        self.all_to_all = moe_a2a_backend == "all_to_all" and ep > 1  # dispatch + combine run
        # the TP all-reduce implementation (simulator/cost/collectives.py): NCCL's per-call extra
        self.allreduce = allreduce
        self._ar_extra = allreduce_extra_s(allreduce) if tp > 1 else 0.0
        # the attention kernel: FlashAttention, vLLM's FlashAttention-2 varlen call (decodes
        # unpacked beside prompts) or its Triton unified attention (simulator/cost/kernels.py)
        self.attention_backend = check_attention_backend(attention_backend, self.model,
                                                         self.accelerator, self.kernels)
        self.shard = shard_model(self.model, tp, pp, ep)
        self.params = (params if params is not None
                       else CostParams.default_for(self.accelerator, self.precision.compute))
        self.params.validate("cost params")
        self.params.check_applies(self.accelerator.name, self.model.name)
        # the engine's scheduler between steps (cluster.host_request_s per scheduled request):
        # the GPU waits for it, or with async scheduling it runs beside the GPU's step and
        # shows only where it is longer (`with_scheduler_host`)
        if host_request_s < 0:
            raise ValueError(f"host_request_s must be >= 0 s, got {host_request_s!r}")
        self.host_request_s = host_request_s
        self.async_scheduling = async_scheduling
        if link is None:
            self.link = self.accelerator.intra_node_link()
        else:
            self.link = link if isinstance(link, Link) else get_link(link)
        # the expert-parallel all-to-all: the scale-up link unless told (an EP group across nodes)
        self.ep_link = self.link if ep_link is None else (
            ep_link if isinstance(ep_link, Link) else get_link(ep_link))
        self._stages = [self._stage_coefs(s) for s in range(pp)]
        self._fast = self._stages[0]["fast"]
        # all-decode steps' terms fixed by (tokens, requests, decodes): `decode_steps.decode_terms`
        self._decode_terms: dict[tuple[int, int, int], DecodeTerms] = {}
        p = self.params
        self._step_ovh, self._tok_ovh = p.step_overhead_s, p.token_overhead_s
        self._req_ovh = p.request_overhead_s
        self._microbatches = p.pp_microbatches or pp
        self._padding = float(p.decode_padding)
        m = self.model
        # share of the layers whose attention is capped at the window: those that slide, or
        # every layer under sparse attention (the top-k keys)
        self._window = m.attention_window
        self._slide = (1.0 if m.is_sparse_attention else
                       m.num_sliding_layers / m.num_layers if m.sliding_window else 0.0)
        # sparse attention's indexer, which scores every key, as shares of the attention's own
        # prices: per query-key pair at prefill (FP8 MMA at twice the BF16 rate) and per KV
        # token read (its FP8 key beside the latent) (simulator/cost/moe_cost.py)
        self._index_pairs = self._index_tokens = 0.0
        if m.is_sparse_attention:
            t = mla_terms(m, tp)
            self._index_pairs = t.index_flops_per_pair / 2.0 / t.prefill_flops_per_pair
            self._index_tokens = t.index_bytes_per_token / (
                t.kv_elems_per_token * dtype_bytes(self.kv_cache_dtype))
        # steps that run outside CUDA graphs: their layers' host dispatch adds to the step
        # (simulator/cost/eager_dispatch.py); None: every step under graphs
        self.eager = eager
        self._eager_tokens = eager.max_graph_tokens if eager is not None else 0
        self._eager_s = m.num_layers * eager.layer_s if eager is not None else 0.0

    @property
    def indexer_shares(self) -> tuple[float, float]:
        """Sparse attention's indexer as shares of the attention's own prices: (of a prefill
        query-key pair, of a KV token read), both 0.0 without sparse attention."""
        return self._index_pairs, self._index_tokens

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
        host = self._step_ovh + T * self._tok_ovh + shape.num_reqs * self._req_ovh
        if self._eager_s and shape.num_prefill_tokens and self._eager_tokens < T:
            host += self._eager_s
        if self.pp == 1:
            t = self._stage_time(self._fast, T, shape.num_reqs, shape.num_prefill_tokens,
                                 P, Pctx, shape.num_decode_reqs, Dctx) + host
        else:
            mb = self.num_microbatches(shape)
            times = [self._stage_time(st["fast"], T / mb, shape.num_reqs / mb,
                                      shape.num_prefill_tokens / mb, P / mb, Pctx / mb,
                                      shape.num_decode_reqs / mb, Dctx / mb)
                     for st in self._stages]
            t = sum(times) + (mb - 1) * max(times) + host
        if self.host_request_s:
            return self.with_scheduler_host(t, shape.num_reqs)
        return t

    def with_scheduler_host(self, step_s: float, num_reqs: float) -> float:
        """`step_s` (the step's GPU and other host time) with the engine scheduler's
        `host_request_s` x `num_reqs`: added (synchronous scheduling), or with async scheduling
        the longer of the two (the scheduler works on the next step while the GPU runs)."""
        h = num_reqs * self.host_request_s
        if self.async_scheduling:
            return h if h > step_s else step_s
        return step_s + h

    def decode_attn_tokens(self, shape: BatchShape) -> float:
        """KV tokens (per layer) decode attention reads and multiplies this step: the decodes'
        contexts plus `decode_padding` x the padding to `max_decode_context` (tokens); for a
        model with sliding layers, the layer-weighted mean of full and window-capped ones."""
        D = shape.decode_context_tokens
        if self._padding:
            pad = shape.num_decode_reqs * shape.max_decode_context - D
            if pad > 0:
                D = D + self._padding * pad
        out = D
        if self._slide and self._windowed(shape):
            Dw = shape.decode_window_tokens
            if self._padding:
                pad = shape.num_decode_reqs * min(shape.max_decode_context, self._window) - Dw
                if pad > 0:
                    Dw = Dw + self._padding * pad
            out = D + self._slide * (Dw - D)
        if self._index_tokens:  # sparse attention's indexer reads every (uncapped) token
            out = out + self._index_tokens * D
        return out

    def attention_sums(self, shape: BatchShape) -> tuple[float, float, float]:
        """(prefill query-key pairs, prefill KV tokens read, decode KV tokens) per layer,
        averaged over the layers: sliding layers take the shape's window-capped sums; under
        sparse attention the top-k's capped sums plus the indexer's share of the uncapped."""
        P = P0 = shape.prefill_attn_pairs
        Pctx = Pctx0 = shape.prefill_context_tokens
        if self._slide and self._windowed(shape):
            f = self._slide
            P += f * (shape.prefill_window_pairs - P)
            Pctx += f * (shape.prefill_window_context_tokens - Pctx)
        if self._index_pairs:  # sparse attention's indexer scores every pair
            P += self._index_pairs * P0
            Pctx += self._index_tokens * Pctx0
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
         dac, dakv, q1, o1, m1, aqd, apr, dmix, lpc, lpt, ldr, arx, ard) = fast
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
            b = Pctx * akv + P * apr + Tp * aq
            t += a + ov * b if a > b else b + ov * a
        if Rd:  # decode attention: fixed set-up, then its KV reads (+ per-request tokens)
            a = Dctx * dac
            b = Dctx * dakv * (dmix if Tp else 1.0) + Rd * aqd
            t += dovh + (a + ov * b if a > b else b + ov * a)
        if ldr:  # linear-attention layers: chunked prefill kernels, each decode's state
            if Tp:
                t += lpc + Tp * lpt
            t += Rd * ldr
        t += T * el + cm0 + T * cm1 + lovh
        if arx < T:  # large all-reduce messages: NCCL's line, below the fit's beyond arx
            t -= (T - arx) * ard
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
        """KV-cache bytes of `num_tokens` tokens of this model (all layers, cache dtype), plus
        one request's recurrent state for a model with linear-attention layers."""
        m = self.model
        state = m.linear_state_bytes(self.dtype) if num_tokens > 0 else 0.0
        return int(round(num_tokens * m.kv_bytes_per_token(self.kv_cache_dtype) + state))

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

    def decode_run_list(self, shape: BatchShape, num_steps: int,
                        extra_s: float = 0.0) -> list[float]:
        """`decode_run_times` as a list, `extra_s` added to each element when not 0 (the
        simulator's form: a loop, not numpy, where `decode_steps` is compiled)."""
        return decode_run_list(self, shape, num_steps, extra_s)

    def decode_step_time(self, shape: BatchShape) -> float:
        """Seconds of one all-decode step, with the arithmetic of `decode_run_times`."""
        return decode_step_time(self, shape)

    def describe(self) -> dict[str, Any]:
        """Model, hardware, dtype and parallelism, for reports."""
        return {"model": self.model.name, "hardware": self.accelerator.name,
                "dtype": self.dtype, "quantization": self.precision.method,
                "gemm_compute": self.precision.compute, "kv_cache_dtype": self.kv_cache_dtype,
                "tp": self.tp, "pp": self.pp, "ep": self.ep,
                "moe_a2a_backend": self.moe_a2a_backend, "link": self.link.name,
                "allreduce": self.allreduce, "fused_moe_config": self.fused_moe_config,
                "attention_backend": self.attention_backend,
                "prefill_graph_max_tokens": (None if self.eager is None
                                             else self.eager.max_graph_tokens),
                "params_source": self.params.source}
