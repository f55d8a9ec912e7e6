"""The serving engines' documented defaults the published-suite converter applies where a
source states no setting (`published_rows.to_scenario`): admission policy, TP all-reduce,
KV-cache dtype and scheduler limits by engine and version, each with where it is documented.
"""

from __future__ import annotations

import re
from typing import Any

# The engines' documented admission policies (what runs when KV blocks run out):
# - TensorRT-LLM: CapacitySchedulerPolicy default GUARANTEED_NO_EVICT (a request is admitted
#   only when its whole length fits; running requests are never evicted).
# - vLLM: allocates blocks as tokens arrive and preempts (recompute) when they run out.
# - LMDeploy TurboMind: SequenceManager::Materialize preempts "victims" when blocks run out
#   (src/turbomind/models/llama/SequenceManager.cc, v0.1.0).
CAPACITY_POLICY = {
    "tensorrt-llm": "guaranteed_no_evict",
    "vllm": "max_utilization",
    "sglang": "max_utilization",
    "lmdeploy-turbomind": "max_utilization",
}

# The TP all-reduce an engine calls (scenario key cluster.allreduce; per-call costs in
# simulator/cost/collectives.py), by engine and version:
# - vLLM: NCCL until its custom all-reduce kernels (PR #2192, merged 2023-12, first released
#   in v0.2.7); custom from then on for single-node TP (NCCL stays the fallback across nodes).
# - TensorRT-LLM (and NIM's TRT-LLM profiles): its own AllReduce plugin (custom kernels).
# - LMDeploy TurboMind v0.1: NCCL (src/turbomind/utils/nccl_utils.cc, ncclAllReduce per call;
#   custom all-reduce came to TurboMind in v0.4+).
VLLM_CUSTOM_ALLREDUCE_FROM = (0, 2, 7)
ALLREDUCE_BY_ENGINE = {"tensorrt-llm": "custom", "lmdeploy-turbomind": "nccl", "sglang": "custom"}

# KV-cache dtype an engine uses when a source does not state it:
# - TensorRT-LLM (and NIM's TRT-LLM profiles) run NVIDIA ModelOpt FP8 checkpoints, whose
#   hf_quant_config.json carries "kv_cache_quant_algo": "FP8"; the engine takes the checkpoint's
#   KV quantization (TensorRT-LLM docs, "Quantization": pre-quantized ModelOpt checkpoints run
#   as exported). So FP8 weights on TensorRT-LLM mean an FP8 KV cache.
# - vLLM: kv_cache_dtype "auto" = the model's 16-bit dtype (kvpd's own default, nothing to add).
TRTLLM_FP8_KV = {"tensorrt-llm"}

# vLLM's scheduler defaults when a source states neither max_num_seqs nor
# max_num_batched_tokens (engine code, by version, GPU and entry point):
# - V1 engine (default from v0.8.0): vllm/engine/arg_utils.py `_set_default_args_v1` (later
#   Platform.get_batch_defaults; tests/engine/test_arg_utils.py test_defaults_with_usage_context):
#   GPUs with >= 70 GiB that are not A100: max_num_seqs 1024, max_num_batched_tokens 16384 for
#   the LLM class (offline benchmark_throughput.py) and 8192 for the OpenAI server; other GPUs:
#   256 and 8192 / 2048. Chunked prefill always on.
# - V0 engine (before v0.8.0): max_num_seqs 256; chunked prefill switched on by itself only for
#   max_model_len > 32K; without it a step holds whole prompts, max_num_batched_tokens =
#   max(max_model_len, 2048) (vllm/config.py SchedulerConfig, v0.7).
VLLM_V1_FROM = (0, 8)
VLLM_V1_BIG_GPU_GIB = 70
VLLM_V1_DEFAULTS = {  # (big GPU, offline LLM class) -> (max_num_seqs, max_num_batched_tokens)
    (True, True): (1024, 16384), (True, False): (1024, 8192),
    (False, True): (256, 8192), (False, False): (256, 2048),
}
VLLM_V0_MAX_NUM_SEQS = 256
VLLM_V0_LONG_CONTEXT = 32 * 1024

# TensorRT-LLM's scheduler defaults when a source states neither (LLM API reference,
# TorchLlmArgs / TrtLlmArgs: enable_chunked_prefill "Defaults to False", max_num_tokens 8192;
# docs "Tuning Max Batch Size and Max Num Tokens": a context request is scheduled only when its
# whole prompt fits the step's max_num_tokens). The batch limit is left at kvpd's default:
# engines are built with their own max_batch_size, which the sources do not state.
TRTLLM_MAX_NUM_TOKENS = 8192

def allreduce_rule(row: Any, engine: str, sc: dict[str, Any], notes: list[str]) -> None:
    """cluster.allreduce by the engine's documented all-reduce (ALLREDUCE_BY_ENGINE, and vLLM
    by version); only where some TP > 1 (a TP1 replica has no all-reduce)."""
    c = sc["cluster"]
    tps = [c.get("tp", 1)] + [p["tp"] for p in (c.get("pd") or {}).values() if isinstance(p, dict)]
    if max(tps) <= 1:
        return
    if engine == "vllm":
        v = version3(row.source.get("engine_version"))
        if v is None:
            notes.append("vLLM version not published: its custom all-reduce assumed")
            impl = "custom"
        else:
            impl = "custom" if v >= VLLM_CUSTOM_ALLREDUCE_FROM else "nccl"
    elif engine in ALLREDUCE_BY_ENGINE:
        impl = ALLREDUCE_BY_ENGINE[engine]
    else:
        raise ValueError(f"{row.key}: no rule says which all-reduce engine {engine!r} calls")
    if impl != "custom":
        c["allreduce"] = impl
    notes.append(f"cluster.allreduce {impl}: the TP all-reduce of {engine} "
                 f"{row.source.get('engine_version')}")


def version3(text: Any) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a published version (the lowest listed); None when unknown."""
    found = [tuple(int(x) for x in m) for m in re.findall(r"(\d+)\.(\d+)\.(\d+)", str(text))]
    return min(found) if found else None


def vllm_defaults(row: Any, s: dict[str, Any], sc: dict[str, Any], closed: bool,
                   notes: list[str]) -> None:
    """vLLM's documented scheduler defaults (see VLLM_V1_DEFAULTS) for what a source leaves
    unset; a source of unknown version keeps kvpd's defaults (said in the notes)."""
    from simulator.cost.hardware import get_accelerator
    from simulator.cost.models import get_model

    sched = sc["scheduler"]
    if s.get("max_batch") and s.get("max_num_batched_tokens"):
        return
    v3 = version3(row.source.get("engine_version"))  # (major, minor) of the lowest listed
    version = v3[:2] if v3 else None
    if version is None:
        notes.append("vLLM version not published: kvpd's scheduler defaults")
        return
    if version >= VLLM_V1_FROM:
        acc = get_accelerator(sc["hardware"])
        big = acc.memory_bytes >= VLLM_V1_BIG_GPU_GIB * 2**30 and "a100" not in acc.name
        offline = not closed and "benchmark_throughput" in str(row.source.get("harness", ""))
        seqs, tokens = VLLM_V1_DEFAULTS[(big, offline)]
        where = f"vLLM V1 defaults ({'>= 70 GiB, not A100' if big else 'smaller GPU or A100'}, " \
                f"{'LLM class' if offline else 'OpenAI server'})"
    else:
        seqs = VLLM_V0_MAX_NUM_SEQS
        max_len = int(s.get("max_model_len") or get_model(sc["model"]).max_position_embeddings)
        if max_len > VLLM_V0_LONG_CONTEXT:
            notes.append("vLLM V0 with long context: chunked prefill on, token budget left at "
                         "kvpd's default")
            tokens = None
        else:
            sched["enable_chunked_prefill"] = False
            tokens = max(max_len, 2048)
        where = f"vLLM V0 defaults (max_model_len {max_len})"
    if not s.get("max_batch"):
        sched["max_num_seqs"] = seqs
    if tokens and not s.get("max_num_batched_tokens"):
        sched["max_num_batched_tokens"] = tokens
    notes.append(f"scheduler limits not published: {where}: max_num_seqs "
                 f"{sched.get('max_num_seqs')}, max_num_batched_tokens "
                 f"{sched.get('max_num_batched_tokens', 'kvpd default')}"
                 + (", no chunked prefill" if sched.get("enable_chunked_prefill") is False else ""))


def trtllm_defaults(s: dict[str, Any], sc: dict[str, Any], notes: list[str]) -> None:
    """TensorRT-LLM's documented scheduler defaults (TRTLLM_* above) for what a source leaves
    unset: whole prompts per step (no chunked prefill) within 8192 tokens."""
    sched = sc["scheduler"]
    if s.get("enable_chunked_prefill") is None:
        sched["enable_chunked_prefill"] = False
    if not s.get("max_num_batched_tokens"):
        sched["max_num_batched_tokens"] = TRTLLM_MAX_NUM_TOKENS
    notes.append("scheduler limits not published: TensorRT-LLM defaults, max_num_tokens "
                 f"{sched['max_num_batched_tokens']}, chunked prefill "
                 f"{'off' if sched.get('enable_chunked_prefill') is False else 'on'}")
