"""`kvpd estimate`: the roofline time of one engine step, its bound and its breakdown.

    kvpd estimate --model llama-3-8b --hardware h100-sxm --prefill 2048
    kvpd estimate --model llama-3-70b --hardware h100-sxm --tp 4 --decode 64x2048 --json
    kvpd estimate --model mixtral-8x7b --hardware h100-sxm --tp 2 --ep 2 --decode 32x1024 --explain
    kvpd estimate --model deepseek-v3 --hardware h200-sxm --dtype fp8 --tp 8 --ep 8 \
        --dp-attention --decode 256x4096
    kvpd estimate --model llama-3.1-8b --hardware a10 --dtype int4 --quantization awq \
        --decode 16x1024 --explain
    kvpd estimate --scenario scenarios/quickstart.yaml --decode 32x1024 --explain

`--scenario FILE` prices one step of that scenario's own replica, as `kvpd simulate` builds it
(its engine's documented defaults, kernels, memory plan and calibration included; `--set`
overrides its keys, `--pool` picks a PD scenario's prefill or decode pool); the flags that
describe the model, hardware, parallelism, precision, kernels and memory are then the
scenario's and are refused on the command line.

`--prefill N` (or `BxN`) adds prompt(s) of N new tokens with no cached context;
`--decode BxC` adds B decodes of one token after C context tokens. Given both, the step
mixes them (chunked prefill), as the scheduler would.
"""

from __future__ import annotations

import argparse
import json
import re

from kvpd.commands.estimate_setup import SCENARIO_SETS, setup_from_flags, setup_from_scenario
from simulator.cost.kernels import ATTENTION_BACKENDS, FUSED_MOE_CONFIGS
from simulator.cost.moe_cost import MOE_A2A_BACKENDS

POOLS = ("colocated", "prefill", "decode")


def _overrides(text: str) -> dict:
    """--hf-overrides: a JSON object of HF config keys."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--hf-overrides expects a JSON object, got {text!r} "
                                         f"({exc.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"--hf-overrides expects a JSON object of HF config "
                                         f"keys, got {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("estimate", help="roofline time of one engine step (explained)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", metavar="FILE", default=None,
                   help="price a step of this scenario's replica (engine defaults included) "
                        "instead of --model/--hardware and the flags below")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="with --scenario: override a scenario key, e.g. --set cluster.tp=4 "
                        "(repeatable)")
    p.add_argument("--pool", choices=POOLS, default=None,
                   help="with --scenario: the pool to price (a PD scenario's prefill or decode "
                        "pool; default: the colocated one)")
    p.add_argument("--model", default=None, help="catalog model, HF id or config.json path")
    p.add_argument("--hf-overrides", type=_overrides, metavar="JSON", default=None,
                   help="HF config keys laid over the model's config, as vLLM's --hf-overrides "
                        "(scenario key hf_overrides), e.g. '{\"max_position_embeddings\": 32768}'")
    p.add_argument("--hardware", default=None,
                   help="catalog accelerator (see `kvpd hardware list`) or an inline YAML mapping, "
                        "e.g. '{base: h100-sxm, mem_bw_tbps_scale: 2}'")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree (default 1)")
    p.add_argument("--ep", type=int, default=1,
                   help="expert-parallel degree for MoE models, dividing --tp: the experts in "
                        "ep groups of tp/ep GPUs (1: every expert split tp ways; tp: whole "
                        "experts per GPU)")
    p.add_argument("--moe-a2a-backend", default="none", choices=MOE_A2A_BACKENDS,
                   help="with --ep > 1: none (default; the engines' default: every rank holds "
                        "every token and the TP all-reduce sums the experts' outputs) or "
                        "all_to_all (each token dispatched to its experts' GPUs and combined "
                        "back: DeepEP-style; cluster.moe_a2a_backend)")
    p.add_argument("--fused-moe-config", default="tuned", choices=FUSED_MOE_CONFIGS,
                   help="MoE models on NVIDIA: tuned (default; or vLLM's defaults from v0.17) "
                        "or legacy_default (the old fallback config vLLM ran before v0.17 "
                        "and SGLang runs, for a shape without a tuned file; "
                        "cluster.fused_moe_config)")
    p.add_argument("--dp-attention", action="store_true",
                   help="data-parallel attention (MoE models, tp >= 2, pp 1): the step's "
                        "requests spread over the tp GPUs' attention ranks one by one, the MoE "
                        "layers over all their tokens (cluster.dp_attention)")
    p.add_argument("--attention-backend", default="flash_attn",
                   choices=ATTENTION_BACKENDS,
                   help="attention kernel: flash_attn (default), flash_attn_2 (vLLM's one "
                        "FlashAttention-2 call per step on A100/L40S: decodes beside prompt "
                        "tokens unpacked) or triton_attn (vLLM's Triton unified attention, "
                        "which it runs for gpt-oss on A100/L40S)")
    p.add_argument("--prefill-graph-max-tokens", type=int, default=None, metavar="N",
                   help="a step with prompt tokens and more than N tokens runs outside CUDA "
                   "graphs and pays its layers' host dispatch (0: every such step, as SGLang "
                   "before v0.5.10; default: every step under graphs)")
    p.add_argument("--host-request-s", type=float, default=0.0, metavar="S",
                   help="the engine's host seconds per scheduled request per step that the GPU "
                        "waits for (cluster.host_request_s; vLLM 0.8-0.13's synchronous V1 "
                        "scheduler: 5.5e-6; default 0)")
    p.add_argument("--async-scheduling", action="store_true",
                   help="with --host-request-s: the scheduler works beside the GPU's step and "
                        "counts only where it is longer (vLLM from 0.14; cluster.async_scheduling)")
    p.add_argument("--explain", action="store_true",
                   help="also say what bounds the step: each operator's efficiency, its source "
                        "and bound, expected experts loaded (MoE), the attention form (MLA)")
    p.add_argument("--dtype", default="bf16", help="weights: fp32, bf16, fp16, fp8, int8, int4")
    p.add_argument("--quantization", default=None, metavar="METHOD",
                   help="fp8, w8a8, awq or gptq (default: fp8 for fp8, w8a8 for int8, awq for "
                        "int4 weights)")
    p.add_argument("--group-size", type=int, default=None,
                   help="weights per quantization group of awq/gptq (default 128; -1 per channel)")
    p.add_argument("--quantization-scope", default=None, metavar="SCOPE",
                   help="matrices the quantization covers: all (default), experts (the routed "
                        "MoE experts only, the rest 16-bit: gpt-oss's MXFP4 release), mlp (every "
                        "MLP and expert, attention 16-bit) or mlp_and_o_proj (those and the "
                        "attention output: NVIDIA's DeepSeek FP4-v2 exports)")
    p.add_argument("--kv-cache-dtype", default=None,
                   help="auto, bf16, fp16 or fp8 (default auto: the 16-bit activation dtype)")
    p.add_argument("--hybrid-kv-cache", action="store_true",
                   help="a model mixing sliding-window and full-attention layers: block tables "
                        "per group of layers, the sliding ones holding only their window (vLLM "
                        "V1's hybrid KV cache manager; scenario key "
                        "cache.disable_hybrid_kv_cache_manager: false)")
    p.add_argument("--prefill", metavar="[Bx]N", help="B prompts (default 1) of N tokens")
    p.add_argument("--decode", metavar="BxC", help="B decodes after C context tokens each")
    p.add_argument("--params", metavar="YAML", help="calibrated CostParams file")
    mem = p.add_mutually_exclusive_group()
    mem.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                     help="share of each GPU's memory for weights, activations and KV (vLLM; "
                          "default 0.9)")
    mem.add_argument("--free-gpu-memory-fraction", type=float, default=None, metavar="F",
                     help="instead: the KV cache gets F of the memory the weights and "
                          "activations leave (TensorRT-LLM's KvCacheConfig; its default 0.9)")
    mem.add_argument("--mem-fraction-static", type=float, default=None, metavar="F",
                     help="instead: weights and KV take F of the memory, activations the rest "
                          "(SGLang's --mem-fraction-static)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run, flag_defaults={d: p.get_default(d) for d in SCENARIO_SETS})


def parse_batch(text: str, flag: str, need_batch: bool) -> tuple[int, int]:
    """'BxN' -> (B, N); 'N' -> (1, N) unless `need_batch`."""
    m = re.fullmatch(r"\s*(?:(\d+)\s*[xX*]\s*)?(\d+)\s*", text or "")
    if not m or (need_batch and m.group(1) is None):
        form = "BxC, e.g. 64x2048" if need_batch else "N or BxN, e.g. 2048 or 4x512"
        raise ValueError(f"{flag} {text!r}: expected {form}")
    b, n = int(m.group(1) or 1), int(m.group(2))
    if b < 1 or n < 1:
        raise ValueError(f"{flag} {text!r}: batch and length must be >= 1")
    return b, n


def kv_tokens_held(model, block_size: int, sliding_groups: int = 0):
    """Tokens of KV (whole blocks) one request of n tokens keeps in the pool during a step
    that adds `step` of them: n, or when every layer slides, the blocks of its window plus
    that step's (the core's rule, `kv_cache_manager.blocks_held`): a prefill's step writes
    all its tokens before any block can slide out, a decode step adds one. With
    `sliding_groups` (KV cache groups: a block holds one group's layers) the full-attention
    group's n tokens plus each sliding group's window blocks."""
    from simulator.core.kv_cache_manager import blocks_held

    if sliding_groups:
        w = model.sliding_window
        return lambda n, step: (-(-n // block_size) * block_size + sliding_groups
                                * blocks_held(n, block_size, w, step) * block_size)
    w = model.sliding_window if model.num_sliding_layers == model.num_layers else 0
    if not w:
        return lambda n, step: n
    return lambda n, step: min(n, blocks_held(n, block_size, w, step) * block_size)


def run(args: argparse.Namespace) -> int:
    from simulator.core.batch_shape import BatchShape
    from simulator.cost.memory_plan import linear_attention_note, mixed_window_note
    from simulator.cost.precision import checkpoint_note

    if not args.prefill and not args.decode:
        raise ValueError("give --prefill N, --decode BxC, or both")
    if not args.scenario and (args.overrides or args.pool):
        raise ValueError("--set and --pool apply to --scenario FILE")
    setup = setup_from_scenario(args) if args.scenario else setup_from_flags(args)
    model, acc, cm, plan = setup.model, setup.accelerator, setup.cost_model, setup.plan
    dp = setup.dp_cost is not None
    tp, pp, ep = setup.tp, setup.pp, setup.ep
    # the step's requests, one by one over the attention ranks (one rank without dp)
    ranks = [BatchShape(window=model.attention_window) for _ in range(tp if dp else 1)]
    rank_kv = [0] * len(ranks)
    held0 = kv_tokens_held(model, plan.block_size, plan.sliding_groups)
    state = plan.state_blocks_per_request * plan.block_size  # linear-attention state, as tokens

    def held(n: int, step: int) -> int:
        return held0(n, step) + state
    reqs: list[tuple[int, int, int]] = []  # (new tokens, context before, KV tokens held)
    if args.prefill:
        b, n = parse_batch(args.prefill, "--prefill", need_batch=False)
        reqs += [(n, 0, held(n, n))] * b
    if args.decode:
        b, c = parse_batch(args.decode, "--decode", need_batch=True)
        reqs += [(1, c, held(c + 1, 1))] * b
    for i, (new, ctx, kv) in enumerate(reqs):
        ranks[i % len(ranks)].add(new, ctx)
        rank_kv[i % len(ranks)] += kv
    kv_tokens = max(rank_kv)  # in the fullest pool (one per rank with dp)
    if dp:
        from simulator.cost.dp_attention import merged_shape

        shape = merged_shape(ranks)
        br = setup.dp_cost.breakdown(ranks)
    else:
        shape = ranks[0]
        br = cm.explain(shape)
    out = br.to_dict()
    out["decode_tokens_per_s"] = shape.num_decode_reqs / br.total_s if shape.num_decode_reqs else 0.0
    out["memory_plan"] = plan.to_dict()
    out["kv_tokens_needed"] = kv_tokens
    out["fits_kv_pool"] = kv_tokens <= plan.max_num_tokens
    out["kv_plan_note"] = (mixed_window_note(cm.model, plan.kv_group_layers, plan.sliding_groups)
                           or linear_attention_note(cm.model, plan))
    out["precision"] = cm.precision.to_dict()
    note = checkpoint_note(model, setup.dtype, setup.quantization)  # what the checkpoint filled in
    out["precision"]["from_checkpoint"] = note is not None
    out["efficiencies"] = {k: {"value": v, "source": src}
                           for k, (v, src) in cm.efficiency_sources().items()}
    if setup.origin:
        out["scenario"] = setup.origin
        out["engine_notes"] = setup.engine_notes
    if args.explain:
        out["explain"] = explain_variants(cm, br, shape.num_tokens)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    if setup.origin:
        print(setup.origin + (", with its engine's rules:" if setup.engine_notes else ""))
        for rule in setup.engine_notes:
            print(f"  - {rule}")
    print(f"{model.name} on {tp * pp} x {acc.name} (tp={tp}, pp={pp}"
          + (f", ep={ep}" if ep > 1 else "")
          + (f", data-parallel attention over {tp} ranks" if dp else "") + "), "
          f"{cm.precision.label()}, GEMMs in {cm.precision.compute}"
          + ({"triton_attn": ", vLLM's Triton attention",
              "flash_attn_2": ", vLLM's FlashAttention-2 varlen attention"}
             .get(cm.attention_backend, ""))
          + ("  [PLACEHOLDER hardware figures]" if acc.placeholder else ""))
    print(f"step: {shape.num_prefill_reqs} prefill ({shape.num_prefill_tokens} tokens), "
          f"{shape.num_decode_reqs} decode (context {args.decode or '-'})")
    print(f"step time     {br.total_s * 1e3:.3f} ms")
    print(f"tokens/s      {br.tokens_per_s:,.0f} (all tokens computed this step)")
    if shape.num_decode_reqs:
        print(f"decode tok/s  {out['decode_tokens_per_s']:,.0f} (one token per decode per step)")
    by = br.by_bound
    print(f"bound         {br.bound} (" + ", ".join(
        f"{k} {v / br.total_s:.0%}" for k, v in by.items() if v > 0) + ")")
    print(f"dominant op   {br.dominant_op.name} ({br.dominant_op.bound})")
    print(f"memory        {plan.weight_bytes_per_gpu / 1e9:.1f} GB weights/GPU, KV pool "
          f"{plan.kv_pool_bytes / 1e9:.1f} GB = {plan.num_gpu_blocks} blocks "
          f"({plan.max_num_tokens:,} tokens)" + (" per attention rank" if dp else ""))
    if dp:
        busiest = br.description["busiest_rank"]
        print(f"ranks         the slowest rank's attention ({busiest['num_reqs']} requests, "
              f"{busiest['num_tokens']} tokens) + the MoE layers over all {shape.num_tokens} "
              "tokens with their gather and scatter")
    if note:
        print(f"precision     {note}; --quantization and --quantization-scope override it")
    if not out["fits_kv_pool"]:
        print(f"warning: this batch needs {kv_tokens:,} KV tokens; the pool holds "
              f"{plan.max_num_tokens:,}")
    if out["kv_plan_note"]:
        print(f"KV plan       {out['kv_plan_note']}")
    print()
    print(br.format_table(explain=args.explain))
    if args.explain:
        print(f"\nbound: {br.bound}; {by['compute'] / br.total_s:.0%} of the step in "
              f"compute-bound operators, {by['memory'] / br.total_s:.0%} memory-bound, "
              f"{by['communication'] / br.total_s:.0%} communication, "
              f"{by['overhead'] / br.total_s:.0%} fixed overheads")
        print("efficiencies (fraction of peak before shape terms):")
        for k, v in out["efficiencies"].items():
            print(f"  {k:24s} {v['value']:.3f}  {v['source']}")
        print()
        for k, v in out["explain"].items():
            print(f"{k:34s} {v}")
    return 0


def explain_variants(cm, br, num_tokens: int) -> dict:
    """What bounds the step, in words a capacity planner reads: the step's bound and its
    dominant operator; for MoE the experts one GPU holds and is expected to load per MoE
    layer, (E/ep) x (1 - (1 - k/E)^T), and the expert GEMMs' bound; for MLA the attention
    forms and the latent KV bytes per token."""
    m = cm.model
    out: dict = {"step bound": f"{br.bound} (dominant operator {br.dominant_op.name}, "
                               f"{br.dominant_op.bound}-bound)"}
    ops = {op.name: op for op in br.ops}
    if m.is_moe:
        held = m.num_experts // cm.ep
        loaded = cm.expected_experts_loaded(num_tokens)
        out["experts per MoE layer"] = (f"{m.num_experts} routed, top-{m.experts_per_token}"
                                        + (f", {m.num_shared_experts} shared"
                                           if m.num_shared_experts else "")
                                        + f"; {m.num_moe_layers} MoE + {m.num_dense_layers} dense layers")
        out["experts held per GPU"] = (f"{held} whole (ep={cm.ep})" if cm.ep > 1
                                       else f"{held} x 1/{cm.tp} column slice (tp={cm.tp})")
        out["expected experts loaded per GPU"] = (f"{loaded:.2f} of {held} per MoE layer "
                                                  f"for {num_tokens} tokens")
        op = ops.get("moe_experts")
        if op is not None:
            out["expert GEMMs"] = (f"{op.bound}-bound: {op.compute_s * 1e3:.3f} ms compute vs "
                                   f"{op.memory_s * 1e3:.3f} ms weight/activation reads")
        if "ep_all_to_all" in ops:
            out["EP dispatch + combine"] = (f"{ops['ep_all_to_all'].time_s * 1e3:.3f} ms over "
                                            f"{cm.ep_link.name}")
    if m.is_mla and m.is_sparse_attention:  # DSA runs in MLA's MQA (absorbed) form
        out["attention"] = (f"MLA: prefill and decode absorbed over the latent "
                            f"({m.kv_lora_rank}+{m.qk_rope_head_dim} per key)")
    elif m.is_mla:
        out["attention"] = (f"MLA: prefill expanded (heads x {m.head_dim}+{m.v_head_dim} per "
                            "key), decode absorbed over the latent "
                            f"({m.kv_lora_rank}+{m.qk_rope_head_dim} per key)")
        out["KV bytes per token"] = f"{m.kv_bytes_per_token(cm.kv_cache_dtype):,.0f} (latent)"
    if m.is_sparse_attention:
        out["sparse attention"] = (
            f"each query attends to its top {m.index_topk:,} keys (capped sums); the indexer "
            f"({m.index_n_heads} heads x {m.index_head_dim}, FP8) scores every key, priced as "
            f"{cm.indexer_shares[0]:.3f} of a prefill pair and {cm.indexer_shares[1]:.3f} of a "
            "KV token read per key")
        where = (f"on {m.num_index_layers} of {m.num_layers} layers" if m.num_index_layers
                 else "per layer")
        out["KV bytes per token"] = (f"{m.kv_bytes_per_token(cm.kv_cache_dtype):,.0f} (latent "
                                     f"+ {m.indexer_key_bytes} B indexer key {where})")
    if m.has_linear_attention:
        op = ops.get("linear_attn")
        out["linear attention"] = (
            f"{m.linear_mixer_name} on {m.num_linear_layers} of {m.num_layers} "
            f"layers ({m.linear_heads}), state "
            f"{m.linear_state_dtype or 'in the model dtype'}"
            + (f": {op.time_s * 1e3:.3f} ms" if op is not None else ""))
        out["KV bytes per token"] = (f"{m.kv_bytes_per_token(cm.kv_cache_dtype):,.0f} (the "
                                     f"{m.num_full_attention_layers} softmax-attention layers)")
    return out
