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

For a model with linear-attention layers (Qwen3-Next, Qwen3.5) the same manager keeps each
request's recurrent state in the pool, one page per group of layers, and vLLM raises the
attention block size until a block's KV page on one layer holds one layer's state
(`HybridAttentionMambaModelConfig`, read in the v0.11.0 wheel; its log line "Setting attention
block size to N tokens"): `cache.block_size` (`mamba_block_size_rule`).
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from simulator.cost.memory_plan import kv_cache_groups, mamba_block_size
from simulator.engines.scenario_model import readable_model
from simulator.engines.version import from_release

KEY = "disable_hybrid_kv_cache_manager"
VLLM_HYBRID_FROM = Version("0.9.2")  # the first release whose API docs list kv_cache_coordinator
VLLM_MAMBA_BLOCK_FROM = Version("0.10.2")  # Qwen3-Next's release, with the block-size rule


def hybrid_kv_cache_rule(data: dict[str, Any], cluster: dict[str, Any], cache: dict[str, Any],
                         scheduler: dict[str, Any], version: Any) -> list[str]:
    """`cache.disable_hybrid_kv_cache_manager` false for a vLLM scenario (`version`; None:
    current) whose model splits into KV cache groups, where the key is not set; the rule used,
    as a note (none for other models)."""
    if KEY in cache or not from_release(version, VLLM_HYBRID_FROM):
        return []
    model = readable_model(data)
    groups = kv_cache_groups(model) if model is not None else None
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


def mamba_block_size_rule(data: dict[str, Any], cluster: dict[str, Any], cache: dict[str, Any],
                          version: Any) -> list[str]:
    """`cache.block_size` for a vLLM scenario whose model has linear-attention layers, where
    the key is not set: vLLM's attention block size for them (`mamba_block_size`), so that
    each request's state takes one block per group of layers as in vLLM."""
    if "block_size" in cache or not from_release(version, VLLM_MAMBA_BLOCK_FROM):
        return []
    model = readable_model(data)
    if model is None or not model.has_linear_attention:
        return []
    tps = ({cluster["pd"][r].get("tp", cluster.get("tp", 1)) for r in ("prefill", "decode")
            if isinstance(cluster["pd"].get(r), dict)} if isinstance(cluster.get("pd"), dict)
           else {cluster.get("tp", 1)})
    if len(tps) != 1:  # (PD pools at two TPs would want two block sizes: left to the user)
        return []
    tp = tps.pop()
    kv = str(cache.get("kv_cache_dtype", "auto"))
    block = mamba_block_size(model, tp, str(data.get("dtype", "bf16")),
                             "fp8" if kv.startswith("fp8") else kv)
    cache["block_size"] = block
    label = f"vLLM {version}" if version else "vLLM"
    return [f"block_size {block}: {label} raises the attention block size until a block's KV "
            f"page holds one linear-attention layer's state ({model.name} at tp={tp}), so each "
            "request's state takes one block per group of layers"]
