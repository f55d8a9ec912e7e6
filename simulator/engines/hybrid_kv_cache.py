"""Whether vLLM gives a model's sliding-window layers block tables of their own.

vLLM V1's hybrid KV cache manager (the `KVCacheCoordinator` of `vllm/v1/core`, first released
in 0.9.2) splits the layers of a model that mixes sliding-window and full-attention layers
into KV cache groups, each with its own block table: the sliding groups hold only the blocks
their window and a step's new tokens read (`simulator.cost.memory_plan.kv_cache_groups`,
`simulator.core.kv_cache_manager`). It is on by default; vLLM turns it off (read in the
v0.11.0 wheel, `VllmConfig.__post_init__`) with a KV connector (PD disaggregation), with KV
events, and by default for chunked local attention (Llama 4, which kvpd leaves out of the
groups anyway). `--disable-hybrid-kv-cache-manager` is the scenario's
`cache.disable_hybrid_kv_cache_manager`.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from simulator.cost.memory_plan import kv_cache_groups
from simulator.engines.scenario_model import raw_model
from simulator.engines.version import parse_version

KEY = "disable_hybrid_kv_cache_manager"
VLLM_HYBRID_FROM = Version("0.9.2")  # the first release whose API docs list kv_cache_coordinator


def hybrid_kv_cache_rule(data: dict[str, Any], cluster: dict[str, Any], cache: dict[str, Any],
                         scheduler: dict[str, Any], version: Any) -> list[str]:
    """`cache.disable_hybrid_kv_cache_manager` false for a vLLM scenario (`version`; None:
    current) whose model splits into KV cache groups, where the key is not set; the rule used,
    as a note (none for other models)."""
    if KEY in cache:
        return []
    v = parse_version(version) if version else None
    if v is not None and v < VLLM_HYBRID_FROM:
        return []
    try:
        model = raw_model(data)
    except (ValueError, OSError):  # the scenario check names a model it cannot read
        return []
    groups = kv_cache_groups(model)
    if groups is None:
        return []
    label = f"vLLM {version}" if version else "vLLM"
    if "pd" in cluster:
        return [f"{KEY} (one block table for every layer): {label} turns its hybrid KV cache "
                f"manager off with a KV connector, so {model.name}'s sliding-window layers hold "
                "the whole context in PD pools"]
    if cache.get("swap_space_gb") or scheduler.get("preemption_mode") == "swap":
        return []  # (V1 does not swap: the scenario is not V1's)
    cache[KEY] = False
    layers, sliding = groups
    return [f"{KEY} false: {label} (V1) gives {model.name}'s sliding-window layers block "
            f"tables of their own (its hybrid KV cache manager): one full-attention and "
            f"{sliding} sliding-window group{'s' if sliding > 1 else ''} of {layers} layers, "
            f"the sliding ones holding the {model.sliding_window:,}-token window"]
