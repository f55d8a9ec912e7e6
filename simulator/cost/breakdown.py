"""The slow, explainable side of `CostModel`: per-operator breakdowns (`explain_step`) and the
vectorised all-decode run (`decode_run_times`). Both agree with `CostModel.step_time`
(tests/test_costmodel*.py check it)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from simulator.core.batch_shape import BatchShape
from simulator.cost.models import ModelSpec
from simulator.cost.op_cost import OpCost, StepBreakdown
from simulator.cost.params import CostParams


class CostModel(Protocol):
    """What these functions read of `simulator.cost.costmodel.CostModel` (a protocol, so this
    module does not import the class that calls it)."""

    model: ModelSpec
    params: CostParams
    tp: int
    pp: int
    ep: int
    _stages: list[dict[str, Any]]
    _padding: float
    _slide: float  # share of layers that slide
    _window: int

    def _windowed(self, shape: BatchShape) -> bool: ...
    def decode_attn_tokens(self, shape: BatchShape) -> float: ...
    def attention_sums(self, shape: BatchShape) -> tuple[float, float, float]: ...
    def num_microbatches(self, shape: BatchShape) -> int: ...
    def describe(self) -> dict[str, Any]: ...
    @staticmethod
    def _stage_time(fast: tuple, T: float, R: float, Tp: float, P: float, Pctx: float,
                    Rd: float, Dctx: float) -> float: ...


# per-layer operators that `CostParams.linear_token_factors` scales
LINEAR_OPS = ("qkv_proj", "o_proj", "mlp", "moe_experts")


def _timed(name: str, flops: float, nbytes: float, c: float, m: float, ov: float) -> OpCost:
    """An operator of `c` compute and `m` memory seconds: max(c, m) + ov x min(c, m)."""
    t = c + ov * m if c > m else m + ov * c
    return OpCost(name, flops, nbytes, t, "compute" if c > m else "memory", c, m)


def _roofline(name: str, flops: float, nbytes: float, rate_c: float, rate_m: float,
              ov: float = 0.0) -> OpCost:
    """max(c, m) + ov x min(c, m) seconds, ov = 1 - `CostParams.overlap`."""
    return _timed(name, flops, nbytes, flops * rate_c, nbytes * rate_m, ov)


def _stage_ops(cm: CostModel, st: dict[str, Any], T: float, R: float, Tp: float, P: float,
               Pctx: float, Rd: float, Dctx: float) -> list[OpCost]:
    """Operators of one stage for one micro-batch (same arithmetic as `_stage_time`)."""
    raw, rate = st["raw"], st["rate"]
    gc, gm, ac, am, lk = (rate[k] for k in ("gemm_c", "gemm_m", "attn_c", "attn_m", "link"))
    model, p = cm.model, cm.params
    ov = 1.0 - p.overlap
    ops: list[OpCost] = []
    gv = rate["gemv_m"]
    gemv = T == 1.0 or 1.0 < T < p.gemm_row_passes_below  # linears as T GEMV passes

    def linear(name: str, fl: float, wb: float, act: float) -> OpCost:
        if not gemv:
            return _roofline(name, T * fl, wb + T * act, gc, gm, ov)
        # T passes, each streaming the weights at the GEMV rate
        return _timed(name, T * fl, T * (wb + act), T * fl * gc, T * (wb * gv + act * gm), ov)

    fl, wb, act = raw["qkv_proj"]
    lin_f = size_factor(p.linear_token_factors, T)
    ops.append(linear("qkv_proj", fl, wb, act))
    fa, kv_ctx, per_new = raw["attn"]
    if Tp or Pctx:
        ops.append(_roofline("attn_prefill", P * fa, Pctx * kv_ctx + Tp * per_new, ac, am, ov))
    if Rd:  # Dctx includes the decode padding (`CostModel.decode_attn_tokens`)
        fd, kv_d = raw["attn_decode"]  # MLA: the absorbed form over the latent
        ops.append(_roofline("attn_decode", Dctx * fd, Dctx * kv_d + Rd * per_new, ac, am, ov))
        if p.decode_attn_overhead_s:
            ops.append(OpCost("attn_decode_setup", 0.0, 0.0,
                              raw["layers"] * p.decode_attn_overhead_s, "overhead"))
    fl, wb, act = raw["o_proj"]
    ops.append(linear("o_proj", fl, wb, act))
    fl, wb, act = raw["mlp"]
    if gemv:  # one token reaches k experts (k/ep on each rank with EP) and the router
        k = model.experts_per_token / cm.ep if model.is_moe else 1
        ops.append(linear("moe_experts" if model.is_moe else "mlp", fl,
                          wb * k + raw["router_bytes"], act))
    elif model.is_moe:
        E, k = model.num_experts, model.experts_per_token
        # expected distinct experts (of this rank's share) hit by T tokens
        hit = raw.get("experts_per_rank", E) * (1.0 - (1.0 - k / E) ** T)
        ops.append(_roofline("moe_experts", T * fl, wb * hit + raw["router_bytes"] + T * act,
                             gc, gm, ov))
    else:
        ops.append(_roofline("mlp", T * fl, wb + T * act, gc, gm, ov))
    if lin_f != 1.0:  # the linears take the measured size factor, attention does not
        ops = [_times(op, lin_f) if op.name in LINEAR_OPS else op for op in ops]
    efl, eb = raw["elementwise"]
    ops.append(OpCost("norm_act_rope", T * efl, T * eb, T * eb * gm, "memory", 0.0, T * eb * gm))
    if cm.tp > 1:
        per_tok, lat = raw["allreduce"]
        ops.append(OpCost("tp_allreduce", 0.0, T * per_tok, lat + T * per_tok * lk,
                          "communication"))
    if cm.ep > 1:  # MoE dispatch + combine over the EP link
        per_tok, lat = raw["ep_alltoall"]
        ops.append(OpCost("ep_all_to_all", 0.0, T * per_tok, lat + T * per_tok * rate["ep_link"],
                          "communication"))
    ops.append(OpCost("layer_overhead", 0.0, 0.0, raw["layers"] * cm.params.layer_overhead_s,
                      "overhead"))
    if st["last"]:
        fl, wb, act = raw["lm_head"]
        if R == 1.0:  # one request: a GEMV
            head = _timed("lm_head", fl, wb + act, fl * gc, wb * gv + act * gm, ov)
        else:
            head = _roofline("lm_head", R * fl, wb + R * act, gc, gm, ov)
        ops.append(_times(head, size_factor(p.lm_head_row_factors, R)))
        sb = R * raw["sampling"]
        ops.append(OpCost("sampling", 0.0, sb, sb * gm, "memory", 0.0, sb * gm))
        if cm.tp > 1:
            per_req, lat = raw["gather"]
            ops.append(OpCost("logits_gather", 0.0, R * per_req, lat + R * per_req * lk,
                              "communication"))
    else:
        per_tok, lat = raw["pp_send"]
        ops.append(OpCost("pp_send", 0.0, T * per_tok, lat + T * per_tok * lk, "communication"))
    return ops


def size_factor(table: tuple[float, ...], n: float) -> float:
    """`table`'s factor for size `n` (element n - 1), 1.0 beyond it or for a fractional n."""
    return table[int(n) - 1] if table and n <= len(table) and n == int(n) else 1.0


def _times(op: OpCost, k: float) -> OpCost:
    """`op` taking `k` x its time (same FLOPs and bytes)."""
    if k == 1.0:
        return op
    return OpCost(op.name, op.flops, op.bytes, op.time_s * k, op.bound, op.compute_s * k,
                  op.memory_s * k)


def _scale(op: OpCost, k: float) -> OpCost:
    return OpCost(op.name, op.flops * k, op.bytes * k, op.time_s * k, op.bound,
                  op.compute_s * k, op.memory_s * k)


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
    ops.append(OpCost("step_overhead", 0.0, 0.0, host_overhead_s(cm, shape), "overhead"))
    return StepBreakdown(sum(op.time_s for op in ops), ops, T, shape.num_reqs, desc)


def host_overhead_s(cm: CostModel, shape: BatchShape) -> float:
    """Seconds of per-step host work: per step, per token and per request."""
    p = cm.params
    return (p.step_overhead_s + shape.num_tokens * p.token_overhead_s
            + shape.num_reqs * p.request_overhead_s)


def decode_run_times(cm: CostModel, shape: BatchShape, num_steps: int) -> np.ndarray:
    """Durations (s) of `num_steps` all-decode steps whose contexts grow by one per step.
    Element j is computed with exactly the arithmetic of `decode_step_time(shape.advanced(j))`,
    so a burst and the same steps one at a time give bit-identical times."""
    if shape.num_prefill_reqs:
        raise ValueError("decode_run_times needs an all-decode batch "
                         f"(this one has {shape.num_prefill_reqs} prefill requests)")
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 0:
        raise ValueError(f"num_steps must be an integer >= 0, got {num_steps!r}")
    if num_steps == 0 or shape.num_tokens <= 0:
        return np.zeros(num_steps)
    # the contexts grow by one per decode per step; the padding to the longest stays constant
    j = np.arange(num_steps, dtype=np.int64)
    D = shape.decode_context_tokens + j * shape.num_decode_reqs
    win = None
    if cm._slide and cm._windowed(shape):  # below the window they grow, at it they do not
        Dw = shape.decode_window_tokens + j * shape.num_decodes_below_window
        win = (Dw.astype(np.float64), shape.max_decode_context + j)
    return _decode_times(cm, shape, D.astype(np.float64), np.maximum, np.minimum, win)


def decode_step_time(cm: CostModel, shape: BatchShape) -> float:
    """Seconds of one all-decode step: `decode_run_times(cm, shape, 1)[0]` without numpy (it
    may differ from `CostModel.step_time` in the last bits)."""
    win = None
    if cm._slide and cm._windowed(shape):
        win = (float(shape.decode_window_tokens), shape.max_decode_context)
    return _decode_times(cm, shape, float(shape.decode_context_tokens), max, min, win)


def _decode_times(cm: CostModel, shape: BatchShape, D, vmax, vmin, win=None):
    """Step seconds of the all-decode `shape` at summed decode contexts `D` (a float, or an
    array of them: elementwise the same float operations); `win`: (window-capped sums,
    longest contexts) for a model with sliding layers."""
    T = shape.num_tokens
    mb = cm.num_microbatches(shape)
    R, Rd = shape.num_reqs / mb, shape.num_decode_reqs / mb
    pad = shape.num_decode_reqs * shape.max_decode_context - shape.decode_context_tokens
    padding = cm._padding
    ctx = D + padding * pad if padding and pad > 0 else D
    if win is not None:  # sliding layers read the window-capped contexts
        Dw, longest = win
        Dw = Dw + padding * (shape.num_decode_reqs * vmin(longest, cm._window) - Dw)
        ctx = ctx + cm._slide * (Dw - ctx)
    ctx = ctx / mb
    ov = 1.0 - cm.params.overlap
    stage_times = []
    for st in cm._stages:
        fast = st["fast"]
        ac, akv, aq = fast[-2], fast[-1], fast[14]  # decode attention (MLA: absorbed form)
        # the stage without its decode-attention term, then the growing attention term
        rest = cm._stage_time(fast, T / mb, R, 0.0, 0.0, 0.0, Rd, 0.0) - Rd * aq
        c, m = ctx * ac, ctx * akv + Rd * aq
        stage_times.append(rest + (vmax(c, m) + ov * vmin(c, m) if ov else vmax(c, m)))
    if cm.pp == 1:
        total = stage_times[0]
    else:
        total = stage_times[0]
        for t in stage_times[1:]:
            total = total + t
        longest = stage_times[0]
        for t in stage_times[1:]:
            longest = vmax(longest, t)
        total = total + (mb - 1) * longest
    return total + host_overhead_s(cm, shape)
