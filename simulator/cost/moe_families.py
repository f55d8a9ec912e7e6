"""HF config fields of the mixtures of experts beyond `model_variants.moe_fields`' families, read
into `ModelSpec` fields (`hf_config.hf_config_fields` calls `more_moe_fields`).

Families and the config.json keys each needs (transformers' names; each config class's default
where a release's config.json omits a key):
- OLMoE and FlexOlmo (`olmoe`, `flex_olmo`): as Mixtral, but `num_experts` experts of
  `intermediate_size`; every layer MoE, no shared expert.
- Phi-3.5-MoE (`phimoe`) and IBM Granite MoE (`granitemoe`, `granitemoeshared`): Mixtral's
  keys (`num_local_experts`, `num_experts_per_tok`, `intermediate_size`); Granite's shared
  variant adds one always-on MLP of `shared_intermediate_size` (0: none). Granite 4.0
  (`granitemoehybrid`, whose Mamba-2 layers `hybrid_blocks.py` reads) always has that MLP,
  alone where `num_local_experts` is 0.
- Hunyuan MoE (`hunyuan_v1_moe`, Hunyuan-A13B): `num_experts` and `moe_topk`, each an integer
  or one value per layer (all equal: kvpd prices one expert shape); transformers builds every
  routed expert and the one shared MLP of `intermediate_size`.
- ERNIE-4.5 MoE (`ernie4_5_moe`): `moe_num_experts`, `moe_k`, `moe_intermediate_size`,
  `moe_num_shared_experts` (default 2, x `moe_intermediate_size`); layer i is MoE when
  `moe_layer_start_index` <= i <= `moe_layer_end_index` (-1: the last) and (i + 1) is a multiple
  of `moe_layer_interval`, the others dense of `intermediate_size`; the router keeps a score
  correction per expert as a parameter.
- dots.llm1 (`dots1`), GLM-4.7-Flash (`glm4_moe_lite`, with MLA) and EXAONE MoE
  (`exaone_moe`): DeepSeek's keys (`n_routed_experts` and `n_shared_experts`; EXAONE:
  `num_experts` and `num_shared_experts`) of `moe_intermediate_size`, the dense layers of
  `intermediate_size` where `mlp_layer_types` says "dense", else the first
  `first_k_dense_replace` (dots.llm1: default 0; GLM-4.7-Flash, EXAONE: 1).
A field a family needs and the config lacks is refused, naming the field.
"""

from __future__ import annotations

from typing import Any

from simulator.cost.model_variants import list_field, optional_int, required_int

# family -> (experts key, experts-per-token key, expert width key)
_MIXTRAL_KEYS = {
    "olmoe": ("num_experts", "num_experts_per_tok", "intermediate_size"),
    "flex_olmo": ("num_experts", "num_experts_per_tok", "intermediate_size"),
    "phimoe": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "granitemoe": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "granitemoeshared": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "granitemoehybrid": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "hunyuan_v1_moe": ("num_experts", "moe_topk", "intermediate_size"),
}
# family -> (routed experts key, shared experts key, default of first_k_dense_replace)
_DEEPSEEK_KEYS = {
    "dots1": ("n_routed_experts", "n_shared_experts", 0),
    "glm4_moe_lite": ("n_routed_experts", "n_shared_experts", 1),
    "exaone_moe": ("num_experts", "num_shared_experts", 1),
}
MORE_MOE_FAMILIES = frozenset({*_MIXTRAL_KEYS, *_DEEPSEEK_KEYS, "ernie4_5_moe"})


def _per_layer_int(cfg: dict[str, Any], key: str, where: str, fam: str) -> int:
    """An integer field that a config may also give once per layer (Hunyuan's `num_experts`,
    `moe_topk`), refused unless every layer's is the same."""
    value = cfg.get(key)
    if isinstance(value, list):
        values = list_field(cfg, key, where)
        if len(set(values)) != 1 or values[0] <= 0:
            raise ValueError(f"{where}: field {key!r} lists {values!r}; kvpd prices one expert "
                             "shape for every layer, so the per-layer values must be one "
                             "positive integer")
        return values[0]
    return required_int(cfg, key, where, fam)


def _dense_layers(cfg: dict[str, Any], where: str, first_default: int) -> tuple[int, ...]:
    """Indices of the dense-MLP layers: `mlp_layer_types` "dense" entries where the config
    lists them, else the first `first_k_dense_replace`."""
    L = cfg["num_hidden_layers"]  # (validated by hf_config_fields)
    types = list_field(cfg, "mlp_layer_types", where, str)
    if types:
        if len(types) != L or not set(types) <= {"dense", "sparse"}:
            raise ValueError(f"{where}: field 'mlp_layer_types' must list {L} entries of "
                             f"'dense' / 'sparse', got {types!r}")
        return tuple(i for i, t in enumerate(types) if t == "dense")
    first = optional_int(cfg, "first_k_dense_replace", where, first_default)
    return tuple(range(min(first, L)))


def _ernie_dense_layers(cfg: dict[str, Any], where: str) -> tuple[int, ...]:
    """ERNIE-4.5's dense layers: those outside `moe_layer_start_index`..`moe_layer_end_index`
    or off the `moe_layer_interval`, as transformers' Ernie4_5_MoeDecoderLayer decides."""
    L = cfg["num_hidden_layers"]
    start = optional_int(cfg, "moe_layer_start_index", where, 1)
    end = cfg.get("moe_layer_end_index", -1)
    if end is None:
        end = -1
    if isinstance(end, bool) or not isinstance(end, int) or end < -1:
        raise ValueError(f"{where}: field 'moe_layer_end_index' must be a layer index or -1 (the "
                         f"last layer), got {end!r}")
    end = L - 1 if end == -1 else end
    interval = optional_int(cfg, "moe_layer_interval", where, 1)
    if interval == 0:
        raise ValueError(f"{where}: field 'moe_layer_interval' must be a positive integer, got 0")
    return tuple(i for i in range(L) if not (start <= i <= end and (i + 1) % interval == 0))


def more_moe_fields(cfg: dict[str, Any], fam: str, where: str) -> dict[str, Any]:
    """ModelSpec fields of the experts of family `fam` (empty for the families it does not
    read)."""
    if fam not in MORE_MOE_FAMILIES:
        return {}
    if fam == "granitemoehybrid" and cfg.get("num_local_experts") == 0:
        # Granite 4.0's dense releases: the shared MLP is each layer's MLP
        return {"ffn_size": required_int(cfg, "shared_intermediate_size", where, fam)}
    if fam in _MIXTRAL_KEYS:
        experts_key, k_key, ffn_key = _MIXTRAL_KEYS[fam]
        out: dict[str, Any] = {"num_experts": _per_layer_int(cfg, experts_key, where, fam),
                               "experts_per_token": _per_layer_int(cfg, k_key, where, fam),
                               "ffn_size": required_int(cfg, ffn_key, where, fam)}
        shared = (out["ffn_size"] if fam == "hunyuan_v1_moe"
                  else optional_int(cfg, "shared_intermediate_size", where)
                  if fam == "granitemoeshared"
                  else required_int(cfg, "shared_intermediate_size", where, fam)
                  if fam == "granitemoehybrid" else 0)
        if shared:
            out.update(num_shared_experts=1, shared_expert_ffn_size=shared)
        dense: tuple[int, ...] = ()
    elif fam == "ernie4_5_moe":
        if cfg.get("use_bias"):
            raise ValueError(f"{where}: field 'use_bias' is true; kvpd prices ERNIE-4.5's MoE "
                             "models without biases, as every release is (use_bias false)")
        out = {"num_experts": required_int(cfg, "moe_num_experts", where, fam),
               "experts_per_token": required_int(cfg, "moe_k", where, fam),
               "ffn_size": required_int(cfg, "moe_intermediate_size", where, fam),
               "router_bias": True}
        shared = optional_int(cfg, "moe_num_shared_experts", where, 2)
        out.update(num_shared_experts=shared, shared_expert_ffn_size=shared * out["ffn_size"])
        dense = _ernie_dense_layers(cfg, where)
    else:
        experts_key, shared_key, first_default = _DEEPSEEK_KEYS[fam]
        out = {"num_experts": required_int(cfg, experts_key, where, fam),
               "experts_per_token": required_int(cfg, "num_experts_per_tok", where, fam),
               "ffn_size": required_int(cfg, "moe_intermediate_size", where, fam)}
        shared = optional_int(cfg, shared_key, where)
        out.update(num_shared_experts=shared, shared_expert_ffn_size=shared * out["ffn_size"])
        dense = _dense_layers(cfg, where, first_default)
    if dense:
        out.update(dense_layer_ids=dense, num_dense_layers=len(dense),
                   dense_ffn_size=required_int(cfg, "intermediate_size", where, fam))
    if out["experts_per_token"] > out["num_experts"]:
        raise ValueError(f"{where}: {fam}'s experts per token ({out['experts_per_token']}) "
                         f"exceed its {out['num_experts']} experts")
    return out
