"""trtllm-bench's own scheduler limits, for `engine: {name: tensorrt-llm, entry_point: offline}`.

`trtllm-bench throughput` given no `--max_batch_size` / `--max_num_tokens` sizes both from
the dataset and the GPU memory (TensorRT-LLM tensorrt_llm/bench/build/tuning.py
`calc_engine_setting` and `finetune_setting`, called from bench/benchmark/utils/general.py
`get_settings`; the same rule from v0.17 to 1.x):

1. KV requests = 0.90 (`--kv_cache_free_gpu_mem_fraction` default) x (total GPU memory of
   the TP x PP GPUs - parameters x bytes per weight) / (KV bytes per token x (average prompt +
   average output length)). KV bytes per token = 2 x layers x max(tp, KV heads) x head size
   x bytes per KV element, from the HF config's `num_key_value_heads` and `head_dim` (else
   hidden / heads): for DeepSeek's MLA the config's 128 heads of 56, not the latent width.
2. batch = min(KV requests, 4096) / pp, rounded up: to 32 (at least 64) below 256, to 128
   below 1024, else to 256.
3. tokens = min(batch x (1 + average prompt / average output), 32768), rounded up: to 256
   (at least 2048) below 4096, to 512 below 8192, else to 1024.
4. Without chunked prefill (trtllm-bench's default): tokens >= the longest prompt + batch.

Only the quantizations the tool tunes (none, FP8, FP8 block scales, NVFP4) use the rule;
any other (INT4 AWQ, W8A8, MXFP4, ...) gets the build defaults, max_batch_size 2048 and
max_num_tokens 8192 (`BuildConfig`), step 4 still applying. The parameters are kvpd's
logical count (the tool reads the safetensors header: for NVFP4 packed weights count half).
"""

from __future__ import annotations

import math
from typing import Any

from simulator.cost.hardware import scenario_accelerator
from simulator.cost.precision import resolve

KV_FRACTION = 0.90  # trtllm-bench throughput --kv_cache_free_gpu_mem_fraction default
MAX_BATCH = 4096  # cap on the raw batch (decoder buffers)
MAX_TOKENS = 32768  # cap on the raw token budget (activation buffers)
BUILD_DEFAULTS = (2048, 8192)  # BuildConfig max_batch_size / max_num_tokens (untuned quantizations)
# bytes per weight of the quantizations the rule tunes, by (dtype, method)
TUNED_WEIGHT_BYTES = {("bf16", None): 2.0, ("fp16", None): 2.0, ("fp8", "fp8"): 1.0,
                      ("fp4", "nvfp4"): 0.5}


# (below this raw value, round up to a multiple of) for each rule, and the floor
BATCH_STEPS, BATCH_FLOOR = ((256, 32), (1024, 128), (math.inf, 256)), 64
TOKEN_STEPS, TOKEN_FLOOR = ((4096, 256), (8192, 512), (math.inf, 1024)), 2048


def _round_up(raw: float, steps: tuple[tuple[float, int], ...], floor: int) -> int:
    """`raw` rounded up to the multiple of its band's step, at least `floor`."""
    step = next(s for below, s in steps if raw < below)
    return max(floor, step * math.ceil(raw / step))


def round_batch(raw: float) -> int:
    """Step 2's rounding of the raw batch size."""
    return _round_up(raw, BATCH_STEPS, BATCH_FLOOR)


def round_tokens(raw: float) -> int:
    """Step 3's rounding of the raw token budget."""
    return _round_up(raw, TOKEN_STEPS, TOKEN_FLOOR)


def kv_requests(model: Any, memory_gib: float, tp: int, pp: int, weight_bytes: float,
                kv_bytes: float, avg_isl: float, avg_osl: float,
                fraction: float = KV_FRACTION) -> float:
    """Step 1: requests of `avg_isl + avg_osl` tokens the tool expects to fit in KV memory
    (`memory_gib`: one GPU's total, GiB)."""
    heads = max(tp, model.num_kv_heads)
    head = model.hidden_size // model.num_heads if model.is_mla else model.head_dim
    per_token_gib = 2 * model.num_layers * heads * head * kv_bytes / 2**30
    engine_gib = model.num_params * weight_bytes / 2**30
    cache_gib = (memory_gib * tp * pp - engine_gib) * fraction
    return cache_gib / (per_token_gib * (avg_isl + avg_osl))


def bench_limits(model: Any, memory_gib: float, tp: int, pp: int, dtype: str,
                 method: str | None, kv_cache_dtype: str, avg_isl: float, avg_osl: float,
                 max_isl: int, chunked_prefill: bool = False) -> tuple[int, int, str]:
    """(max_batch_size, max_num_tokens, how they were chosen) as trtllm-bench would set them."""
    weight_bytes = TUNED_WEIGHT_BYTES.get((dtype, method))
    if weight_bytes is None:
        batch, tokens = BUILD_DEFAULTS
        how = f"build defaults ({dtype}/{method} is not a quantization trtllm-bench tunes)"
    else:
        kv_bytes = 1.0 if kv_cache_dtype == "fp8" else 2.0
        reqs = kv_requests(model, memory_gib, tp, pp, weight_bytes, kv_bytes, avg_isl, avg_osl)
        if reqs < 1:
            raise ValueError(f"trtllm-bench's heuristic finds no room for one request of "
                             f"{avg_isl:.0f} + {avg_osl:.0f} tokens in tp {tp} x pp {pp} GPUs "
                             f"of {memory_gib:.0f} GiB; set scheduler.max_num_seqs and "
                             "max_num_batched_tokens, or use more GPUs")
        raw = min(reqs, MAX_BATCH) / pp
        batch = round_batch(raw)
        tokens = round_tokens(min(raw * (1 + avg_isl / avg_osl), MAX_TOKENS))
        how = (f"heuristic: {reqs:.0f} requests of {avg_isl:.0f} + {avg_osl:.0f} tokens fit "
               "its KV estimate")
    if not chunked_prefill:
        tokens = max(tokens, max_isl + batch)
    return batch, tokens, how


def fill_limits(sc: Any) -> list[str]:
    """For a validated scenario `sc` that stands for `trtllm-bench throughput` (engine
    tensorrt-llm, entry point offline, no PD pools), set the scheduler limits it leaves out
    to trtllm-bench's (module doc) from its workload's lengths; returns the rule used."""
    eng = sc.engine
    if eng is None or eng.name != "tensorrt-llm" or eng.entry_point != "offline":
        return []
    sched = sc.scheduler
    missing = [k for k in ("max_num_seqs", "max_num_batched_tokens")
               if k not in sched.model_fields_set]
    if not missing or sc.cluster.pd is not None:
        return []
    from simulator.scenario_trace import build_trace

    trace = build_trace(sc)
    prompts, outputs = trace.prompt_len, trace.output_len
    acc = scenario_accelerator(sc.hardware)
    model = sc.model_spec()
    prec = resolve(acc, sc.dtype, sc.quantization_mapping(), sc.cache.kv_cache_dtype, model=model)
    batch, tokens, how = bench_limits(
        model, acc.memory_bytes / 2**30, sc.cluster.tp, sc.cluster.pp, prec.dtype, prec.method,
        prec.kv_cache_dtype, float(prompts.mean()), float(outputs.mean()), int(prompts.max()),
        sched.enable_chunked_prefill)
    values = {"max_num_seqs": batch, "max_num_batched_tokens": tokens}
    for key in missing:
        setattr(sched, key, values[key])
    return [f"scheduler limits: trtllm-bench throughput's {how}: "
            + ", ".join(f"{k} {values[k]}" for k in missing)]
