"""`StageCoefs`: the per-stage constants `CostModel._stage_time` prices a step with, built once
in `CostModel.__init__` (seconds per FLOP or byte already multiplied in). A named tuple, so the
hot path unpacks it positionally at tuple speed while other readers (the decode-run pricing in
`breakdown.py`) use names instead of positions."""

from __future__ import annotations

from typing import Any, NamedTuple


class StageCoefs(NamedTuple):
    qc: float  # qkv GEMM compute seconds per row
    qm0: float  # qkv weight read seconds (once per step)
    qm1: float  # qkv activation seconds per row
    oc: float
    om0: float
    om1: float
    mc: float  # MLP (or routed experts) compute seconds per row
    mm0: float
    mm1: float
    rtr: float  # MoE router / shared-expert / dense-MLP read seconds
    n_exp: float  # experts on this rank (1: dense)
    hit: float  # 1 - k/E: a token misses a given expert
    ac: float  # prefill attention seconds per query-key pair
    akv: float  # prefill attention seconds per context KV token
    aq: float  # attention seconds per query token (its own K, V, Q)
    el: float  # elementwise seconds per token
    cm1: float  # collectives seconds per token
    cm0: float  # collectives fixed seconds
    lovh: float  # per-layer kernel floor seconds
    lc: float  # LM head compute seconds per row
    lm0: float
    lm1: float
    smp: float  # sampling seconds per request
    g1: float  # logits gather seconds per request
    g0: float
    s1: float  # pipeline send seconds per token
    s0: float
    ov: float  # 1 - overlap
    passes_below: float  # linears run as per-row GEMV passes below this many tokens
    qv: float  # one GEMV pass's weight seconds: qkv, o, MLP, LM head
    ovv: float
    mv: float
    lmv: float
    lin_f: Any  # measured GEMM size factors by tokens (calibration)
    head_f: Any  # measured LM head size factors by requests
    dovh: float  # decode attention set-up seconds per step
    q_lin: Any  # shaped LinearCost or None (linear in rows)
    o_lin: Any
    m_lin: Any
    h_lin: Any
    aqk: float  # prefill attention's fixed work per query
    dreq: float  # decode attention seconds per request
    dac: float  # decode attention seconds per query-key pair (MLA: absorbed form)
    dakv: float  # decode attention seconds per context KV token
    q1: float  # one row of qkv: shaped seconds, or qc
    o1: float
    m1: float
    aqd: float  # aq + dreq: a decode request's fixed attention seconds
    apr: float  # prefill attention memory seconds per query-key pair (triton_attn's K/V
    # re-reads; 0 for FlashAttention, which reads the context once: akv)
    dmix: float  # decode KV reads x this in a step with prompt tokens (flash_attn_2: the
    # query heads per KV head, its unpacked decode rows; else 1)
    lpc: float = 0.0  # linear-attention layers: seconds per step with prompt tokens
    lpt: float = 0.0  # ... seconds per prompt token (the chunked kernels)
    ldr: float = 0.0  # ... seconds per decode request (its state read and written)
    arx: float = float("inf")  # tokens above which the TP all-reduces take NCCL's
    # large-message line (collectives.large_allreduce_crossover)
    ard: float = 0.0  # ... and the seconds that line saves per token beyond them
