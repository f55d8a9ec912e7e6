"""Serving engines' documented defaults, for the scenario key `engine:`.

    engine: {name: tensorrt-llm}
    engine: {name: vllm, version: "0.11.0", entry_point: server}

A scenario that names the engine it stands for gets that engine's documented behaviour for
every key it leaves out: the admission policy (`scheduler.capacity_policy`), the TP
all-reduce (`cluster.allreduce`), vLLM's and SGLang's old fused-MoE fallback config
(`cluster.fused_moe_config`, simulator/engines/fused_moe_fallback.py), the KV-cache dtype of FP8 checkpoints
(`cache.kv_cache_dtype`), the scheduler's limits by version, GPU and entry point
(`scheduler.max_num_seqs`, `max_num_batched_tokens`, `enable_chunked_prefill`), whether
prompts share steps with decodes (`scheduler.mixed_batches`), which of SGLang's prefill steps
run outside CUDA graphs (`cluster.prefill_graph_max_tokens`) and vLLM's per-request
chat-template work (`api_server.preprocess_s`, simulator/engines/chat_template.py). A key the
scenario sets always wins. `apply_engine` fills the raw mapping before validation and returns
one line per rule it used, with where the engine documents it. The published-results suite
(bench/published_rows.py) writes its scenarios this way.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from simulator.cost.memory_plan import MEMORY_RULES
from simulator.defaults import DEFAULT_HARDWARE
from simulator.engines.chat_template import chat_template_rule
from simulator.engines.fused_moe_fallback import fused_moe_fallback_rule
from simulator.engines.hybrid_kv_cache import hybrid_kv_cache_rule, mamba_block_size_rule
from simulator.engines.scenario_model import raw_model
from simulator.engines.sglang_prefill_graphs import (
    arch_without_graphs,
    expert_precision,
    sm100_trtllm_moe,
)
from simulator.engines.version import parse_version
from simulator.engines.vllm_block_size import mla_block_size_rule
from simulator.engines.vllm_host import VLLM_V1_RELEASE, host_request_rule

ENGINES = ("vllm", "sglang", "tensorrt-llm", "lmdeploy-turbomind")
ENTRY_POINTS = ("server", "offline")  # OpenAI-compatible server, or the offline LLM class

# The engines' documented admission policies (what runs when KV blocks run out):
# - TensorRT-LLM: CapacitySchedulerPolicy default GUARANTEED_NO_EVICT (a request is admitted
#   only when its whole length fits; running requests are never evicted).
# - vLLM: allocate blocks as tokens arrive and preempt (recompute) when they run out.
# - SGLang: admit a request only when its prompt and output budget fit beside a decaying share
#   (new_token_ratio, 0.7 -> 0.098) of the running requests' remaining outputs; retract when
#   blocks run out anyway (schedule_policy.py PrefillAdder, scheduler.py update_running_batch,
#   v0.5.6; simulator/core/capacity.py).
# - LMDeploy TurboMind: SequenceManager::Materialize preempts "victims" when blocks run out
#   (src/turbomind/models/llama/SequenceManager.cc, v0.1.0).
CAPACITY_POLICY = {
    "tensorrt-llm": "guaranteed_no_evict",
    "vllm": "max_utilization",
    "sglang": "reserve_ratio",
    "lmdeploy-turbomind": "max_utilization",
}

# The TP all-reduce an engine calls (cluster.allreduce; per-call costs in
# simulator/cost/collectives.py), by engine and version:
# - vLLM: NCCL until its custom all-reduce kernels (PR #2192, merged 2023-12, first released
#   in v0.2.7); custom from then on for single-node TP (NCCL stays the fallback across nodes).
# - TensorRT-LLM (and NIM's TRT-LLM profiles): its own AllReduce plugin (custom kernels).
# - SGLang: its custom all-reduce kernels (sgl-kernel).
# - LMDeploy TurboMind v0.1: NCCL (src/turbomind/utils/nccl_utils.cc, ncclAllReduce per call;
#   custom all-reduce came to TurboMind in v0.4+).
VLLM_CUSTOM_ALLREDUCE_FROM = (0, 2, 7)
ALLREDUCE_BY_ENGINE = {"tensorrt-llm": "custom", "lmdeploy-turbomind": "nccl", "sglang": "custom"}

# KV-cache dtype an engine uses when a scenario does not set it:
# - TensorRT-LLM (and NIM's TRT-LLM profiles) run NVIDIA ModelOpt FP8 checkpoints, whose
#   hf_quant_config.json carries "kv_cache_quant_algo": "FP8"; the engine takes the checkpoint's
#   KV quantization (TensorRT-LLM docs, "Quantization": pre-quantized ModelOpt checkpoints run
#   as exported). So FP8 weights on TensorRT-LLM mean an FP8 KV cache. NVFP4 too: ModelOpt's
#   NVFP4 exports carry the same FP8 KV quantization, and trtllm-bench forces it for both
#   ("If the quantization is NVFP4 or FP8, force the KV cache dtype to FP8": bench/build/
#   build.py; bench/benchmark/utils/general.py maps FP8 and NVFP4 to an "fp8" KV cache).
# - vLLM: kv_cache_dtype "auto" = the model's 16-bit dtype (kvpd's own default, nothing to add).
FP8_KV_ENGINES = {"tensorrt-llm"}

# How much memory the KV cache gets: vLLM (gpu_memory_utilization 0.9) and SGLang
# (mem_fraction_static) take a fraction of all memory for weights, activations and KV (kvpd's
# default). TensorRT-LLM gives the KV cache a fraction of the memory free after the weights and
# activations (KvCacheConfig.free_gpu_memory_fraction, default 0.9), which a scenario can say
# (cache.free_gpu_memory_fraction). The preset does not set it: with kvpd's activation estimate
# (vLLM's, not TensorRT-LLM's runtime buffers) it gives NIM's Llama-3.3-70B FP8 TP2 KV room
# for 94 requests of 5,500 tokens (the vLLM-style plan: 85), and the concurrency-100 TTFT comes
# out 3.5 s where NIM measured 8.0 s (the vLLM-style plan: 8.4 s) (docs/gpu-runs.md, session 45).

# vLLM's scheduler defaults (engine code, by version, GPU and entry point):
# - V1 engine (default from v0.8.0): vllm/engine/arg_utils.py `_set_default_args_v1` (later
#   Platform.get_batch_defaults; tests/engine/test_arg_utils.py test_defaults_with_usage_context):
#   GPUs with >= 70 GiB that are not A100: max_num_seqs 1024, max_num_batched_tokens 16384 for
#   the LLM class (offline benchmark_throughput.py) and 8192 for the OpenAI server; other GPUs:
#   256 and 8192 / 2048. Chunked prefill always on.
# - V0 engine (before v0.8.0): max_num_seqs 256; chunked prefill switched on by itself only for
#   max_model_len > 32K; without it a step holds whole prompts, max_num_batched_tokens =
#   max(max_model_len, 2048) (vllm/config.py SchedulerConfig, v0.7), and prompts run in steps
#   of their own: V0's Scheduler._schedule_default schedules prefills first and, when any are
#   scheduled, no decodes in that step (scheduler.mixed_batches false). The long-context
#   switch (vllm/engine/arg_utils.py create_engine_config, v0.6.3-0.7.3) skips models with a
#   sliding window and, from v0.6.5, ROCm; the chunked budget is 512 tokens before v0.6.5 and
#   2048 from it (SchedulerConfig.__post_init__, single-step). v0.7.1-v0.7.3 force chunked
#   prefill off for an MLA model (DeepSeek-V2/V3) whatever its context (VllmConfig.__post_init__
#   "MLA is enabled; forcing chunked prefill and prefix caching to be disabled", vLLM PR #12642,
#   read in the v0.7.1 and v0.7.3 wheels; v0.8.0 keeps it for non-GPU platforms only, after PR
#   #12639 gave MLA chunked prefill): VLLM_V0_MLA_WHOLE_PROMPTS. The 0.7.4 nightlies are read
#   as v0.8.0 (the few cut before PR #12639 are not told apart).
VLLM_V1_FROM = (VLLM_V1_RELEASE.major, VLLM_V1_RELEASE.minor)  # (0, 8): V1 the default engine
VLLM_V1_BIG_GPU_GIB = 70
VLLM_V1_DEFAULTS = {  # (big GPU, offline LLM class) -> (max_num_seqs, max_num_batched_tokens)
    (True, True): (1024, 16384), (True, False): (1024, 8192),
    (False, True): (256, 8192), (False, False): (256, 2048),
}
VLLM_V0_MAX_NUM_SEQS = 256
VLLM_V0_MLA_WHOLE_PROMPTS = ((0, 7, 1), (0, 7, 4))  # [from, before): MLA without chunked prefill
VLLM_V0_LONG_CONTEXT = 32 * 1024
VLLM_V0_CHUNK_2048_FROM = (0, 6, 5)  # the chunked budget: 512 before, 2048 from (and no ROCm)

# vLLM's attention kernel on NVIDIA GPUs that run FlashAttention-2 (compute capability 8.x:
# Ampere, Ada; and 12.0, the RTX PRO 6000 Blackwell, which lacks Hopper's wgmma and the B200's
# tcgen05 that FlashAttention-3 and the SM100 kernels need): its V1 engine picks FlashAttention,
# except for a model with attention sinks (gpt-oss), which FlashAttention-2 cannot run there:
# the Triton unified attention (TRITON_ATTN; on 12.0 assumed as on 8.x). So since
# gpt-oss's release (v0.10.1: vllm/platforms/cuda.py "has_sink and not is_device_capability(90)"
# -> TRITON_ATTN_VLLM_V1; v0.12 and v0.13 by backend priority, FLASH_ATTN and FLASHINFER
# refusing sinks before SM100). v0.11 sent an FP8 KV cache there too ("has_sink or
# use_fp8_kv_cache"); v0.12 on runs it on FlashInfer. cluster.attention_backend triton_attn:
# its prefill re-reads K/V per query block (simulator/cost/kernels.py triton_block_q).
# Every other (non-MLA) model there runs FLASH_ATTN on FlashAttention-2 (fa_utils.py: FA3 only
# on SM 9.0), and the V1 engine (v0.8 on) makes one flash_attn_varlen_func call per step for
# prompts and decodes together (v1/attention/backends/flash_attn.py forward, read at v0.11.0
# and v0.20.1; vLLM PR #58013 "FA2: split mixed prefill/decode batches into two calls", opened
# 2026-09, would change it).
# FlashAttention-2 packs a GQA group's query heads onto one K/V read only when the whole call
# is decode (vllm-project/flash-attention csrc/flash_attn/flash_api.cpp:
# seqlenq_ngroups_swapped requires max_seqlen_q == 1), so in a step with prompt tokens each
# decode reads its K/V once per query head: cluster.attention_backend flash_attn_2. V0 (before
# v0.8) ran decodes in a call of their own (flash_attn_with_kvcache), and an FP8 KV cache runs
# on FlashInfer (FA2 has none; v0.12 on picks it, v0.11 aside), which packs them: flash_attn.
VLLM_SINKS_TRITON_FROM = (0, 10, 1)
VLLM_FP8_KV_TRITON = (0, 11)  # the minor release that also sent an FP8 KV cache there
VLLM_FA2_ARCHES = ("ampere", "ada", "blackwell_rtx")

# SGLang runs a prefill batch whenever one can be formed (Scheduler.get_next_batch_to_run:
# get_new_batch_prefill first), the running decode batch only when none can, and mixes them
# only with --enable-mixed-chunk (server_args.py: enable_mixed_chunk False):
# scheduler.mixed_batches false.

# TensorRT-LLM's scheduler defaults (LLM API reference, TorchLlmArgs / TrtLlmArgs:
# enable_chunked_prefill "Defaults to False", max_num_tokens 8192; docs "Tuning Max Batch Size
# and Max Num Tokens": a context request is scheduled only when its whole prompt fits the step's
# max_num_tokens). The OpenAI server (trtllm-serve) passes BuildConfig's max_batch_size 2048 and
# max_num_tokens 8192 (tensorrt_llm/commands/serve.py get_llm_args; builder.py BuildConfig);
# trtllm-bench sizes its own (simulator/engines/trtllm_bench.py).
TRTLLM_MAX_NUM_TOKENS = 8192
TRTLLM_MAX_BATCH_SIZE = 2048
# Prefix caching by default: vLLM's V1 engine (v0.8.0 on) caches prefixes unless told not to;
# its V0 engine only with --enable-prefix-caching (EngineArgs.enable_prefix_caching False).
# SGLang's radix cache is on unless --disable-radix-cache. LMDeploy TurboMind has none in v0.1
# and leaves it off by default later (--enable-prefix-caching, v0.4 on). TensorRT-LLM's block
# reuse default changed across versions and builds: kvpd's default stays.
PREFIX_CACHING_OFF = {"lmdeploy-turbomind"}

# a scenario key that already sizes the KV pool (an engine's own rule is then not applied)
CACHE_MEMORY_KEYS = (*MEMORY_RULES, "num_gpu_blocks")

# LMDeploy TurboMind before v0.1.0a2 ran a new request's prompt but its last token in a
# context pass and that last token in the following decode pass, which samples the first
# token (src/turbomind/models/llama/LlamaBatch.cc at v0.0.14 `contextDecode`: input_length
# - 1; at v0.1.0a1 `ContextDecode`: "skip last input token (will process with decoder
# later)"); "Unify prefill & decode passes" (#775) ended it before v0.1.0a2:
# scheduler.first_token_from_decode.
TURBOMIND_UNIFIED_PASS_FROM = "0.1.0a2"


def version3(text: Any) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a version text (`parse_version`: the lowest listed); None when
    it has none."""
    v = parse_version(text)
    return None if v is None else (v.major, v.minor, v.micro)


def apply_engine(data: dict[str, Any], where: str = "scenario") -> list[str]:
    """Fill the raw scenario mapping `data` (in place) with the documented defaults of the
    engine its `engine` key names, for every key it leaves out; returns the rules used. A
    mapping without `engine` is left alone. ValueError names a bad `engine` key."""
    spec = data.get("engine")
    if spec is None:
        return []
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: engine must be a mapping such as {{name: vllm, version: "
                         f"'0.11.0'}}, got {spec!r}")
    name = spec.get("name")
    if name is None:
        raise ValueError(f"{where}: engine.name is missing; kvpd knows: {', '.join(ENGINES)}")
    if name not in ENGINES:
        raise ValueError(f"{where}: engine.name {name!r} unknown; kvpd knows: {', '.join(ENGINES)}")
    entry = spec.get("entry_point", "server")
    if entry not in ENTRY_POINTS:
        raise ValueError(f"{where}: engine.entry_point {entry!r} unknown; allowed: "
                         f"{', '.join(ENTRY_POINTS)}")
    version = spec.get("version")
    if version is not None and parse_version(version) is None:
        raise ValueError(f"{where}: engine.version {version!r} names no version; write "
                         f"major.minor.patch in quotes, e.g. '0.11.0'")
    label = f"{name} {version}" if version else name
    notes: list[str] = []
    scheduler = _section(data, "scheduler", where)
    cluster = _section(data, "cluster", where)
    cache = _section(data, "cache", where)
    if "capacity_policy" not in scheduler:
        scheduler["capacity_policy"] = CAPACITY_POLICY[name]
        notes.append(f"capacity_policy {CAPACITY_POLICY[name]}: the documented policy of {name}")
    if name in FP8_KV_ENGINES and "kv_cache_dtype" not in cache:
        weights = _modelopt_weights(data)
        if weights:
            cache["kv_cache_dtype"] = "fp8"
            notes.append(f"kv_cache_dtype fp8: TensorRT-LLM runs ModelOpt {weights} checkpoints "
                         "with their FP8 KV cache (kv_cache_quant_algo FP8)")
    if "pd" not in cluster:  # (the limits are per engine; a PD scenario's pools share them)
        if name == "vllm":
            notes += _vllm_limits(data, scheduler, version, entry == "offline")
        elif name == "tensorrt-llm":
            notes += _trtllm_limits(scheduler, entry == "offline")
        elif name == "sglang":
            if "mixed_batches" not in scheduler:
                scheduler["mixed_batches"] = False
                notes.append("mixed_batches false: SGLang runs prefill batches of their own "
                             "first, decodes waiting (--enable-mixed-chunk off by default)")
            notes += _sglang_defaults(data, scheduler, cache, cluster, version)
    if name == "sglang":
        notes += _sglang_prefill_graphs(data, scheduler, cluster, version)
    if "enable_prefix_caching" not in cache:
        notes += _prefix_caching(cache, name, version)
    if name == "vllm":
        notes += _vllm_v0_blocks(scheduler, version)
    if name == "lmdeploy-turbomind" and "first_token_from_decode" not in scheduler:
        notes += _turbomind_first_token(scheduler, version)
    notes += _allreduce(cluster, name, version, label)
    if name == "vllm" and "attention_backend" not in cluster:
        notes += _vllm_attention(data, cluster, cache, version)
    if name == "vllm":
        notes += host_request_rule(cluster, version)
        notes += hybrid_kv_cache_rule(data, cluster, cache, scheduler, version)
        notes += mamba_block_size_rule(data, cluster, cache, version)
        notes += mla_block_size_rule(data, cache, version)
    if name in ("vllm", "sglang"):
        notes += fused_moe_fallback_rule(name, data, cluster, version)
    if name == "vllm" and entry == "server":
        notes += chat_template_rule(data, version)
        if "pd" in cluster:
            notes += _vllm_pd_route(data)
    return notes


def _vllm_pd_route(data: dict[str, Any]) -> list[str]:
    """api_server.pd_route prefill_then_decode for a vLLM PD scenario whose API servers take
    time: vLLM's disaggregated proxies (tests/v1/kv_connector/nixl_integration/
    toy_proxy_server.py, examples/online_serving/disaggregated_serving) send each request to
    a prefill instance's OpenAI server with max_tokens 1, await its answer, then send it to a
    decode instance's OpenAI server, which handles it again before its engine pulls the KV."""
    front = data.get("api_server")
    if not isinstance(front, dict) or "pd_route" in front or not front.get("preprocess_s"):
        return []
    front["pd_route"] = "prefill_then_decode"
    return ["api_server.pd_route prefill_then_decode: vLLM's disaggregated proxy sends each "
            "request to a decode instance's API server once its prefill answered, so the "
            "decode side handles it too"]


def _prefix_caching(cache: dict[str, Any], name: str, version: Any) -> list[str]:
    """cache.enable_prefix_caching false for the engines and versions that leave it off."""
    v = version3(version) if name == "vllm" else None
    if name in PREFIX_CACHING_OFF:
        why = "LMDeploy TurboMind leaves prefix caching off by default"
    elif v is not None and v[:2] < VLLM_V1_FROM:
        why = f"vLLM {version} (V0 engine) caches prefixes only with --enable-prefix-caching"
    else:
        return []
    cache["enable_prefix_caching"] = False
    return [f"enable_prefix_caching false: {why}"]


VLLM_V0_WATERMARK = 0.01  # BlockSpaceManager's watermark (vllm/core/block_manager.py, v0.7.3)


def _vllm_v0_blocks(sched: dict[str, Any], version: Any) -> list[str]:
    """vLLM V0's block manager for the keys not set: a waiting request is admitted only when
    the blocks of all its tokens fit with 1% of the pool left free, and takes them at once
    (v0.7.3 Scheduler._schedule_prefills: BlockSpaceManager.can_allocate with watermark 0.01,
    then allocate for the whole sequence, chunked prefill or not); a running request is
    scheduled only while a block is free (can_append_slots counts the block it writes into).
    Driven by `bench/diagnostics/vllm_scheduler.py` against the 0.7.3 wheel, V0's schedule is
    kvpd's at every step."""
    v3 = version3(version)
    if v3 is None or v3[:2] >= VLLM_V1_FROM:
        return []
    out = {k: v for k, v in (("prompt_allocation", "whole_prompt"),
                             ("admission_watermark", VLLM_V0_WATERMARK),
                             ("append_needs_free_block", True)) if k not in sched}
    if not out:
        return []
    sched.update(out)
    return [f"{', '.join(f'{k} {v}' for k, v in out.items())}: vLLM {version} (V0 engine) "
            "admits a request when the blocks of its whole sequence fit with 1% of the pool "
            "left free, allocates them at once, and appends to a running request only while a "
            "block is free"]


def _turbomind_first_token(sched: dict[str, Any], version: Any) -> list[str]:
    """scheduler.first_token_from_decode for TurboMind versions before its unified pass."""
    v = parse_version(version)
    if v is None:
        return [f"LMDeploy version {version!r} not read: the first token from the prefill "
                "step (TurboMind v0.1.0a2 on)"] if version else []
    if v >= parse_version(TURBOMIND_UNIFIED_PASS_FROM):
        return []
    sched["first_token_from_decode"] = True
    return [f"first_token_from_decode: TurboMind {version} runs the prompt's last token in the "
            "next decode pass, which samples the first token (unified from v0.1.0a2)"]


def _modelopt_weights(data: dict[str, Any]) -> str | None:
    """"FP8" or "NVFP4" when the raw scenario's weights are one of ModelOpt's FP8 / NVFP4
    exports (FP4 weights are NVFP4 unless a method or the model's own checkpoint says
    otherwise); None for any other precision, or when the model cannot be read here."""
    dtype = data.get("dtype")
    if dtype == "fp8":
        return "FP8"
    if dtype != "fp4":
        return None
    q = data.get("quantization")
    method = q.get("method") if isinstance(q, dict) else q
    if method:
        return "NVFP4" if method == "nvfp4" else None

    try:  # a release in MXFP4 (gpt-oss) is not a ModelOpt export
        released = raw_model(data).checkpoint_quant_method
    except (ValueError, OSError):
        return None
    return "NVFP4" if released in ("", "nvfp4") else None


# SGLang's CUDA graphs for prefill (extend) batches, read in the released wheels: piecewise
# CUDA graphs were opt-in through v0.5.9 (--enable-piecewise-cuda-graph; ServerArgs
# enable_piecewise_cuda_graph False) and are on by default from v0.5.10
# (disable_piecewise_cuda_graph False). When on, a batch of up to piecewise_cuda_graph_max_tokens
# tokens replays a graph: 2048 for MLA models ("to avoid the performance regression"), the
# chunked prefill size otherwise (ServerArgs, v0.5.10 to v0.5.12). SGLang turns them off with
# DP attention, PP > 1, non-CUDA hardware (ROCm), an MoE all-to-all backend and PD
# disaggregation (_handle_piecewise_cuda_graph; also LoRA, speculative decoding and others kvpd
# does not model), and for some models and MoE runners (simulator/engines/sglang_prefill_graphs.py).
# Steps outside the graphs pay their layers' dispatch (simulator/cost/eager_dispatch.py):
# cluster.prefill_graph_max_tokens.
SGLANG_PCG_DEFAULT_FROM = Version("0.5.10")
SGLANG_PCG_MLA_MAX_TOKENS = 2048

# SGLang's ServerArgs divides chunked_prefill_size by dp under DP attention from this version
# (v0.4.4 and before: halves it; read in the released wheels)
SGLANG_DP_DIVIDES_FROM = Version("0.4.5")


def _sglang_defaults(data: dict[str, Any], sched: dict[str, Any], cache: dict[str, Any],
                     cluster: dict[str, Any], version: Any) -> list[str]:
    """SGLang's chunked_prefill_size and mem_fraction_static by version and GPU memory
    (`simulator.engines.sglang_server`) for the keys left out; its max_running_requests needs the KV
    pool and is filled once the scenario is read (`sglang_server.fill_max_running`)."""
    import simulator.engines.sglang_server as sglang_server
    from simulator.cost.hardware import scenario_accelerator

    v = parse_version(version)
    if v is None or v < sglang_server.FIRST_MODELLED:
        return [f"SGLang {'version not given' if v is None else f'{v} predates 0.4.0'}: kvpd's "
                "token budget, KV sizing and request limit, not SGLang's"]
    gpu_mem = scenario_accelerator(data.get("hardware", DEFAULT_HARDWARE)).memory_bytes / 2**20
    tp, pp = int(cluster.get("tp", 1)), int(cluster.get("pp", 1))
    notes = []
    if "max_num_batched_tokens" not in sched:
        size = sglang_server.chunked_prefill_size(v, gpu_mem)
        sched["max_num_batched_tokens"] = size
        why = f"SGLang {v}'s chunked_prefill_size on a {gpu_mem / 1024:.0f} GiB GPU"
        if cluster.get("dp_attention") is True and tp > 1:
            # ServerArgs with DP attention: up to v0.4.4 --enable-dp-attention sets dp = tp and
            # halves chunked_prefill_size; from v0.4.5 (which needs --dp) it divides it by dp
            div = 2 if v < SGLANG_DP_DIVIDES_FROM else tp
            sched["max_num_batched_tokens"] = max(1, size // div)
            why += (f" ({size}), halved for data-parallel attention" if div == 2 else
                    f" ({size}), divided by its {tp} data-parallel attention ranks")
        notes.append(f"max_num_batched_tokens {sched['max_num_batched_tokens']}: {why}")
    if cluster.get("dp_attention") is True and tp > 1 and "schedule_conservativeness" not in sched:
        # ServerArgs with DP attention (v0.4.3 to v0.5.7 alike): schedule_conservativeness x 0.3
        sched["schedule_conservativeness"] = 0.3
        notes.append("schedule_conservativeness 0.3: SGLang scales its conservativeness (1.0) "
                      "by 0.3 under data-parallel attention")
    if not any(k in cache for k in CACHE_MEMORY_KEYS):
        f = sglang_server.mem_fraction_static(v, gpu_mem, tp, pp)
        cache["mem_fraction_static"] = f
        notes.append(f"mem_fraction_static {f:.3f}: SGLang {v}'s share of memory for weights and "
                     f"KV on a {gpu_mem / 1024:.0f} GiB GPU at TP {tp} x PP {pp}")
    return notes


def _sglang_prefill_graphs(data: dict[str, Any], sched: dict[str, Any],
                           cluster: dict[str, Any], version: Any) -> list[str]:
    """cluster.prefill_graph_max_tokens for SGLang by version (SGLANG_PCG_DEFAULT_FROM) and
    what turns its piecewise graphs off, when the scenario leaves it out."""
    from simulator.cost.eager_dispatch import SGLANG_EAGER_LAYER_S
    from simulator.cost.hardware import scenario_accelerator

    if "prefill_graph_max_tokens" in cluster:
        return []
    v = parse_version(version)
    if v is None:
        return ["SGLang version not given: every step priced under CUDA graphs (before v0.5.10 "
                "SGLang ran prefill batches eagerly; set cluster.prefill_graph_max_tokens)"]
    layer_s = cluster.get("eager_layer_s", SGLANG_EAGER_LAYER_S)  # (checked by the loader)
    per_layer = (f"{layer_s * 1e3:.3f} ms" if isinstance(layer_s, (int, float))
                 else f"{layer_s!r} s")
    cost = (f"each adds its layers' dispatch, {per_layer} per layer "
            "(simulator/cost/eager_dispatch.py)")
    if v < SGLANG_PCG_DEFAULT_FROM:
        cluster["prefill_graph_max_tokens"] = 0
        return [f"prefill_graph_max_tokens 0: SGLang {v} runs prefill batches eagerly (piecewise "
                f"CUDA graphs opt-in before {SGLANG_PCG_DEFAULT_FROM}); {cost}"]
    try:
        acc = scenario_accelerator(data.get("hardware", DEFAULT_HARDWARE))
        model = raw_model(data)
    except (ValueError, OSError):  # the scenario check names what it cannot read
        return []
    vendor, mla, a2a = acc.vendor, model.is_mla, cluster.get("moe_a2a_backend") == "all_to_all"
    experts = expert_precision(data, _modelopt_weights(data))
    off = [why for why, on in (
        ("data-parallel attention", cluster.get("dp_attention") is True),
        ("pipeline parallelism", int(cluster.get("pp", 1)) > 1),
        ("non-CUDA hardware", vendor not in ("nvidia", "")),
        ("an MoE all-to-all backend", a2a),
        ("PD disaggregation", "pd" in cluster),
        (f"{model.architecture} (its list of models without them)",
         arch_without_graphs(model.architecture, v)),
        (f"its MoE runner flashinfer_trtllm, its default for {model.architecture}'s "
         f"{experts} experts on an SM100 GPU (simulator/engines/sglang_prefill_graphs.py)",
         not a2a and sm100_trtllm_moe(model.architecture, experts, acc.arch, v))) if on]
    if off:
        cluster["prefill_graph_max_tokens"] = 0
        return [f"prefill_graph_max_tokens 0: SGLang {v} turns its piecewise CUDA graphs off "
                f"with {off[0]}, so prefill batches run eagerly; {cost}"]
    limit = SGLANG_PCG_MLA_MAX_TOKENS if mla else sched.get("max_num_batched_tokens")
    if limit is None:
        return []
    cluster["prefill_graph_max_tokens"] = int(limit)
    why = "an MLA model's limit" if mla else "its chunked prefill size"
    return [f"prefill_graph_max_tokens {limit}: SGLang {v} replays piecewise CUDA graphs for "
            f"prefill batches of up to {limit} tokens ({why}); larger ones run eagerly, {cost}"]


def _section(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    sec = data.setdefault(key, {})
    if not isinstance(sec, dict):
        raise ValueError(f"{where}: {key} must be a mapping, got {sec!r}")
    return sec


def _allreduce(cluster: dict[str, Any], name: str, version: Any, label: str) -> list[str]:
    """cluster.allreduce by the engine's documented all-reduce, where some TP > 1."""
    pools = [p for p in (cluster.get("pd") or {}).values() if isinstance(p, dict)]
    if max([int(cluster.get("tp", 1))] + [int(p.get("tp", 1)) for p in pools]) <= 1:
        return []
    if "allreduce" in cluster:  # the scenario's own
        return []
    notes = []
    if name == "vllm":
        v = version3(version)
        if v is None:
            notes.append("vLLM version not given: its custom all-reduce assumed")
            impl = "custom"
        else:
            impl = "custom" if v >= VLLM_CUSTOM_ALLREDUCE_FROM else "nccl"
    else:
        impl = ALLREDUCE_BY_ENGINE[name]
    if impl != "custom":
        cluster["allreduce"] = impl
    return notes + [f"cluster.allreduce {impl}: the TP all-reduce of {label}"]


def _vllm_limits(data: dict[str, Any], sched: dict[str, Any], version: Any,
                 offline: bool) -> list[str]:
    """vLLM's scheduler defaults (VLLM_V1_DEFAULTS, V0 above) for the limits not set."""
    from simulator.cost.hardware import scenario_accelerator

    if "max_num_seqs" in sched and "max_num_batched_tokens" in sched:
        return []
    v3 = version3(version)
    if v3 is None:
        return ["vLLM version not given: kvpd's scheduler defaults"]
    out: dict[str, Any] = {}
    notes = []
    if v3[:2] >= VLLM_V1_FROM:
        acc = scenario_accelerator(data.get("hardware", DEFAULT_HARDWARE))
        big = acc.memory_bytes >= VLLM_V1_BIG_GPU_GIB * 2**30 and "a100" not in acc.name
        seqs, tokens = VLLM_V1_DEFAULTS[(big, offline)]
        what = (f"vLLM V1 defaults ({'>= 70 GiB, not A100' if big else 'smaller GPU or A100'}, "
                f"{'LLM class' if offline else 'OpenAI server'})")
    else:
        seqs = VLLM_V0_MAX_NUM_SEQS
        model = raw_model(data)
        max_len = int(sched.get("max_model_len") or model.max_position_embeddings)
        arch = scenario_accelerator(data.get("hardware", DEFAULT_HARDWARE)).arch or ""
        rocm = arch.startswith("cdna") and v3 >= VLLM_V0_CHUNK_2048_FROM
        lo, hi = VLLM_V0_MLA_WHOLE_PROMPTS
        mla_whole = model.is_mla and lo <= v3 < hi
        long_context = max_len > VLLM_V0_LONG_CONTEXT and not model.sliding_window and not rocm
        long_chunked = long_context and not mla_whole
        if long_context and mla_whole and "enable_chunked_prefill" not in sched:
            notes.append(f"vLLM {version} forces chunked prefill off for an MLA model "
                         "(vLLM PR #12642; chunked MLA from v0.8.0)")
        chunked = sched.get("enable_chunked_prefill", long_chunked)
        if chunked:
            tokens = 2048 if v3 >= VLLM_V0_CHUNK_2048_FROM else 512
            if long_chunked and "enable_chunked_prefill" not in sched:
                notes.append("vLLM V0 with long context: chunked prefill on by itself")
        else:
            if "enable_chunked_prefill" not in sched:
                out["enable_chunked_prefill"] = False
            if "mixed_batches" not in sched:  # V0 schedules prefills first, on their own
                out["mixed_batches"] = False
            tokens = max(max_len, 2048)
        what = f"vLLM V0 defaults (max_model_len {max_len})"
    if "max_num_seqs" not in sched:
        out["max_num_seqs"] = seqs
    if tokens and "max_num_batched_tokens" not in sched:
        out["max_num_batched_tokens"] = tokens
    sched.update(out)
    return notes + [f"scheduler limits: {what}: max_num_seqs {sched.get('max_num_seqs')}, "
                    f"max_num_batched_tokens {sched.get('max_num_batched_tokens', 'kvpd default')}"
                    + (", no chunked prefill" if sched.get("enable_chunked_prefill") is False
                       else "")
                    + (", prefill steps of their own" if sched.get("mixed_batches") is False
                       else "")]


def _vllm_attention(data: dict[str, Any], cluster: dict[str, Any], cache: dict[str, Any],
                    version: Any) -> list[str]:
    """`attention_backend` where vLLM runs a kernel other than FlashAttention-class ones
    (`vllm_attention_backend`): in `cluster`, or in each PD pool by the pool's own part."""
    from simulator.cost.hardware import scenario_accelerator
    from simulator.cost.kernels import kernel_profile

    try:
        model = raw_model(data)
    except (ValueError, OSError):  # the scenario check names a model it cannot read
        return []
    v3 = version3(version)
    label = f"vLLM {version or '(version not given)'}"
    fp8_kv = str(cache.get("kv_cache_dtype", "")).startswith("fp8")
    pools = cluster.get("pd")
    targets = ([(f"cluster.pd.{role}", pools.setdefault(role, {})) for role in
                ("prefill", "decode")] if isinstance(pools, dict) else [("cluster", cluster)])
    notes = []
    for key, target in targets:
        if not isinstance(target, dict) or "attention_backend" in target:
            continue
        # a PD pool's own part, else the scenario's (`cluster` names none)
        acc = scenario_accelerator(target.get("hardware") or data.get("hardware",
                                                                       DEFAULT_HARDWARE))
        arch = getattr(kernel_profile(acc), "arch", "")
        picked = vllm_attention_backend(model, arch, v3, fp8_kv)
        if picked is None:
            continue
        backend, why = picked
        target["attention_backend"] = backend
        notes.append(f"{key}.attention_backend {backend}: {label} {why} on "
                     f"{acc.name} ({arch})")
    return notes


def vllm_attention_backend(model: Any, arch: str, v3: tuple[int, int, int] | None,
                           fp8_kv: bool) -> tuple[str, str] | None:
    """(backend, why) of the kernel vLLM `v3` (None: current) runs for `model` on a part of
    kernel family `arch` where it is not a FlashAttention-class one (the rules above); None
    elsewhere: other parts, MLA models, FP8 KV caches on FlashInfer, V0."""
    if arch not in VLLM_FA2_ARCHES or model.is_mla:
        return None
    if model.attention_sinks and (v3 is None or v3 >= VLLM_SINKS_TRITON_FROM):
        return "triton_attn", ("runs its Triton unified attention for attention sinks, which "
                               "FlashAttention-2 cannot run")
    if fp8_kv:  # v0.11: Triton; otherwise FlashInfer (FA2 has no FP8 KV), GQA-packed
        if v3 is not None and v3[:2] == VLLM_FP8_KV_TRITON:
            return "triton_attn", "runs its Triton unified attention for an FP8 KV cache (v0.11)"
        return None
    if v3 is None or v3[:2] >= VLLM_V1_FROM:
        return "flash_attn_2", ("(V1) runs each step as one FlashAttention-2 varlen call; beside "
                                "prompt tokens its decodes are not GQA-packed")
    return None


def _trtllm_limits(sched: dict[str, Any], offline: bool) -> list[str]:
    """TensorRT-LLM's scheduler defaults (TRTLLM_* above) for the limits not set: whole
    prompts per step (no chunked prefill) within 8192 tokens. Offline (`trtllm-bench
    throughput`) the tool sizes the limits from the dataset instead: filled once the workload
    is known (`simulator.engines.trtllm_bench.fill_limits`)."""
    if "enable_chunked_prefill" not in sched:
        sched["enable_chunked_prefill"] = False
    chunked = f"chunked prefill {'off' if sched.get('enable_chunked_prefill') is False else 'on'}"
    if offline:
        return [f"scheduler: trtllm-bench throughput, {chunked}"]
    if "max_num_batched_tokens" not in sched:
        sched["max_num_batched_tokens"] = TRTLLM_MAX_NUM_TOKENS
    if "max_num_seqs" not in sched:
        sched["max_num_seqs"] = TRTLLM_MAX_BATCH_SIZE
    return ["scheduler limits: TensorRT-LLM server defaults, max_batch_size "
            f"{sched['max_num_seqs']}, max_num_tokens {sched['max_num_batched_tokens']}, {chunked}"]
