"""Engine and deployment options shared by `kvpd serve` and `kvpd replay`."""

from __future__ import annotations

import argparse
from typing import Any

from kvpd.commands.arg_types import non_negative_int, positive_int
from simulator.core.config import CAPACITY_POLICIES, SchedulerConfig

# scheduler flags of `kvpd serve` / `kvpd replay` -> the `realexec.LLM` keyword (and the
# scenario's scheduler.<key>) each sets; errors from SchedulerConfig name the flag
SCHEDULER_FLAGS = {
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "capacity_policy": "--capacity-policy",
    "enable_chunked_prefill": "--no-chunked-prefill",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
    "mixed_batches": "--no-mixed-batches",
    "recv_interval": "--recv-interval",
    "batch_wait_timeout_iters": "--batch-wait-timeout-iters",
    "batch_wait_max_tokens_ratio": "--batch-wait-max-tokens-ratio",
}


def add_engine_args(p: argparse.ArgumentParser) -> None:
    e = p.add_argument_group("engine")
    e.add_argument("--model", default="llama-50m",
                   help="model directory, config.json or built-in name (default llama-50m)")
    e.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    e.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cuda, mps or cpu")
    e.add_argument("--block-size", type=positive_int, default=16, help="tokens per KV block")
    e.add_argument("--num-gpu-blocks", type=positive_int, default=None, help="KV blocks per worker")
    e.add_argument("--max-num-seqs", type=int, default=256)
    e.add_argument("--max-num-batched-tokens", type=int, default=2048)
    e.add_argument("--max-model-len", type=positive_int, default=None)
    e.add_argument("--no-prefix-caching", action="store_true")
    e.add_argument("--hybrid-kv-cache", action="store_true",
                   help="a model mixing sliding-window and full-attention layers (gpt-oss, "
                   "Gemma 2/3): block tables per group of layers, the sliding ones holding only "
                   "their window (vLLM V1's hybrid KV cache manager)")
    e.add_argument("--capacity-policy", default="max_utilization",
                   choices=list(CAPACITY_POLICIES),
                   help="max_utilization: admit while KV blocks are free, preempt when they run "
                   "out (vLLM); guaranteed_no_evict: reserve prompt + max_tokens at admission, "
                   "never preempt (TensorRT-LLM); reserve_ratio: admit when prompt + output "
                   "budget fit beside a decaying share of the running outputs (SGLang)")
    e.add_argument("--no-chunked-prefill", action="store_true",
                   help="a prompt longer than the step's token budget is not split over steps")
    e.add_argument("--long-prefill-token-threshold", type=int, default=0, metavar="N",
                   help="cap one request's prompt chunk per step at N tokens (0: off)")
    e.add_argument("--no-mixed-batches", action="store_true",
                   help="a step runs prompts or decodes, never both, prompts first (SGLang's "
                   "default; scheduler.mixed_batches false)")
    e.add_argument("--recv-interval", type=int, default=1, metavar="N",
                   help="SGLang's --scheduler-recv-interval: while the engine decodes, new "
                   "requests are taken in every N-th step (default 1; colocated only)")
    e.add_argument("--batch-wait-timeout-iters", type=int, default=0, metavar="N",
                   help="TensorRT-LLM's batch waiting: hold waiting requests beside decodes for "
                   "up to N steps (with --batch-wait-max-tokens-ratio; 0: off)")
    e.add_argument("--batch-wait-max-tokens-ratio", type=float, default=0.0, metavar="R",
                   help="... or until their tokens reach R x --max-num-batched-tokens "
                   "(0: off)")
    e.add_argument("--model-seed", type=non_negative_int, default=0, help="seed of random weights")
    e.add_argument("--seed", type=non_negative_int, default=0, help="sampling seed of the engine")
    d = p.add_argument_group("deployment")
    d.add_argument("--pd", default=None, metavar="P:D",
                   help="disaggregate: P prefill and D decode worker processes (e.g. 1:1)")
    d.add_argument("--kv-mode", default="full", choices=["full", "layerwise"],
                   help="KV transfer: all layers after the prompt, or each layer as computed")
    d.add_argument("--transport", default="ipc", choices=["ipc", "tcp"])
    d.add_argument("--kv-timeout-s", type=float, default=5.0,
                   help="decode side recomputes a prompt whose KV is this late (s)")
    d.add_argument("--num-threads", type=positive_int, default=None, help="torch threads per worker")
    d.add_argument("--log-level", default="WARNING")


def serve_config(args: argparse.Namespace) -> Any:
    """The `ServeConfig` the parsed options describe (ValueError on bad values)."""
    from realexec.serving.config import ServeConfig, parse_pd

    llm_kwargs: dict[str, Any] = {
        "dtype": args.dtype, "block_size": args.block_size, "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "enable_prefix_caching": not args.no_prefix_caching, "seed": args.seed,
        "model_seed": args.model_seed,
    }
    if args.hybrid_kv_cache:
        if args.pd:
            raise ValueError("--hybrid-kv-cache with --pd: the KV hand-off moves one block "
                             "table per request (vLLM turns its hybrid KV cache manager off "
                             "with a KV connector); drop one of them")
        llm_kwargs["hybrid_kv_cache"] = True
    sched = {
        "capacity_policy": args.capacity_policy,
        "enable_chunked_prefill": not args.no_chunked_prefill,
        "long_prefill_token_threshold": args.long_prefill_token_threshold,
        "mixed_batches": not args.no_mixed_batches,
        "recv_interval": args.recv_interval,
        "batch_wait_timeout_iters": args.batch_wait_timeout_iters,
        "batch_wait_max_tokens_ratio": args.batch_wait_max_tokens_ratio,
    }
    defaults = SchedulerConfig()
    llm_kwargs.update({k: v for k, v in sched.items() if v != getattr(defaults, k)})
    if args.device != "auto":
        llm_kwargs["device"] = args.device
    if args.num_gpu_blocks is not None:
        llm_kwargs["num_gpu_blocks"] = args.num_gpu_blocks
    if args.max_model_len is not None:
        llm_kwargs["max_model_len"] = args.max_model_len
    pd = parse_pd(args.pd) if args.pd else None
    check_scheduler_flags(llm_kwargs, ("prefill", "decode") if pd else ("colocated",))
    return ServeConfig(
        model=args.model, llm_kwargs=llm_kwargs,
        pd=pd, kv_mode=args.kv_mode,
        transport=args.transport, kv_timeout_s=args.kv_timeout_s,
        num_threads=args.num_threads, log_level=args.log_level.upper(),
    )


def check_scheduler_flags(llm_kwargs: dict[str, Any], roles: tuple[str, ...]) -> None:
    """Check the scheduler flags for every worker role before any worker starts; ValueError
    naming the flag (as `SchedulerConfig` checks them in each worker)."""
    knobs = {k: llm_kwargs[k] for k in SCHEDULER_FLAGS if k in llm_kwargs}
    for role in roles:
        try:
            SchedulerConfig(role=role, **knobs)
        except ValueError as exc:
            msg = str(exc)
            for key, flag in SCHEDULER_FLAGS.items():
                msg = msg.replace(f"scheduler.{key}", flag)
            where = f" (the {role} workers of --pd)" if role != "colocated" else ""
            raise ValueError(f"{msg}{where}") from None
