"""The slow, explainable side of `CostModel`: per-operator breakdowns (`explain_step`), which
agree with `CostModel.step_time` (tests/test_costmodel*.py check it)."""

from __future__ import annotations

from typing import Any, Protocol

from simulator.core.batch_shape import BatchShape
from simulator.cost.eager_dispatch import EAGER_LAYER_SOURCE, SGLANG_EAGER_LAYER_S
from simulator.cost.kernels import triton_block_q
from simulator.cost.models import ModelSpec
from simulator.cost.op_cost import OpCost, StepBreakdown
from simulator.cost.params import CostParams
from simulator.cost.stage_coefs import StageCoefs


class CostModel(Protocol):
    """What these functions read of `simulator.cost.costmodel.CostModel` (a protocol, so this
    module does not import the class that calls it)."""

    model: ModelSpec
    params: CostParams
    accelerator: Any
    kernels: Any
    dtype: str
    tp: int
    pp: int
    ep: int
    shard: Any  # per-rank heads and KV heads
    _stages: list[dict[str, Any]]
    _padding: float
    _slide: float  # share of layers whose attention is capped at the window
    _window: int
    _index_tokens: float  # sparse attention's indexer: a share of each uncapped KV token
    _decode_terms: dict[tuple[int, int, int], Any]  # `decode_steps.DecodeTerms` per shape
    eager: Any  # `eager_dispatch.EagerDispatch` or None
    _eager_s: float  # an eager step's dispatch: layers x eager.layer_s
    host_request_s: float  # the engine scheduler's s per request per step (cluster.host_request_s)
    async_scheduling: bool  # it runs beside the step (cluster.async_scheduling)

    def _windowed(self, shape: BatchShape) -> bool: ...
    def with_scheduler_host(self, step_s: float, num_reqs: float) -> float: ...
    def efficiency_sources(self) -> dict[str, tuple[float, str]]: ...

    def decode_attn_tokens(self, shape: BatchShape) -> float: ...
    def attention_sums(self, shape: BatchShape) -> tuple[float, float, float]: ...
    def num_microbatches(self, shape: BatchShape) -> int: ...
    def describe(self) -> dict[str, Any]: ...
    @staticmethod
    def _stage_time(fast: StageCoefs, T: float, R: float, Tp: float, P: float, Pctx: float,
                    Rd: float, Dctx: float) -> float: ...


# per-layer operators that `CostParams.linear_token_factors` scales
LINEAR_OPS = ("qkv_proj", "o_proj", "mlp", "moe_experts")


def _timed(name: str, flops: float, nbytes: float, c: float, m: float, ov: float,
           eff: tuple[float, str, float, str] | None = None) -> OpCost:
    """An operator of `c` compute and `m` memory seconds: max(c, m) + ov x min(c, m).
    `eff`: (compute efficiency, its source, memory efficiency, its source); the one of the
    bound that wins is reported."""
    t = c + ov * m if c > m else m + ov * c
    bound = "compute" if c > m else "memory"
    e, src = (None, "") if eff is None else (eff[:2] if c > m else eff[2:])
    return OpCost(name, flops, nbytes, t, bound, c, m, e, src)


def _roofline(name: str, flops: float, nbytes: float, rate_c: float, rate_m: float,
              ov: float = 0.0, eff: tuple[float, str, float, str] | None = None) -> OpCost:
    """max(c, m) + ov x min(c, m) seconds, ov = 1 - `CostParams.overlap`."""
    return _timed(name, flops, nbytes, flops * rate_c, nbytes * rate_m, ov, eff)


def _shape_note(lc: Any, rows: float) -> str:
    """What the GEMM shape terms did at `rows` rows (for explain)."""
    if lc is None or not lc.shaped:
        return ""
    f = lc.efficiency_factor(rows)
    bits = []
    if lc.tile and lc.sm_count:
        bits.append(f"{lc.tile[0]}x{lc.tile[1]} tiles over {lc.sm_count} SMs")
    if lc.k_half:
        bits.append(f"K/(K+{lc.k_half:.0f})")
    if lc.weight_only is not None:
        bits.append(f"dequantized every {lc.weight_only.rows_per_pass} rows")
    g = getattr(lc, "grouped", None)
    if g is not None:
        kind = ("the old fused-MoE fallback config (kernels.yaml grouped_gemm.legacy_default), "
                if g.block_m_by_tokens else "")
        bits.append(f"{kind}grouped GEMM {g.relative:.3g} of dense, {lc.padded(rows):.0f} padded "
                    f"rows for {rows * lc.experts.top_k / lc.experts.ep:.0f} token-expert pairs "
                    f"(BLOCK_SIZE_M {g.block_m[0]}-{g.block_m[1]}), K/(K+{g.k_half:.0f})")
    return f" x shape {f:.3f} ({', '.join(bits)})"


def _stream_note(nbytes: float, nbytes_s: float) -> str:
    """The routed experts' streaming term in an op's memory-efficiency source, if any."""
    if nbytes_s == nbytes or not nbytes_s:
        return ""
    return (f" x {nbytes / nbytes_s:.3f} routed-expert streaming (kernels.yaml "
            "grouped_gemm.stream_efficiency x K/(K+k_half))")


def _stage_ops(cm: CostModel, st: dict[str, Any], T: float, R: float, Tp: float, P: float,
               Pctx: float, Rd: float, Dctx: float) -> list[OpCost]:
    """Operators of one stage for one micro-batch (same arithmetic as `_stage_time`)."""
    raw, rate, lin = st["raw"], st["rate"], st["linear"]
    gm, ac, am, lk = (rate[k] for k in ("gemm_m", "attn_c", "attn_m", "link"))
    model, p = cm.model, cm.params
    src = cm.efficiency_sources()
    ov = 1.0 - p.overlap
    ops: list[OpCost] = []
    gv = rate["gemv_m"]
    gemv = T == 1.0 or 1.0 < T < p.gemm_row_passes_below  # linears as T GEMV passes
    g_eff, g_src = src["gemm_compute_efficiency"]
    m_eff, m_src = src["gemm_memory_efficiency"]
    v_eff, v_src = src["gemv_memory_efficiency"]

    def linear(name: str, key: str, fl: float, wb: float, act: float,
               wb_s: float | None = None) -> OpCost:
        """`wb_s`: the weight bytes as streaming time counts them (routed experts: slower
        than `wb`, `StageTerms._expert_stream`)."""
        lc = lin[key]
        rows = 1.0 if gemv else T
        shape = lc.efficiency_factor(rows)
        c_eff = (g_eff * shape, g_src + _shape_note(lc, rows))
        wt = wb if wb_s is None else wb_s
        note = _stream_note(wb, wt)
        if not gemv:
            return _timed(name, T * fl, wb + T * act, lc.seconds(T), (wt + T * act) * gm, ov,
                          (*c_eff, m_eff * (wb + T * act) / (wt + T * act), m_src + note))
        # T passes, each streaming the weights at the GEMV rate
        return _timed(name, T * fl, T * (wb + act), T * lc.seconds(1),
                      T * (wt * gv + act * gm), ov, (*c_eff, v_eff * wb / wt, v_src + note))

    fl, wb, act = raw["qkv_proj"]
    lin_f = size_factor(p.linear_token_factors, T)
    ops.append(linear("qkv_proj", "qkv_proj", fl, wb, act))
    fa, kv_ctx, per_new = raw["attn"]
    a_eff, a_src = src["attn_compute_efficiency"]
    d_eff, d_src = src["attn_memory_efficiency"]
    if Tp or Pctx:  # FlashAttention: the pairs, plus each query's fixed work (half_keys)
        hk = st["half_keys"]
        c = (P + Tp * hk) * fa * ac
        keys = P / Tp if Tp else 0.0
        note = (f" x keys/(keys+{hk:.0f}) = {keys / (keys + hk):.3f} at {keys:,.0f} keys/query"
                if hk and keys else "")
        reread = st["reread"]  # vLLM's Triton unified attention: K/V re-read per query block
        if reread:
            bq = triton_block_q(cm.shard.heads, cm.shard.kv_heads)
            nb, mem = P * kv_ctx / bq + Tp * per_new, P * reread + Tp * per_new * am
            pa_eff = nb / cm.accelerator.mem_bw_bytes_per_s / mem if mem else 0.0
            pa_src = (f"simulator/catalog/kernels.yaml {cm.kernels.arch}.triton_attn."
                      f"reread_bandwidth (vLLM's Triton unified attention: the K/V prefix read "
                      f"once per {bq}-token query block)")
        else:
            nb, mem = Pctx * kv_ctx + Tp * per_new, (Pctx * kv_ctx + Tp * per_new) * am
            pa_eff, pa_src = d_eff, d_src
        ops.append(_timed("attn_prefill", P * fa, nb, c, mem, ov,
                          (P * fa * ac / c * a_eff if c else a_eff, a_src + note, pa_eff, pa_src)))
    if Rd:  # Dctx includes the decode padding (`CostModel.decode_attn_tokens`)
        fd, kv_d = raw["attn_decode"]  # MLA: the absorbed form over the latent
        rq = st["req_tokens"]
        # flash_attn_2 beside prompt tokens, or where every layer slides: each decode reads
        # its K/V once per query head
        mix = (st["fast"].dmix if Tp else 1.0) * st["decode_kv_always"]
        akv = rate["attn_kv_m"]  # the KV cache's reads (an FP8 cache's conversion)
        nb = Dctx * kv_d * mix + Rd * per_new
        m = Dctx * kv_d * mix * akv + Rd * per_new * am + Rd * rq * kv_d * akv
        note = (f" x ctx/(ctx+{rq:g}) = {Dctx / (Dctx + Rd * rq):.3f} at "
                f"{Dctx / Rd:,.0f} tokens/request" if rq else "")
        if akv != am:
            note += (f"; x {am / akv:.2f} for the FP8 KV cache (kernels.yaml "
                     f"{cm.kernels.arch}.attn_decode.fp8_kv_relative)")
        if mix != 1.0:
            why = ("with a sliding window" if st["decode_kv_always"] != 1.0
                   else "beside prompt tokens")
            note += (f"; vLLM's FlashAttention-2 varlen call {why}: K/V read once per query "
                     f"head ({mix:g} per KV head, no GQA packing)")
        ops.append(_timed("attn_decode", Dctx * fd, nb, Dctx * fd * ac, m, ov,
                          (a_eff, a_src, nb * am / m * d_eff if m else d_eff, d_src + note)))
        if p.decode_attn_overhead_s:
            ops.append(OpCost("attn_decode_setup", 0.0, 0.0,
                              raw["layers"] * p.decode_attn_overhead_s, "overhead"))
    la = raw.get("linear_attn")
    if la is not None and (Tp or Rd):  # Gated DeltaNet / Mamba-2 layers (costmodel.py `ldr`)
        fast = st["fast"]
        prefill_s = fast.lpc + Tp * fast.lpt if Tp else 0.0
        where = ("" if not Tp else
                 f"chunked prefill: simulator/catalog/kernels.yaml {cm.kernels.arch}."
                 f"{la['kernel']} (measured kernels); " if la["measured"]
                 else f"chunked prefill: a roofline of its FLOPs at {a_src}; ")
        ops.append(OpCost("linear_attn", Tp * la["prefill_flops"] + Rd * la["decode_flops"],
                          Tp * la["prefill_bytes"] + Rd * la["decode_bytes"],
                          prefill_s + Rd * fast.ldr,
                          "compute" if prefill_s >= Rd * fast.ldr else "memory",
                          compute_s=prefill_s, memory_s=Rd * fast.ldr,
                          source=f"{where}decodes read and write each request's state at "
                                 f"{d_src}" if Rd else where.rstrip("; ")))
    fl, wb, act = raw["o_proj"]
    ops.append(linear("o_proj", "o_proj", fl, wb, act))
    fl, wb, act = raw["mlp"]
    name = "moe_experts" if model.is_moe else "mlp"
    fs = raw.get("expert_stream", 1.0)  # routed experts' streaming seconds / the plain rate's
    if gemv:  # one token reaches k experts (k/ep on each rank with EP) and the router
        k = model.experts_per_token / cm.ep if model.is_moe else 1
        rb = raw["router_bytes"]  # (0 for a dense model)
        ops.append(linear(name, "mlp", fl, wb * k + rb, act, wb * k * fs + rb))
    elif model.is_moe:
        E, k = model.num_experts, model.experts_per_token
        # expected distinct experts (of this rank's share) hit by T tokens
        hit = raw.get("experts_per_rank", E) * (1.0 - (1.0 - k / E) ** T)
        nb = wb * hit + raw["router_bytes"] + T * act
        nb_s = wb * hit * fs + raw["router_bytes"] + T * act
        note = _stream_note(nb, nb_s)
        lc = lin["mlp"]
        c_eff = (g_eff * lc.efficiency_factor(T), g_src + _shape_note(lc, T))
        ops.append(_timed(name, T * fl, nb, lc.seconds(T), nb_s * gm, ov,
                          (*c_eff, m_eff * nb / nb_s, m_src + note)))
    else:
        ops.append(linear(name, "mlp", fl, wb, act))
    if lin_f != 1.0:  # the linears take the measured size factor, attention does not
        ops = [_times(op, lin_f) if op.name in LINEAR_OPS else op for op in ops]
    efl, eb = raw["elementwise"]
    ops.append(OpCost("norm_act_rope", T * efl, T * eb, T * eb * gm, "memory", 0.0, T * eb * gm,
                      m_eff, m_src))
    if cm.tp > 1:
        per_tok, lat = raw["allreduce"]
        link = cm.link
        c_eff, c_src = src["comm_efficiency"]
        if link.allreduce_efficiency is not None:
            c_eff = link.allreduce_efficiency
            c_src = (f"simulator/catalog/links.yaml {link.name}.allreduce_* "
                     f"({link.allreduce_fixed_s(cm.tp) * 1e6:.1f} us per call at tp={cm.tp})")
        if link.mesh_links:
            c_src += f"; {min(cm.tp - 1, link.mesh_links)} of {link.mesh_links} mesh links"
        ar_s = lat + T * per_tok * rate["allreduce"]
        arx, ard = st["fast"].arx, st["fast"].ard
        if arx < T:  # large messages: NCCL's line (collectives.py)
            ar_s -= (T - arx) * ard
            msg = T * cm.model.hidden_size * cm.precision.activation_bytes
            c_eff = T * per_tok / max(ar_s - raw["allreduce_calls"] * link.large_allreduce_call_s,
                                      1e-30) / link.group_bandwidth(cm.tp)
            how = link.large_allreduce_algorithm(cm.tp)
            c_src = (f"simulator/catalog/links.yaml {link.name}.large_allreduce_* (NCCL's {how} "
                     f"above {arx * msg / T / 1e6:.1f} MB; {msg / 1e6:.1f} MB per call at "
                     f"tp={cm.tp})")
        ops.append(OpCost("tp_allreduce", 0.0, T * per_tok, ar_s,
                          "communication", efficiency=c_eff, source=c_src))
    if cm.all_to_all:  # dispatch + combine over the EP link
        per_tok, lat = raw["ep_alltoall"]
        c_eff, c_src = src["comm_efficiency"]
        ops.append(OpCost("ep_all_to_all", 0.0, T * per_tok, lat + T * per_tok * rate["ep_link"],
                          "communication", efficiency=c_eff, source=c_src))
    floor = getattr(cm.kernels, "layer_floor_s", 0.0)
    ops.append(OpCost("layer_overhead", 0.0, 0.0, raw["layer_floor_s"],
                      "overhead", source=(f"{cm.kernels.source('layer_floor')} "
                                          f"({raw['layer_floor_s'] / max(raw['layers'], 1) * 1e6:.1f}"
                                          " us/layer)"
                                          if floor and p.device is None
                                          and p.layer_overhead_s == floor
                                          else _overhead_source(p))))
    if st["last"]:
        fl, wb, act = raw["lm_head"]
        lc = lin["lm_head"]
        h_eff = lc.efficiency * lc.efficiency_factor(R)
        h_src = "16-bit LM head: BF16 GEMM efficiency" + _shape_note(lc, R)
        if R == 1.0:  # one request: a GEMV
            head = _timed("lm_head", fl, wb + act, lc.seconds(1), wb * gv + act * gm, ov,
                          (h_eff, h_src, v_eff, v_src))
        else:
            head = _timed("lm_head", R * fl, wb + R * act, lc.seconds(R), (wb + R * act) * gm,
                          ov, (h_eff, h_src, m_eff, m_src))
        ops.append(_times(head, size_factor(p.lm_head_row_factors, R)))
        sb = R * raw["sampling"]
        ops.append(OpCost("sampling", 0.0, sb, sb * gm, "memory", 0.0, sb * gm, m_eff, m_src))
        if cm.tp > 1:
            per_req, lat = raw["gather"]
            ops.append(OpCost("logits_gather", 0.0, R * per_req, lat + R * per_req * lk,
                              "communication"))
    else:
        per_tok, lat = raw["pp_send"]
        ops.append(OpCost("pp_send", 0.0, T * per_tok, lat + T * per_tok * lk, "communication"))
    return ops


def _overhead_source(p: CostParams, what: str = "overheads") -> str:
    return p.source if p.device is not None else f"simulator/cost/params.py ({what})"


def size_factor(table: tuple[float, ...], n: float) -> float:
    """`table`'s factor for size `n` (element n - 1), 1.0 beyond it or for a fractional n."""
    return table[int(n) - 1] if table and n <= len(table) and n == int(n) else 1.0


def _times(op: OpCost, k: float) -> OpCost:
    """`op` taking `k` x its time (same FLOPs and bytes)."""
    if k == 1.0:
        return op
    return OpCost(op.name, op.flops, op.bytes, op.time_s * k, op.bound, op.compute_s * k,
                  op.memory_s * k, None if op.efficiency is None else op.efficiency / k,
                  op.source + f" x measured size factor {k:.3f}")


def _scale(op: OpCost, k: float) -> OpCost:
    return OpCost(op.name, op.flops * k, op.bytes * k, op.time_s * k, op.bound,
                  op.compute_s * k, op.memory_s * k, op.efficiency, op.source)


def explain_step(cm: CostModel, shape: BatchShape) -> StepBreakdown:
    """Per-operator costs of one step. With pp > 1 the operators are those of the slowest
    stage summed over the micro-batches, plus `pipeline_bubble`: the time the other stages
    add while filling and draining the pipeline."""
    T = shape.num_tokens
    desc = cm.describe()
    if T <= 0:
        return StepBreakdown(0.0, [], 0, shape.num_reqs, desc)
    mb = cm.num_microbatches(shape)
    desc["microbatches"] = mb
    P, Pctx, Dctx = cm.attention_sums(shape)  # sliding layers: capped at the window
    per_stage = [
        _stage_ops(cm, st, T / mb, shape.num_reqs / mb, shape.num_prefill_tokens / mb,
                   P / mb, Pctx / mb, shape.num_decode_reqs / mb, Dctx / mb)
        for st in cm._stages
    ]
    times = [sum(op.time_s for op in ops) for ops in per_stage]
    if cm.pp == 1:
        ops = list(per_stage[0])
    else:
        crit = max(range(cm.pp), key=lambda s: times[s])
        ops = [_scale(op, mb) for op in per_stage[crit]]
        bubble = sum(t for s, t in enumerate(times) if s != crit)
        ops.append(OpCost("pipeline_bubble", 0.0, 0.0, bubble, "overhead"))
    ops.append(OpCost("step_overhead", 0.0, 0.0, host_overhead_s(cm, shape), "overhead",
                      source=_overhead_source(cm.params)))
    eager = cm.eager
    if cm._eager_s and eager.runs_eagerly(T, shape.num_prefill_tokens):
        ops.append(OpCost("eager_dispatch", 0.0, 0.0, cm._eager_s,
                          "overhead", source=(
                              f"{cm.model.num_layers} layers x {eager.layer_s * 1e3:.3f} ms: a "
                              f"step with prompt tokens and more than {eager.max_graph_tokens} "
                              "tokens runs outside CUDA graphs (cluster.prefill_graph_max_tokens; "
                              + (EAGER_LAYER_SOURCE if eager.layer_s == SGLANG_EAGER_LAYER_S
                                 else "cluster.eager_layer_s") + ")")))
    if cm.host_request_s:
        ops.append(_scheduler_op(cm, shape, sum(op.time_s for op in ops)))
    return StepBreakdown(sum(op.time_s for op in ops), ops, T, shape.num_reqs, desc)


def _scheduler_op(cm: CostModel, shape: BatchShape, rest_s: float) -> OpCost:
    """The engine scheduler's share of the step: all of its `host_request_s` x requests, or
    with async scheduling what of it outlasts the rest of the step (`rest_s`)."""
    h = shape.num_reqs * cm.host_request_s
    shown = cm.with_scheduler_host(rest_s, shape.num_reqs) - rest_s
    how = ("beside the step (async scheduling): only what outlasts it counts"
           if cm.async_scheduling else "the GPU waits for it (synchronous scheduling)")
    return OpCost("scheduler_host", 0.0, 0.0, shown, "overhead",
                  source=f"cluster.host_request_s: {shape.num_reqs} requests x "
                         f"{cm.host_request_s * 1e6:.1f} us = {h * 1e3:.3f} ms of the engine's "
                         f"scheduler between steps, {how}")


def host_overhead_s(cm: CostModel, shape: BatchShape) -> float:
    """Seconds of per-step host work: per step, per token and per request."""
    p = cm.params
    return (p.step_overhead_s + shape.num_tokens * p.token_overhead_s
            + shape.num_reqs * p.request_overhead_s)
