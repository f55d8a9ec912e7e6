"""`kvpd model list|show`: the model catalog, or any HF config.json."""

from __future__ import annotations

import argparse
import json

DTYPES = ("fp32", "bf16", "fp8", "int4", "fp4")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="list catalog models or show a model's shape and sizes")
    msub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    lp = msub.add_parser("list", help="list catalog models")
    lp.add_argument("--json", action="store_true")
    sp = msub.add_parser("show", help="show a catalog model or a config.json (file or directory)")
    sp.add_argument("name", metavar="NAME_OR_PATH")
    sp.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def attention_kind(m) -> str:
    """How the model's queries attend, in words: MLA's latent, sliding windows, sparse top-k."""
    kind = (f"MLA (latent {m.kv_lora_rank} + rope {m.qk_rope_head_dim} cached)" if m.is_mla
            else "MHA (a KV head per query head)" if m.num_kv_heads == m.num_heads else
            f"GQA ({m.num_heads // m.num_kv_heads} query heads per KV head)")
    if m.is_sparse_attention:
        kind += (f"; sparse: each query attends to its top {m.index_topk:,} keys, an indexer "
                 f"({m.index_n_heads} heads x {m.index_head_dim}) scoring all")
        if m.num_index_layers:
            kind += (f" (its own on {m.num_index_layers} of {m.num_layers} layers; the others "
                     "reuse the previous layer's top-k)")
    elif m.num_sliding_layers:
        kind += (f"; a {m.sliding_window:,}-token sliding window on {m.num_sliding_layers} of "
                 f"{m.num_layers} layers")
    if m.has_linear_attention:
        kind = (f"{kind} on {m.num_full_attention_layers} of {m.num_layers} layers"
                + (" (output-gated)" if m.attn_output_gate else "")
                + f"; {m.linear_mixer} on the other {m.num_linear_layers} "
                f"({m.linear_heads}, a fixed state per request)")
    return kind


def _kv_cache_groups(m) -> dict | None:
    from simulator.cost.memory_plan import kv_cache_groups

    groups = kv_cache_groups(m)
    return {"layers_per_group": groups[0], "sliding_groups": groups[1]} if groups else None


def model_dict(m) -> dict:
    """Shape and derived sizes of a ModelSpec (bytes, FLOPs)."""
    return {
        "name": m.name, "hf_id": m.hf_id, "architecture": m.architecture,
        "num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_heads": m.num_heads,
        "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim, "ffn_size": m.ffn_size,
        "vocab_size": m.vocab_size, "num_experts": m.num_experts,
        "experts_per_token": m.experts_per_token,
        "max_position_embeddings": m.max_position_embeddings,
        "tie_word_embeddings": m.tie_word_embeddings,
        "attention": attention_kind(m),
        # Nemotron-H: layers whose mixer no MLP follows; LatentMoE's expert width
        "layers_without_mlp": m.num_mlp_free_layers,
        "moe_latent_size": m.moe_latent_size or None,
        "num_params": m.num_params, "num_active_params": m.num_active_params,
        "flops_per_token": m.flops_per_token,
        "weight_bytes": {dt: m.weight_bytes(dt) for dt in DTYPES},
        "kv_bytes_per_token": {dt: m.kv_bytes_per_token(dt) for dt in ("fp32", "bf16", "fp8")},
        # linear-attention layers' recurrent state of one request, all layers (model dtype)
        "state_bytes_per_request": {dt: m.linear_state_bytes(dt) for dt in ("bf16",)}
        if m.has_linear_attention else None,
        # vLLM V1's hybrid KV cache manager's groups (a model mixing sliding and full layers):
        # layers per group and sliding groups beside the full-attention one
        "kv_cache_groups": _kv_cache_groups(m),
        # the released checkpoint's quantization (config.json quantization_config), which the
        # cost model applies when a scenario's weights are in its dtype and say nothing else
        "checkpoint_quantization": ({"method": m.checkpoint_quant_method,
                                     "scope": m.checkpoint_quant_scope,
                                     **({"group_size": m.checkpoint_quant_group_size}
                                        if m.checkpoint_quant_group_size else {})}
                                    if m.checkpoint_quant_method else None),
    }


def run(args: argparse.Namespace) -> int:
    from simulator.cost.models import get_model, list_models
    from simulator.cost.precision import SCOPE_WORDS

    if args.action == "list":
        models = [get_model(n) for n in list_models()]
        if args.json:
            print(json.dumps([model_dict(m) for m in models], indent=2))
            return 0
        print(f"{'model':22s} {'params':>9s} {'L':>4s} {'d':>6s} {'heads':>5s} {'kv':>3s} "
              f"{'FFN':>6s} {'vocab':>7s} {'experts':>7s} {'KV KB/tok':>9s}  hf_id")
        for m in models:
            experts = f"{m.experts_per_token}/{m.num_experts}" if m.is_moe else "-"
            print(f"{m.name:22s} {m.num_params / 1e9:8.2f}B {m.num_layers:4d} {m.hidden_size:6d} "
                  f"{m.num_heads:5d} {m.num_kv_heads:3d} {m.ffn_size:6d} {m.vocab_size:7d} "
                  f"{experts:>7s} {m.kv_bytes_per_token('bf16') / 1024:9.0f}  {m.hf_id}")
        return 0
    d = model_dict(get_model(args.name))
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    for k, v in d.items():
        if k == "checkpoint_quantization":
            v = (f"{v['method']}" + (f" in groups of {v['group_size']}" if v.get("group_size", -1) > 0
                                     else "")
                 + SCOPE_WORDS.get(v["scope"], "")
                 if v else "none in its config")
        elif k == "kv_cache_groups":
            v = (f"under vLLM V1: 1 full-attention and {v['sliding_groups']} sliding-window "
                 f"group(s) of {v['layers_per_group']} layers" if v else "one (every layer)")
        elif isinstance(v, dict):
            v = ", ".join(f"{dt} {b / 1e9:.2f} GB" if k == "weight_bytes" else f"{dt} {b:,.0f} B"
                          for dt, b in v.items())
        elif isinstance(v, int) and not isinstance(v, bool) and v > 10**6:
            v = f"{v:,}"
        print(f"{k:24s} {v}")
    return 0
