"""The replica `kvpd estimate` prices one step on: from its flags (`--model`, `--hardware`,
parallelism, precision, kernels, memory) or from a scenario (`--scenario`), as `kvpd simulate`
builds it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from simulator.cost.parallel import check_a2a, check_dp_ep

# the flags a scenario sets (its model, hardware, parallelism, precision, kernels, memory)
SCENARIO_SETS = ("model", "hf_overrides", "hardware", "tp", "pp", "ep", "moe_a2a_backend",
                 "fused_moe_config", "dp_attention", "attention_backend",
                 "prefill_graph_max_tokens", "host_request_s", "async_scheduling", "dtype",
                 "quantization", "group_size", "quantization_scope", "kv_cache_dtype",
                 "hybrid_kv_cache", "params", "gpu_memory_utilization",
                 "free_gpu_memory_fraction", "mem_fraction_static")


def parse_hardware(text: str) -> str | dict:
    """A catalog name, or an inline mapping when the text starts with '{'."""
    if not text.strip().startswith("{"):
        return text
    import yaml

    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"--hardware {text!r}: not a YAML mapping ({exc})") from None
    if not isinstance(spec, dict):
        raise ValueError(f"--hardware {text!r}: expected a mapping such as '{{base: h100-sxm}}'")
    return spec


@dataclass
class Setup:
    """What one step is priced on: the replica's model, GPU, parallelism, cost model(s) and
    memory plan, from the flags or from a scenario (`engine_notes`: its engine's rules)."""

    model: Any
    accelerator: Any
    tp: int
    pp: int
    ep: int
    cost_model: Any  # the replica's (with data-parallel attention: its expert side's)
    dp_cost: Any  # DPAttentionCost with data-parallel attention, else None
    plan: Any  # MemoryPlan (one attention rank's with data-parallel attention)
    dtype: str
    quantization: dict | None
    engine_notes: list[str] = field(default_factory=list)
    origin: str = ""  # "scenario NAME, POOL pool" where it came from a scenario


def setup_from_flags(args: argparse.Namespace) -> Setup:
    """The replica the flags describe."""
    from simulator.cost.costmodel import CostModel
    from simulator.cost.dp_attention import DPAttentionCost
    from simulator.cost.eager_dispatch import EagerDispatch
    from simulator.cost.hardware import get_accelerator
    from simulator.cost.memory_plan import plan_memory
    from simulator.cost.models import get_model
    from simulator.cost.params import CostParams

    if not args.model or not args.hardware:
        raise ValueError("give --model and --hardware, or --scenario FILE")
    model = get_model(args.model, args.hf_overrides)
    acc = get_accelerator(parse_hardware(args.hardware))
    params = (CostParams.load(args.params, device=acc.name, model=model.name)
              if args.params else None)
    quant = None
    if args.quantization or args.group_size is not None or args.quantization_scope:
        quant = {"method": args.quantization} if args.quantization else {}
        if args.group_size is not None:
            quant["group_size"] = args.group_size
        if args.quantization_scope:
            quant["scope"] = args.quantization_scope
    check_a2a(args.moe_a2a_backend, args.ep, args.tp, a2a="--moe-a2a-backend", ep_key="--ep",
              tp_key="--tp")
    if args.fused_moe_config == "legacy_default" and not model.is_moe:
        raise ValueError(f"--fused-moe-config legacy_default: {model.name} is a dense model "
                         "(the fallback prices MoE expert kernels); drop the flag")
    dp = args.dp_attention
    if dp and (args.tp < 2 or args.pp != 1 or not model.is_moe):
        raise ValueError(f"--dp-attention needs an MoE model, --tp >= 2 and --pp 1; got "
                         f"{model.name} ({'MoE' if model.is_moe else 'dense'}), tp={args.tp}, "
                         f"pp={args.pp}")
    if dp:
        check_dp_ep(args.ep, args.tp, dp="--dp-attention", ep_key="--ep", tp_key="--tp")
    if args.host_request_s < 0:
        raise ValueError(f"--host-request-s must be >= 0 s, got {args.host_request_s}")
    if args.prefill_graph_max_tokens is not None and args.prefill_graph_max_tokens < 0:
        raise ValueError("--prefill-graph-max-tokens must be >= 0 (0: every prompt step runs "
                         f"outside CUDA graphs), got {args.prefill_graph_max_tokens}")
    eager = (None if args.prefill_graph_max_tokens is None
             else EagerDispatch(args.prefill_graph_max_tokens))

    def cost_model(tp: int, ep: int) -> CostModel:
        return CostModel(model, acc, dtype=args.dtype, tp=tp, pp=args.pp, params=params,
                         kv_cache_dtype=args.kv_cache_dtype, quantization=quant, ep=ep,
                         attention_backend=args.attention_backend,
                         moe_a2a_backend=args.moe_a2a_backend,
                         fused_moe_config=args.fused_moe_config, eager=eager,
                         host_request_s=args.host_request_s,
                         async_scheduling=args.async_scheduling)

    cm = cost_model(args.tp, args.ep)
    plan = plan_memory(model, acc, args.dtype, args.tp, args.pp,
                       gpu_memory_utilization=args.gpu_memory_utilization,
                       kv_cache_dtype=args.kv_cache_dtype, quantization=quant, ep=args.ep,
                       free_gpu_memory_fraction=args.free_gpu_memory_fraction,
                       mem_fraction_static=args.mem_fraction_static, dp_attention=dp,
                       hybrid_kv_cache=args.hybrid_kv_cache)
    return Setup(model, acc, args.tp, args.pp, args.ep, cm,
                 DPAttentionCost(cost_model(1, 1), cm) if dp else None, plan, args.dtype, quant)


def setup_from_scenario(args: argparse.Namespace) -> Setup:
    """The replica `kvpd simulate` builds for the scenario's pool (`--pool`)."""
    from simulator.cluster.cluster import plan_pool, pool_specs
    from simulator.scenario import load_scenario

    given = [d for d, default in args.flag_defaults.items() if getattr(args, d) != default]
    if given:
        flags = ", ".join("--" + d.replace("_", "-") for d in given)
        raise ValueError(f"--scenario sets the model, hardware, parallelism, precision, kernels "
                         f"and memory: drop {flags} (change the scenario's keys with --set "
                         "KEY=VALUE)")
    sc = load_scenario(args.scenario, args.overrides)
    pools = dict(pool_specs(sc))
    role = args.pool or ("colocated" if "colocated" in pools else None)
    if role is None:
        raise ValueError(f"{args.scenario}: a PD scenario has a prefill and a decode pool; "
                         "give --pool prefill or --pool decode")
    if role not in pools:
        raise ValueError(f"{args.scenario}: --pool {role}: the scenario's pools are "
                         f"{', '.join(pools)}")
    model = sc.model_spec()
    spec = pools[role]
    plan = plan_pool(sc, model, spec, role)
    cm = plan.dp_cost.experts if plan.dp_cost is not None else plan.cost_model
    return Setup(model, plan.accelerator, spec.tp, spec.pp, spec.ep, cm, plan.dp_cost,
                 plan.memory, sc.dtype, sc.quantization_mapping(), list(sc.engine_notes),
                 f"scenario {sc.name}, {role} pool")
