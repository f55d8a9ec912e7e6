"""vLLM's own V1 `Scheduler`, run on the CPU with no model: the vLLM side of
`bench/diagnostics/vllm_scheduler.py`, which starts this file under an interpreter that can
import a released vLLM (see that file). Not imported by kvpd.

    python vllm_v1_driver.py '{"num_blocks": ..., "n": ..., "prompt": ..., "out": ...,
                               "budget": ..., "seqs": ..., "prefix": true}'

With "window": W and "sliding_groups": S the KV cache config holds one full-attention group and
S sliding-window groups of window W (the hybrid KV cache manager's layout); with "all_sliding"
its one group slides by W (every layer sliding); with "mamba_groups": M, M groups of
linear-attention layers follow (one state page per request each). With "shared": N
requests i, i + 3, i + 6, ... share their first N prompt tokens.

With {"time": [N, ...]} it times instead `schedule()` and `update_from_output()` while N
requests decode side by side (`time_decode`, for `vllm_host_cost.py`) and prints
{"timing": [[N, schedule s, update_from_output s], ...]} (medians per step).

Every request is in the waiting queue at once (a burst). Each step, a request whose tokens
are all computed after the step samples one token (as vLLM's model runner does: a partial
prefill's sample is discarded); nothing stops early (ignore_eos). Prints one JSON line:
{"trace": [[scheduled tokens, scheduled requests, preemptions so far], ...]} for every step
that scheduled tokens.
"""

from __future__ import annotations

import inspect
import json
import sys
import tempfile
from pathlib import Path

import torch
import vllm.model_executor.models.registry as registry
from step_timing import median_phase_times
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams

try:
    from vllm.utils.hashing import sha256  # (from 0.12)
except ImportError:
    from vllm.utils import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

ARCH = "Qwen3ForCausalLM"  # the scheduler reads no model shape; any text model serves


def _skip_model_inspection() -> None:
    """vLLM inspects the model class in a subprocess that imports its CUDA ops; the scheduler
    never builds the model, so answer the inspection for a plain text-generation model."""
    fields = registry._ModelInfo.__dataclass_fields__  # (they change between releases)
    known = {"architecture": ARCH, "is_text_generation_model": True, "supports_pp": True,
             "default_pooling_type": "LAST", "default_seq_pooling_type": "LAST",
             "default_tok_pooling_type": "ALL", "attn_type": "decoder"}
    info = registry._ModelInfo(**{name: known.get(name, False)
                                  for name, f in fields.items() if f.init})
    registry._ModelRegistry._try_inspect_model_cls = lambda self, arch: info


def prompt_ids(i: int, n: int, shared: int = 0) -> list[int]:
    """Request i's prompt: distinct per request, but for its first `shared` tokens, which
    requests i, i + 3, i + 6, ... share; the same function as the kvpd side's."""
    return [((i % 3 + 100003 if j < shared else i) * 7919 + j * 104729) % 150000 + 1
            for j in range(n)]


def make_scheduler(num_blocks: int, block: int = 16, max_len: int = 40960, seqs: int = 256,
                   budget: int = 8192, prefix: bool = True, async_scheduling: bool = False,
                   window: int = 0, sliding_groups: int = 0, all_sliding: bool = False,
                   mamba_groups: int = 0):
    """vLLM's own V1 scheduler over a KV cache config of `num_blocks` blocks (the groups as
    `run` describes), with the request block hasher and the Request keyword its release wants
    for no EOS: (scheduler, hasher, eos kwargs)."""
    _skip_model_inspection()
    model_dir = Path(tempfile.mkdtemp())
    (model_dir / "config.json").write_text(json.dumps({
        "architectures": [ARCH], "model_type": "qwen3", "hidden_size": 1024,
        "intermediate_size": 2048, "num_hidden_layers": 2, "num_attention_heads": 8,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
        "max_position_embeddings": max_len, "torch_dtype": "bfloat16"}))
    init_vars = {"is_encoder_decoder": False}  # (an InitVar from 0.12)
    if "is_encoder_decoder" not in getattr(SchedulerConfig, "__dataclass_fields__", {}):
        init_vars = {}
    sched_cfg = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget,
                                max_model_len=max_len, enable_chunked_prefill=True, **init_vars)
    extra = {}  # 0.10's config asks the platform about async output processing otherwise
    if "use_async_output_proc" in getattr(ModelConfig, "__dataclass_fields__", {}):
        extra["use_async_output_proc"] = False
    model_cfg = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16",
                            max_model_len=max_len, seed=0, **extra)
    cache_cfg = CacheConfig(block_size=block, gpu_memory_utilization=0.9, swap_space=0,
                            cache_dtype="auto", enable_prefix_caching=prefix)
    cache_cfg.num_gpu_blocks = num_blocks
    cfg = VllmConfig(scheduler_config=sched_cfg, model_config=model_cfg, cache_config=cache_cfg,
                     device_config=DeviceConfig(device="cpu"))
    spec_args = {"block_size": block, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    if "use_mla" in FullAttentionSpec.__dataclass_fields__:  # (a field in 0.10 only)
        spec_args["use_mla"] = False
    # a model mixing sliding-window and full-attention layers: one full-attention group and
    # `sliding_groups` sliding-window ones (the hybrid KV cache manager's layout)
    first = (SlidingWindowSpec(**spec_args, sliding_window=window) if all_sliding
             else FullAttentionSpec(**spec_args))
    kv_cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], first)] + [
        KVCacheGroupSpec([f"sliding{g}"], SlidingWindowSpec(**spec_args, sliding_window=window))
        for g in range(sliding_groups)] + [
        # linear-attention layers: one state page per request and group (a block of the whole
        # context, as vLLM's MambaSpec for its models)
        KVCacheGroupSpec([f"mamba{g}"], MambaSpec(block_size=max_len, shapes=((1,),),
                                                  dtypes=(torch.float32,)))
        for g in range(mamba_groups)])
    extra_args = {}
    if "block_size" in inspect.signature(Scheduler.__init__).parameters:  # (from 0.14 or so)
        extra_args["block_size"] = block
    cls = Scheduler
    if async_scheduling:  # (vLLM's default from 0.14 where the executor supports it)
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler as cls
    sched = cls(vllm_config=cfg, kv_cache_config=kv_cfg, log_stats=False,
                structured_output_manager=StructuredOutputManager(cfg), **extra_args)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(block, sha256)
    eos = ({"eos_token_id": None}  # (moved into SamplingParams in 0.17)
           if "eos_token_id" in inspect.signature(Request.__init__).parameters else {})
    return sched, hasher, eos


def _output(ids: list[str], sampled: list[list[int]]) -> ModelRunnerOutput:
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                             sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                             pooler_output=[])


def time_decode(n: int, steps: int = 60, warm: int = 20) -> tuple[float, float]:
    """Median seconds of `schedule()` and of `update_from_output()` per step while `n`
    requests decode side by side (8-token prompts, room for all), after `warm` steps."""
    sched, hasher, eos = make_scheduler(num_blocks=max(4096, 4 * n * (steps + warm + 32) // 16),
                                        max_len=8192, seqs=n, budget=max(8192, 8 * n))
    for i in range(n):
        sched.add_request(Request(str(i), prompt_ids(i, 8),
                                  SamplingParams(max_tokens=steps + warm + 8, ignore_eos=True),
                                  None, block_hasher=hasher, **eos))

    def sampled(so) -> tuple:  # the model runner's output: one token per request
        ids = list(so.num_scheduled_tokens)
        return so, _output(ids, [[1] for _ in ids])

    def update(handed: tuple) -> int:
        sched.update_from_output(*handed)
        return len(handed[0].num_scheduled_tokens)

    return median_phase_times(sched.schedule, sampled, update, n, steps, warm)


def run(num_blocks: int, n: int, prompt: int, out: int, budget: int, seqs: int,
        prefix: bool = True, block: int = 16, max_len: int = 40960,
        async_scheduling: bool = False, window: int = 0,
        sliding_groups: int = 0, shared: int = 0, all_sliding: bool = False,
        mamba_groups: int = 0) -> list[list[int]]:
    sched, hasher, eos = make_scheduler(num_blocks, block, max_len, seqs, budget, prefix,
                                        async_scheduling, window, sliding_groups, all_sliding,
                                        mamba_groups)
    for i in range(n):
        sched.add_request(Request(str(i), prompt_ids(i, prompt, shared),
                                  SamplingParams(max_tokens=out, ignore_eos=True), None,
                                  block_hasher=hasher, **eos))
    preempted = [0]
    prepend = sched.waiting.prepend_request  # (only a preemption puts a request back here)

    def counted(req: Request) -> None:
        preempted[0] += 1
        prepend(req)

    sched.waiting.prepend_request = counted
    trace = []
    pending = None  # async scheduling: the step in flight while the next one is scheduled
    while sched.has_requests() or pending:
        so = sched.schedule() if sched.has_requests() else None
        if so is not None:
            ids = list(so.num_scheduled_tokens)
            # schedule() has advanced num_computed_tokens: sample iff every token is computed
            sampled = [[1] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens
                       else [] for r in ids]
            if so.total_num_scheduled_tokens:
                trace.append([so.total_num_scheduled_tokens, len(ids), preempted[0]])
            result = _output(ids, sampled)
        if not async_scheduling:
            sched.update_from_output(so, result)
            continue
        if pending is not None:  # the step before this one finishes only now
            sched.update_from_output(*pending)
        pending = (so, result) if so is not None else None
    return trace


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    if "time" in args:  # {"time": [n, ...]}: `time_decode` at each n (vllm_host_cost.py)
        print(json.dumps({"timing": [[n, *time_decode(n)] for n in args["time"]]}))
    else:
        print(json.dumps({"trace": run(**args)}))
