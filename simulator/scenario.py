"""Scenario files: one YAML document describing model, hardware, cluster, scheduler,
KV cache, workload, SLOs and outputs; validated on load (pydantic, unknown keys
refused), with `--set a.b.c=value` overrides.

Paths inside a scenario (trace files, calibration files, config.json) are relative
to the scenario file's folder.

Benchmark-style load (`workload`): `arrival: {process: burst}` re-times the workload so that
every request arrives at t = 0 (the "infinite rate" of `trtllm-bench` / `vllm bench serve
--request-rate inf`; any `workloads.arrivals` process may be given); `max_concurrency: N` is a
closed loop (at most N requests in the system, a new one sent when one ends, as
`--max-concurrency` / `--concurrency` do: a request is sent at max(its arrival, the time a
slot frees) and its TTFT, queueing and E2E count from that send). `scheduler.capacity_policy`:
`max_utilization` (vLLM, the default), `guaranteed_no_evict` (TensorRT-LLM) or
`reserve_ratio` (SGLang; `simulator.core.capacity`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from simulator.cost.eager_dispatch import SGLANG_EAGER_LAYER_S
from simulator.cost.kernels import AttentionBackend, FusedMoEConfig
from simulator.cost.memory_plan import MEMORY_RULES
from simulator.cost.moe_cost import MoEA2ABackend
from simulator.defaults import DEFAULT_HARDWARE, DEFAULT_MODEL
from simulator.engines import apply_engine
from simulator.engines.sglang_server import fill_max_running
from simulator.engines.trtllm_bench import fill_limits
from simulator.validation_errors import format_validation_error
from simulator.yaml_file import read_yaml_mapping
from workloads.arrivals import validate_arrival

Spec = str | dict[str, Any]


class _Strict(BaseModel):
    # unknown keys and non-finite numbers (nan, inf) are refused by name
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# how a pool spreads requests over its replicas (simulator/cluster/router.py)
RouterPolicy = Literal["round_robin", "least_outstanding_tokens", "least_kv_usage", "prefix_aware"]


class PoolSpec(_Strict):
    """A pool of identical replicas (PD prefill or decode side)."""

    replicas: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    # expert parallelism (MoE models): 1, or tp (each GPU holds experts/ep whole experts).
    # See simulator/cost/moe_cost.py.
    ep: int = Field(1, ge=1)
    # how the MoE layers reach the experts (ClusterSpec.moe_a2a_backend)
    moe_a2a_backend: MoEA2ABackend = "none"
    ep_link: Literal["scale_up", "scale_out"] = "scale_up"  # the all-to-all's link
    hardware: Spec | None = None  # default: the scenario's hardware
    router: RouterPolicy = "least_outstanding_tokens"
    num_gpu_blocks: int | None = Field(None, ge=1)
    # this pool's attention kernel (ClusterSpec.attention_backend); default: the cluster's
    attention_backend: AttentionBackend | None = None


class PDSpec(_Strict):
    prefill: PoolSpec = PoolSpec()
    decode: PoolSpec = PoolSpec()
    link: Spec = "ib-ndr"
    transfer: Literal["whole", "layerwise"] = "whole"
    # when the user sees the first token: "decode" = once the decode replica holds the KV
    # (vLLM's disaggregated proxy; the transfer counts in TTFT), "prefill" = as soon as the
    # prefill replica samples it (DistServe; the transfer counts in the first gap)
    first_token: Literal["decode", "prefill"] = "decode"


class ClusterSpec(_Strict):
    replicas: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)  # expert parallelism, as PoolSpec.ep
    # how the MoE layers reach the experts with ep > 1: "none" (the engines' default: every
    # rank holds every token, the hidden states are all-reduced, or with dp_attention
    # all-gathered and reduce-scattered) or "all_to_all" (each token dispatched to its k
    # experts' ranks and combined back over ep_link: SGLang --moe-a2a-backend deepep, vLLM's
    # DeepEP / pplx all2all backends). See simulator/cost/moe_cost.py.
    moe_a2a_backend: MoEA2ABackend = "none"
    ep_link: Literal["scale_up", "scale_out"] = "scale_up"  # the all-to-all's link
    # the fused-MoE kernel config: "tuned" (or vLLM's defaults from v0.17) or "legacy_default"
    # (vLLM's before v0.17, SGLang's, for a shape without a tuned file;
    # simulator/engines/fused_moe_fallback.py)
    fused_moe_config: FusedMoEConfig = "tuned"
    router: RouterPolicy = "round_robin"
    router_load_cap: float = Field(1.5, ge=1.0)
    # the TP all-reduce the engine calls: "custom" (vLLM's custom all-reduce, TensorRT-LLM's
    # plugin: the ring model) or "nccl" (NCCL's per-call extra; simulator/cost/collectives.py)
    allreduce: Literal["custom", "nccl"] = "custom"
    # the attention kernel (simulator/cost/kernels.py ATTENTION_BACKENDS): "flash_attn"
    # (FlashAttention / FlashInfer-class kernels, decodes GQA-packed), "flash_attn_2" (vLLM's
    # one FlashAttention-2 varlen call per step: decodes beside prompt tokens read their K/V
    # once per query head) or "triton_attn" (vLLM's Triton unified attention, which re-reads
    # the K/V prefix per block of query tokens; kernels.yaml triton_attn)
    attention_backend: AttentionBackend = "flash_attn"
    pd: PDSpec | None = None  # present = disaggregated prefill/decode
    # All replicas run on one host and share its memory bandwidth (e.g. 1P1D workers on one
    # CPU machine): the share of its bandwidth each of two streaming processes gets (two
    # STREAM reads on this 2-core host each get ~0.63 of one alone; `kvpd profile` measures
    # it as device_facts.mem_bw_share). A step starting while a neighbour is in a step whose
    # time is a fraction f memory streams at 1 - (1 - share) f. None: separate devices.
    host_memory_share: float | None = Field(None, gt=0, le=1)
    # ... and computes at this share of its speed alone (a busy neighbour core takes shared
    # caches and clock headroom; `kvpd calibrate` fits it from the profile's contended
    # steps). None: 1. See simulator/cost/host_share.py.
    host_compute_share: float | None = Field(None, gt=0, le=1)
    # data-parallel attention (SGLang --enable-dp-attention with --dp = --tp, TensorRT-LLM
    # enable_attention_dp, vLLM --data-parallel-size with --enable-expert-parallel): each of a
    # replica's tp GPUs runs the attention of its own requests (whole attention weights, a KV
    # pool of its own, a scheduler of its own), and all of them run the MoE layers together
    # over every rank's tokens, experts split ep ways (ep = tp) or tp ways (ep = 1); the ranks
    # step in lockstep (simulator/cluster/dp_group.py, simulator/cost/dp_attention.py)
    dp_attention: bool = Field(False, strict=True)
    # steps outside CUDA graphs (simulator/cost/eager_dispatch.py): a step with prompt tokens
    # and more tokens than this runs eagerly, its layers' host dispatch (eager_layer_s each)
    # added to it. 0: every such step (SGLang before v0.5.10); N: SGLang's
    # piecewise_cuda_graph_max_tokens; None: every step under graphs (kvpd's default). The
    # sglang engine preset sets it by version (simulator/engines/presets.py)
    prefill_graph_max_tokens: int | None = Field(None, ge=0)
    eager_layer_s: float = Field(SGLANG_EAGER_LAYER_S, ge=0)
    # the engine's host seconds per scheduled request per step that the GPU waits for (its
    # scheduler's Python before and after each step), added to every step beside the cost
    # params' own request term; None: 0. The vllm engine preset sets it by version, for its V0
    # and V1 engines (simulator/engines/vllm_host.py)
    host_request_s: float | None = Field(None, ge=0)
    # the engine schedules the next step while the GPU runs this one (vLLM's
    # --async-scheduling): host_request_s then counts only where it outlasts the step. None:
    # false. The vllm engine preset sets it by version (simulator/engines/vllm_host.py)
    async_scheduling: bool | None = Field(None, strict=True)

    @model_validator(mode="after")
    def _dp_attention(self):
        if not self.dp_attention:
            return self
        clash = [f"cluster.{k} = {getattr(self, k)}" for k in ("host_memory_share",
                                                               "host_compute_share")
                 if getattr(self, k) is not None]
        if self.pd is not None:
            clash.append("cluster.pd (a PD deployment; data-parallel attention is for a "
                         "colocated replica)")
        if self.pp != 1:
            clash.append(f"cluster.pp = {self.pp} (data-parallel attention runs at pp = 1)")
        if self.tp < 2:
            clash.append(f"cluster.tp = {self.tp} (it needs tp >= 2 GPUs to spread attention "
                         "over; one GPU per replica is cluster.replicas)")
        if clash:
            raise ValueError("cluster.dp_attention: true cannot be combined with "
                             + "; ".join(clash))
        return self


class SchedulerSpec(_Strict):
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    max_model_len: int | None = Field(None, ge=1)  # default: the model's context length
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = Field(0, ge=0)
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    policy: Literal["fcfs", "priority"] = "fcfs"
    batching: Literal["continuous", "static"] = "continuous"
    # "max_utilization": admit while blocks are free, preempt when they run out (vLLM);
    # "guaranteed_no_evict": reserve prompt + max_tokens at admission, never preempt
    # (TensorRT-LLM's default). See simulator/core/capacity.py.
    capacity_policy: Literal["max_utilization", "guaranteed_no_evict", "reserve_ratio"] = \
        "max_utilization"
    # True: a step holds prompt tokens and decodes together (vLLM V1, TensorRT-LLM); False:
    # prompts run in steps of their own, first, while decodes wait (SGLang's default, vLLM V0
    # without chunked prefill). See simulator/core/config.py.
    mixed_batches: bool = True
    # the prompt's last token runs in the next step, as a decode that samples the first token
    # (LMDeploy TurboMind before v0.1.0a2; SchedulerConfig.first_token_from_decode)
    first_token_from_decode: bool = False
    # capacity_policy reserve_ratio: SGLang's --schedule-conservativeness (its ratio of the
    # running outputs starts at min(0.7 x this, 1); SchedulerConfig.schedule_conservativeness)
    schedule_conservativeness: float = Field(1.0, gt=0)
    # "per_chunk": a prompt takes blocks as its chunks run (vLLM V1); "whole_prompt": a waiting
    # request is admitted only when the blocks of all its tokens fit, and takes them at once
    # (vLLM V0's BlockSpaceManager; SchedulerConfig.prompt_allocation)
    prompt_allocation: Literal["per_chunk", "whole_prompt"] = "per_chunk"
    # the share of the pool an admission must leave free (vLLM V0's watermark, 0.01)
    admission_watermark: float = Field(0.0, ge=0, lt=1)
    # a running request is scheduled only while a block is free, needed or not (vLLM V0's
    # can_append_slots; SchedulerConfig.append_needs_free_block)
    append_needs_free_block: bool = False
    # SGLang's --scheduler-recv-interval: a decoding engine takes arrivals in every N-th step
    # (SchedulerConfig.recv_interval; colocated replicas without data-parallel attention)
    recv_interval: int = Field(1, ge=1)
    # TensorRT-LLM's batch waiting: in a decoding step, waiting requests wait until this many
    # steps were held or their tokens reach the ratio x max_num_batched_tokens (both set: on;
    # SchedulerConfig.batch_wait_timeout_iters / batch_wait_max_tokens_ratio)
    batch_wait_timeout_iters: int = Field(0, ge=0)
    batch_wait_max_tokens_ratio: float = Field(0.0, ge=0, le=1)


MEMORY_RULES_TEXT = ("gpu_memory_utilization is vLLM's share of all memory for weights, "
                     "activations and KV; free_gpu_memory_fraction TensorRT-LLM's share of what "
                     "weights and activations leave; mem_fraction_static SGLang's share of all "
                     "memory for weights and KV")


class CacheSpec(_Strict):
    block_size: int = Field(16, ge=1)
    # auto (the 16-bit activation dtype, whatever the weights: vLLM's "auto"), bf16, fp16, fp8
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    # TensorRT-LLM's KV sizing instead: this fraction of what weights and activations leave
    free_gpu_memory_fraction: float | None = Field(None, gt=0, le=1)
    # SGLang's instead: weights + KV take this fraction of memory (activations the rest)
    mem_fraction_static: float | None = Field(None, gt=0, le=1)
    num_gpu_blocks: int | None = Field(None, ge=1)  # overrides the memory plan
    swap_space_gb: float = Field(0.0, ge=0)  # host pool per replica, GB
    enable_prefix_caching: bool = True
    # vLLM's --disable-hybrid-kv-cache-manager: false gives a model that mixes sliding-window
    # and full-attention layers a block table per group of layers (vLLM V1's hybrid KV cache
    # manager: the sliding layers hold only their window); None (the default without an
    # engine preset) and true keep one table for every layer. The vllm preset sets false.
    disable_hybrid_kv_cache_manager: bool | None = None

    @field_validator("kv_cache_dtype")
    @classmethod
    def _kv_dtype(cls, v):
        from simulator.cost.precision import check_kv_cache_dtype

        return check_kv_cache_dtype(v, "cache.kv_cache_dtype")

    @model_validator(mode="after")
    def _one_memory_rule(self):
        given = [k for k in MEMORY_RULES if k in self.model_fields_set and getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of {', '.join(given)}: {MEMORY_RULES_TEXT}")
        return self


class QuantizationSpec(_Strict):
    """How the weights were quantized (with `dtype`: fp8 -> fp8, int8 -> w8a8 or gptq, int4
    -> awq or gptq)."""

    method: str | None = None  # fp8, w8a8, awq, gptq, nvfp4, mxfp4 (default: by dtype)
    group_size: int | None = None  # weights per group (awq/gptq; default 128, -1 per channel)
    scope: str | None = None  # all (default), experts, mlp or mlp_and_o_proj (precision.py)

    @field_validator("method")
    @classmethod
    def _method(cls, v):
        from simulator.cost.precision import check_method

        return None if v is None else check_method(v, "quantization.method")

    @field_validator("scope")
    @classmethod
    def _scope(cls, v):
        from simulator.cost.precision import check_scope

        return None if v is None else check_scope(v, "quantization.scope")

    def to_dict(self) -> dict[str, Any] | None:
        out = {k: v for k, v in (("method", self.method), ("group_size", self.group_size),
                                 ("scope", self.scope)) if v is not None}
        return out or None


class WorkloadSpec(_Strict):
    trace: str | None = None
    format: str | None = None
    columns: dict[str, str] | None = None
    options: dict[str, Any] = {}
    synthetic: dict[str, Any] | None = None
    window_s: tuple[float, float] | None = None
    limit: int | None = Field(None, ge=1)
    target_rate: float | None = Field(None, gt=0)  # requests/s after rescaling
    rate_scale: float | None = Field(None, gt=0)  # multiply the trace's rate
    scale_prompt: float = Field(1.0, gt=0)
    scale_output: float = Field(1.0, gt=0)
    jitter: bool = False
    over_max_len: Literal["reject", "clip", "keep"] = "keep"  # "keep": the scheduler rejects
    seed: int | None = None
    # new arrival times from an arrival process (workloads/arrivals.py), rows kept in order;
    # {process: burst}: every request at t = 0
    arrival: dict[str, Any] | None = None
    # closed loop: at most N requests in the system; one is sent when another ends
    max_concurrency: int | None = Field(None, ge=1, strict=True)
    # the first N requests (trace order: the first sent) run but are not measured, as a
    # benchmark harness's warm-up requests (`--warmup-request-count`); no pause after them
    warmup_requests: int = Field(0, ge=0, strict=True)
    # the measured requests start only once every warm-up request has finished, their arrivals
    # moved by the wait (`vllm bench serve --num-warmups`, `sglang.bench_serving
    # --warmup-requests`: the warm-ups finish before the measured run); needs warmup_requests
    warmup_drain: bool = Field(False, strict=True)
    # the client asks the engine to ignore EOS (`--ignore-eos`, sglang bench_serving's default):
    # requests run to their output length either way; an engine that knows may admit
    # differently (SGLang without the radix cache: `simulator.core.capacity`)
    ignore_eos: bool = Field(False, strict=True)

    @field_validator("format")
    @classmethod
    def _format(cls, v):
        from workloads import FORMATS

        if v is not None and v not in FORMATS:
            raise ValueError(f"unknown trace format {v!r}; expected one of {', '.join(FORMATS)} "
                             "(or leave it out: detected from the file)")
        return v

    @field_validator("window_s")
    @classmethod
    def _window(cls, v):
        if v is not None and not 0 <= v[0] < v[1]:
            raise ValueError(f"window_s must be [start, end] with 0 <= start < end, got {list(v)}")
        return v

    @field_validator("arrival")
    @classmethod
    def _arrival(cls, v):
        return None if v is None else validate_arrival(v, "workload.arrival")

    @model_validator(mode="after")
    def _drain_needs_warmup(self):
        if self.warmup_drain and self.warmup_requests < 1:
            raise ValueError("workload.warmup_drain = true waits for the warm-up requests; set "
                             "workload.warmup_requests >= 1, or drop warmup_drain")
        return self

    @model_validator(mode="after")
    def _one_timing(self):
        if self.arrival is not None:
            clash = [k for k in ("target_rate", "rate_scale") if getattr(self, k) is not None]
            clash += ["jitter"] if self.jitter else []
            if clash:
                raise ValueError(f"workload.arrival replaces the trace's arrival times; drop "
                                 f"workload.{' and workload.'.join(clash)}")
        return self

    def benchmark_keys(self) -> list[str]:
        """The keys that make this a benchmark-style load, as "key = value" (empty if none):
        a closed loop, or every request at t = 0."""
        keys = [] if self.max_concurrency is None else [f"workload.max_concurrency = {self.max_concurrency}"]
        if self.arrival is not None:
            spec, key = self.arrival, "workload.arrival.process"
        else:
            spec, key = (self.synthetic or {}).get("arrival"), "workload.synthetic.arrival.process"
        if isinstance(spec, dict) and spec.get("process") == "burst":
            keys.append(f"{key} = burst")
        return keys


class EngineSpec(_Strict):
    """The serving engine a scenario stands for: its documented defaults fill every key the
    scenario leaves out (`simulator.engines`)."""

    name: Literal["vllm", "sglang", "tensorrt-llm", "lmdeploy-turbomind"]
    version: str | None = None  # e.g. "0.11.0" (vLLM's defaults and all-reduce change with it)
    entry_point: Literal["server", "offline"] = "server"  # OpenAI server, or the LLM class

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v):
        return None if v is None else str(v)


class APIServerSpec(_Strict):
    """The OpenAI-compatible server's front end (`simulator.cluster.api_server`): each request
    runs `preprocess_s` of synchronous work on one of `processes` event loops before it reaches
    the engine (0: not modelled). An engine preset prices the route clients call (`endpoint`)
    for the versions that do per-request work there (`simulator.engines.chat_template`)."""

    endpoint: Literal["chat_completions", "completions"] | None = None  # /v1/chat/completions, /v1/completions
    preprocess_s: float = Field(0.0, ge=0)  # seconds per request in its API-server process
    processes: int = Field(1, ge=1, strict=True)  # API-server processes per server (--api-server-count)
    # under cluster.pd, the servers a request passes: "prefill" (one front end, at its prefill
    # replica: Dynamo's frontend; SGLang's router sends to both servers at once, so the decode
    # side's handler overlaps the prefill) or "prefill_then_decode" (vLLM's disaggregated
    # proxy: the prefill instance's server, then once the prefill answered the decode
    # instance's, whose handler runs before its engine takes the request and pulls the KV)
    pd_route: Literal["prefill", "prefill_then_decode"] = "prefill"


class SLOSpec(_Strict):
    ttft_s: float | None = Field(None, gt=0)
    tpot_s: float | None = Field(None, gt=0)


class OutputSpec(_Strict):
    dir: str | None = None
    records: Literal["parquet", "csv"] = "parquet"
    plots: bool = True
    timeseries: bool = True


class SimSpec(_Strict):
    max_decode_burst: int = Field(1024, ge=1)  # 1 = strictly step by step
    progress: bool = False
    keep_requests: bool = False  # keep every Request and its token times (else released)
    processes: int = Field(1, ge=1)  # >1: independent replicas in parallel (simulator.multiproc)


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    seed: int = 0
    model: Spec = DEFAULT_MODEL
    # HF config keys laid over the model's config (vLLM's --hf-overrides, SGLang's
    # --json-model-override-args): e.g. GLM-5's index_topk_pattern, a shorter context
    hf_overrides: dict[str, Any] | None = None
    dtype: str = "bf16"  # weights: fp32, bf16, fp16, fp8, int8, int4
    quantization: QuantizationSpec | None = None
    hardware: Spec = DEFAULT_HARDWARE
    engine: EngineSpec | None = None  # its documented defaults fill the keys left out
    api_server: APIServerSpec = APIServerSpec()
    cluster: ClusterSpec = ClusterSpec()
    scheduler: SchedulerSpec = SchedulerSpec()
    cache: CacheSpec = CacheSpec()
    workload: WorkloadSpec = WorkloadSpec()
    slo: SLOSpec = SLOSpec()
    output: OutputSpec = OutputSpec()
    sim: SimSpec = SimSpec()
    base_dir: str = Field(".", exclude=True)  # folder that relative paths start from
    source: str = Field("<scenario>", exclude=True)  # the file (or label) it was read from
    # what `engine` filled in, one rule each (`simulator.engines.presets.apply_engine`)
    engine_notes: list[str] = Field(default_factory=list, exclude=True)

    @model_validator(mode="after")
    def _api_server(self):
        front = self.api_server
        if self.engine is not None and self.engine.entry_point == "offline" and (
                front.preprocess_s > 0 or front.endpoint is not None):
            raise ValueError(
                "engine.entry_point: offline runs the engine's LLM class, with no API server; "
                "drop api_server (got " + ", ".join(
                    f"api_server.{k} = {v}" for k, v in (("endpoint", front.endpoint),
                                                         ("preprocess_s", front.preprocess_s))
                    if v) + ")")
        if front.pd_route != "prefill" and self.cluster.pd is None:
            raise ValueError(f"api_server.pd_route: {front.pd_route} routes a request through "
                             "a decode instance's server after its prefill, which needs "
                             "cluster.pd (disaggregated prefill/decode); drop it or add cluster.pd")
        return self

    @model_validator(mode="after")
    def _hybrid_kv_cache(self):
        if self.cache.disable_hybrid_kv_cache_manager is not False:
            return self
        clash = [k for k, on in (("cluster.pd", self.cluster.pd is not None),
                                 ("cache.swap_space_gb", self.cache.swap_space_gb > 0),
                                 ("scheduler.preemption_mode: swap",
                                  self.scheduler.preemption_mode == "swap")) if on]
        if clash:
            raise ValueError("cache.disable_hybrid_kv_cache_manager: false (vLLM V1's hybrid KV "
                             "cache manager) is modelled for colocated replicas that preempt by "
                             "recompute (vLLM turns it off with a KV connector and V1 does not "
                             "swap); set it true, or drop " + " and ".join(clash))
        return self

    @model_validator(mode="after")
    def _batch_wait(self):
        s = self.scheduler
        if not (s.batch_wait_timeout_iters > 0 and s.batch_wait_max_tokens_ratio > 0):
            return self
        clash = [k for k, on in (("cluster.pd", self.cluster.pd is not None),
                                 ("cluster.dp_attention: true", self.cluster.dp_attention),
                                 ("scheduler.mixed_batches: false", not s.mixed_batches)) if on]
        if clash:
            raise ValueError("scheduler.batch_wait_timeout_iters / batch_wait_max_tokens_ratio "
                             "(TensorRT-LLM's batch waiting) are modelled for colocated replicas "
                             "whose steps mix prompts and decodes, without attention DP (where "
                             "TensorRT-LLM skips it); drop them, or drop " + " and ".join(clash))
        return self

    @model_validator(mode="after")
    def _recv_interval(self):
        n = self.scheduler.recv_interval
        if n > 1 and (self.cluster.pd is not None or self.cluster.dp_attention):
            clash = "cluster.pd" if self.cluster.pd is not None else "cluster.dp_attention: true"
            raise ValueError(f"scheduler.recv_interval: {n} (SGLang's --scheduler-recv-interval) "
                             f"is modelled for colocated replicas without data-parallel attention "
                             f"(SGLang itself refuses it with DP attention); drop it, or drop {clash}")
        return self

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else Path(self.base_dir) / p

    def model_spec(self) -> Any:
        """The `ModelSpec` this scenario runs: a catalog name or config dict, or a config.json
        path relative to the scenario file, with `hf_overrides` laid over its config."""
        from simulator.cost.models import get_model

        m = self.model
        return get_model(str(self.resolve(m)) if isinstance(m, str) and m.endswith(".json") else m,
                         self.hf_overrides)

    def max_model_len(self, model: Any = None) -> int:
        """The longest prompt + output a request may have (tokens): `scheduler.max_model_len`,
        else the model's context. ValueError when the key is past the model's context, as
        vLLM refuses it. `model`: the `ModelSpec`, when the caller has it."""
        spec = model if model is not None else self.model_spec()
        mml = self.scheduler.max_model_len
        if mml is None:
            return int(spec.max_position_embeddings)
        if mml > spec.max_position_embeddings:
            raise ValueError(f"scheduler.max_model_len = {mml} exceeds {spec.name}'s context of "
                             f"{spec.max_position_embeddings} tokens (max_position_embeddings); "
                             "leave it out to use the model's context")
        return mml

    def quantization_mapping(self) -> dict[str, Any] | None:
        """The `quantization` key as the cost model takes it (None: not given)."""
        return self.quantization.to_dict() if self.quantization else None

    def memory_plan(self, model: Any, acc: Any, tp: int, pp: int, ep: int) -> Any:
        """The `MemoryPlan` of one replica of `model` on `acc` with this scenario's precision,
        scheduler budget and KV sizing rule (`cache`)."""
        from simulator.cost.memory_plan import plan_memory

        c = self.cache
        return plan_memory(model, acc, self.dtype, tp, pp, c.block_size, c.gpu_memory_utilization,
                           max_num_batched_tokens=self.scheduler.max_num_batched_tokens,
                           kv_cache_dtype=c.kv_cache_dtype, quantization=self.quantization_mapping(),
                           ep=ep, free_gpu_memory_fraction=c.free_gpu_memory_fraction,
                           mem_fraction_static=c.mem_fraction_static,
                           dp_attention=self.cluster.dp_attention and self.cluster.pd is None,
                           hybrid_kv_cache=c.disable_hybrid_kv_cache_manager is False)


# set by the loader, not by a scenario file: left out of key listings and hints
INTERNAL_FIELDS = ("base_dir", "source", "engine_notes")


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], value parsed as YAML)."""
    if "=" not in text:
        raise ValueError(f"--set expects KEY.PATH=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ValueError(f"--set has an empty key in {text!r}")
    path = key.strip().split(".")
    if not all(path):
        raise ValueError(f"--set key {key.strip()!r} has an empty part (in {text!r})")
    try:
        return path, yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise ValueError(f"--set {text!r}: the value is not valid YAML ({first}); quote a "
                         f"string in YAML, e.g. {key.strip()}='\"{raw.strip()}\"'") from None


def set_path(data: dict[str, Any], key: str | list[str], value: Any) -> None:
    """`data[a][b][c] = value` for key "a.b.c", creating (or replacing non-dict) parents."""
    parts = key.split(".") if isinstance(key, str) else key
    cur = data
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = cur[part] = {}
        cur = nxt
    cur[parts[-1]] = value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        set_path(data, *parse_override(text))
    return data


def scenario_from_dict(data: dict[str, Any], source: str = "<scenario>", base_dir: str = ".") -> Scenario:
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a scenario must be a YAML mapping, got {type(data).__name__}")
    notes: list[str] = []
    if data.get("engine") is not None:  # the engine's documented defaults, for keys left out
        data = copy.deepcopy(data)
        notes = apply_engine(data, source)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ValueError(format_validation_error(exc, f"{source}: invalid scenario", Scenario,
                                                 INTERNAL_FIELDS, top="scenario")) from None
    scenario.base_dir = base_dir
    scenario.source = source
    if scenario.engine is not None:  # limits sized from the workload (trtllm-bench) or KV (SGLang)
        notes += fill_limits(scenario) + fill_max_running(scenario)
    scenario.engine_notes = notes
    return scenario


def read_scenario_yaml(path: str | Path) -> dict[str, Any]:
    """A scenario file's raw mapping (not validated); errors name the file."""
    return read_yaml_mapping(path, "scenario")


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read, override and validate a scenario file; errors name the file and key path."""
    path = Path(path)
    data = read_scenario_yaml(path)
    data.setdefault("name", path.stem)  # an unnamed scenario is known by its file
    apply_overrides(data, overrides or [])
    return scenario_from_dict(data, str(path), str(path.resolve().parent))


def scenario_keys(model: type[BaseModel] = Scenario, prefix: str = "") -> list[str]:
    """Every settable key path (for sweeps and error hints)."""
    keys = []
    for name, field in model.model_fields.items():
        if name in INTERNAL_FIELDS:
            continue
        path = f"{prefix}{name}"
        keys.append(path)
        args = getattr(field.annotation, "__args__", None) or (field.annotation,)
        for a in args:
            if isinstance(a, type) and issubclass(a, BaseModel):
                keys.extend(scenario_keys(a, path + "."))
    return keys
