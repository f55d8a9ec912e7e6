"""`kvpd generate`: run prompts (token ids) through the real engine and print the output."""

from __future__ import annotations

import argparse

from kvpd.cli import UserError
from kvpd.commands.arg_types import non_negative_int, positive_int
from simulator.core.config import CAPACITY_POLICIES


def _ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--prompt-ids expects comma-separated integers, got {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    from realexec.engine.configs import BUILTIN_CONFIGS  # (no torch: shapes only)

    p = sub.add_parser(
        "generate",
        help="generate tokens with the real engine (paged KV cache, shared scheduler)",
        description="Generate with a real model. --model is a directory (config.json + "
        "safetensors), a config.json (seeded random weights) or a built-in name "
        f"({', '.join(BUILTIN_CONFIGS)}).",
    )
    p.add_argument("--model", default="llama-50m", help="model directory, config.json or built-in name")
    p.add_argument("--prompt-ids", type=_ids, action="append", metavar="1,2,3",
                   help="a prompt as token ids; repeat for a batch")
    p.add_argument("--prompt", action="append", metavar="TEXT",
                   help="a text prompt (needs a tokenizer: a model directory with tokenizer "
                        "files, or --tokenizer); repeat for a batch")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="directory with tokenizer files (default: the model directory's)")
    p.add_argument("--random-prompts", type=int, default=0, metavar="N",
                   help="also add N random prompts (seeded by --seed)")
    p.add_argument("--prompt-len", type=int, default=32, help="length of the random prompts (tokens)")
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=16)
    g.add_argument("--min-tokens", type=int, default=0)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    g.add_argument("--n", type=int, default=1, help="sequences per prompt")
    g.add_argument("--stop-token-ids", type=_ids, default=[])
    g.add_argument("--ignore-eos", action="store_true")
    e = p.add_argument_group("engine")
    e.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    e.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cuda, mps or cpu")
    e.add_argument("--block-size", type=positive_int, default=16)
    e.add_argument("--num-gpu-blocks", type=positive_int, default=None)
    e.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    e.add_argument("--max-num-seqs", type=int, default=256)
    e.add_argument("--max-num-batched-tokens", type=int, default=2048)
    e.add_argument("--no-prefix-caching", action="store_true")
    e.add_argument("--hybrid-kv-cache", action="store_true",
                   help="a model mixing sliding-window and full-attention layers: block tables "
                   "per group of layers, the sliding ones holding only their window (vLLM V1's "
                   "hybrid KV cache manager)")
    e.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"])
    e.add_argument("--capacity-policy", default="max_utilization",
                   choices=list(CAPACITY_POLICIES),
                   help="guaranteed_no_evict: reserve prompt + max_tokens at admission, never "
                        "preempt; reserve_ratio: SGLang's decaying reservation")
    e.add_argument("--model-seed", type=non_negative_int, default=0, help="seed of random weights")
    e.add_argument("--no-warmup", action="store_true",
                   help="time the first request cold (default: one short untimed request first)")
    p.add_argument("--out", default=None, help="directory for summary.json, requests.parquet, outputs.json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import random
    import time

    from realexec.engine.llm import LLM
    from realexec.engine.metrics import requests_of, summarize_run, write_run
    from realexec.engine.tokenizer import has_tokenizer

    prompts: list = list(args.prompt_ids or []) + list(args.prompt or [])
    if args.random_prompts < 0 or args.prompt_len < 1:
        raise UserError("--random-prompts must be >= 0 and --prompt-len >= 1")
    if not prompts and not args.random_prompts:
        raise UserError("give --prompt-ids 1,2,3 or --prompt TEXT (repeatable) or "
                        "--random-prompts N")
    if args.prompt and not args.tokenizer and not has_tokenizer(args.model):
        raise UserError(f"--prompt needs a tokenizer: {args.model} is not a directory with "
                        "tokenizer files; give --tokenizer DIR or --prompt-ids")
    if args.out:  # a folder that can be written, before the model loads
        from kvpd.commands.out_paths import check_out_dir

        check_out_dir(args.out, "--out")
    llm = LLM(
        args.model, dtype=args.dtype, device=args.device, block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks, gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching, preemption_mode=args.preemption_mode,
        capacity_policy=args.capacity_policy, hybrid_kv_cache=args.hybrid_kv_cache,
        model_seed=args.model_seed, tokenizer=args.tokenizer,
    )
    rng = random.Random(args.seed or 0)
    prompts += [[rng.randrange(llm.vocab_size) for _ in range(args.prompt_len)]
                for _ in range(args.random_prompts)]
    params = {
        "max_tokens": args.max_tokens, "min_tokens": args.min_tokens,
        "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
        "seed": args.seed, "n": args.n, "stop_token_ids": tuple(args.stop_token_ids),
        "ignore_eos": args.ignore_eos,
    }
    if not args.no_warmup:
        llm.warm_up(max(len(p) if not isinstance(p, str) else len(llm.tokenizer.encode(p))
                        for p in prompts))
    t = time.perf_counter()
    outputs = llm.generate(prompts, params)
    wall = time.perf_counter() - t
    print(f"model {llm.loaded.source} ({llm.loaded.num_params / 1e6:.1f}M params, "
          f"{llm.loaded.config.model_type}) on {llm.device}, {args.dtype}; "
          f"{llm.kv_cache_manager.num_gpu_blocks} KV blocks of {args.block_size} tokens")
    for i, o in enumerate(outputs):
        for c in o.outputs:
            ttft = (c.first_token_time - o.arrival_time) if c.first_token_time is not None else None
            detail = f" ({c.stop_reason})" if c.stop_reason else ""
            ttft_s = f"{ttft * 1e3:.1f} ms" if ttft is not None else "-"
            print(f"[{i}.{c.index}] prompt {len(o.prompt_token_ids)} tok -> {len(c.token_ids)} tok, "
                  f"finish={c.finish_reason}{detail}, ttft={ttft_s}: "
                  f"{','.join(map(str, c.token_ids))}"
                  + (f"\n      {c.text!r}" if c.text is not None else ""))
    summary = (write_run(args.out, llm, outputs, wall) if args.out
               else summarize_run(llm, requests_of(outputs), wall))
    print(f"{summary['requests']['finished']}/{summary['requests']['total']} finished in "
          f"{wall:.2f} s; {summary['throughput']['output_tokens_per_s']:.1f} output tok/s")
    if args.out:
        print(f"wrote {args.out}/summary.json, requests.parquet, outputs.json")
    return 0
