"""Nemotron-H's block pattern (`NemotronHForCausalLM`: Nemotron-H, Nemotron-Nano-2, Nemotron-3
Nano, Super and Ultra) read into `ModelSpec` fields.

A Nemotron-H block is one norm and one mixer: Mamba-2, attention, an MLP or a mixture of
experts (transformers' `NemotronHBlock`). kvpd prices a layer as a mixer (attention or a
linear mixer) followed by at most one MLP, so each MLP or MoE block is paired with the mixer
block before it, and a mixer followed by another mixer becomes a layer with no MLP
(`mlp_free_layer_ids`). The pairing keeps every block's weights, FLOPs, norms and
all-reduces; only where a pipeline cut falls can differ by a block.

config.json keys (transformers' `NemotronHConfig`): the pattern as `layers_block_type` (or
`layer_types`: "mamba" / "linear_attention", "attention" / "full_attention", "mlp", "moe") or
`hybrid_override_pattern` (M, *, -, E); Mamba-2's `mamba_num_heads` x `mamba_head_dim`,
`n_groups` x `ssm_state_size` for B and C, `conv_kernel` and `mamba_ssm_cache_dtype`;
attention's `num_attention_heads`, `num_key_value_heads` and `head_dim` (older releases:
`attention_head_dim`); the MLP's `intermediate_size` (squared ReLU, not gated); the
experts' `n_routed_experts`, `num_experts_per_tok`, `moe_intermediate_size`,
`moe_shared_expert_intermediate_size` (one shared MLP of that width) and, for LatentMoE,
`moe_latent_size`. The multi-token-prediction layers are not priced (as DeepSeek's).

IBM Granite 4.0's hybrids (`GraniteMoeHybridForCausalLM`, `granitemoehybrid`) are read here too
(`granite_hybrid_fields`): each layer is one mixer, Mamba-2 or attention as `layer_types` says
("mamba" / "linear_attention", "attention" / "full_attention"), then an MLP: `num_local_experts`
routed experts of `intermediate_size` (top `num_experts_per_tok`) beside one shared MLP of
`shared_intermediate_size`, or that MLP alone when `num_local_experts` is 0 (the dense
releases). Mamba-2 is `mamba_n_heads` heads of `mamba_d_head` ("auto": `mamba_expand` x
hidden / heads) with `mamba_n_groups` x `mamba_d_state` for B and C and a `mamba_d_conv`-tap
convolution.
"""

from __future__ import annotations

from typing import Any

from simulator.cost.model_variants import list_field, optional_int, required_int

FAMILY = "nemotron_h"
PATTERN_CHARS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
BLOCK_NAMES = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
               "full_attention": "attention", "mlp": "mlp", "moe": "moe"}
STATE_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def block_types(cfg: dict[str, Any], where: str) -> list[str]:
    """The blocks in order, each "mamba", "attention", "mlp" or "moe"."""
    for key in ("layers_block_type", "layer_types"):
        if cfg.get(key) is not None:
            names = list_field(cfg, key, where, str)
            bad = sorted(set(names) - set(BLOCK_NAMES))
            if bad or not names:
                raise ValueError(f"{where}: field {key!r} must list the blocks, each one of "
                                 f"{', '.join(sorted(BLOCK_NAMES))}; got {bad or names!r}")
            return [BLOCK_NAMES[n] for n in names]
    pattern = cfg.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern or set(pattern) - set(PATTERN_CHARS):
        raise ValueError(f"{where}: {FAMILY} config needs its block pattern: "
                         "'layers_block_type' (a list of mamba / attention / mlp / moe) or "
                         f"'hybrid_override_pattern' (a string of M, *, -, E); got {pattern!r}")
    return [PATTERN_CHARS[c] for c in pattern]


def pair_blocks(blocks: list[str], where: str) -> tuple[int, list[int], list[int], list[int]]:
    """(layers, indices of the linear (Mamba) layers, of the layers whose MLP is dense, of the
    layers with no MLP): each MLP / MoE block joins the mixer block before it."""
    mixers: list[str] = []
    mlp_of: dict[int, str] = {}
    for i, b in enumerate(blocks):
        if b in ("mamba", "attention"):
            mixers.append(b)
        elif not mixers or len(mixers) - 1 in mlp_of:
            raise ValueError(f"{where}: block {i} ({b}) follows no mixer block of its own; kvpd "
                             "prices a layer as one mixer (mamba / attention) and at most one "
                             "MLP after it")
        else:
            mlp_of[len(mixers) - 1] = b
    if "attention" not in mixers:
        raise ValueError(f"{where}: the pattern has no attention block; kvpd needs at least one "
                         "to hold the KV cache")
    n = len(mixers)
    return (n, [i for i in range(n) if mixers[i] == "mamba"],
            [i for i in range(n) if mlp_of.get(i) == "mlp"],
            [i for i in range(n) if i not in mlp_of])


def mamba2_fields(layers: int, heads: int, head_dim: int, groups: int, state: int, kernel: int,
                  state_dtype: str = "") -> dict[str, Any]:
    """ModelSpec fields of `layers` Mamba-2 mixers: `heads` of `head_dim` values, `groups` B/C
    groups of `state` dims, a `kernel`-tap convolution, the state kept in `state_dtype` ("":
    the model's)."""
    return {"num_linear_layers": layers, "linear_kind": "mamba2", "linear_key_heads": groups,
            "linear_key_head_dim": state, "linear_value_heads": heads,
            "linear_value_head_dim": head_dim, "linear_conv_kernel": kernel,
            "linear_state_dtype": state_dtype}


def nemotron_h_fields(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """ModelSpec fields of a Nemotron-H config (see the module docstring), `num_layers` and
    the attention shape included."""
    blocks = block_types(cfg, where)
    layers, linear, dense, free = pair_blocks(blocks, where)
    heads = required_int(cfg, "num_attention_heads", where, FAMILY)
    head_dim = cfg.get("head_dim") or cfg.get("attention_head_dim")
    state = cfg.get("mamba_ssm_cache_dtype")
    if state is not None and state not in STATE_DTYPES:
        raise ValueError(f"{where}: field 'mamba_ssm_cache_dtype' must be one of "
                         f"{', '.join(STATE_DTYPES)}, got {state!r}")
    out: dict[str, Any] = {
        "num_layers": layers, "num_heads": heads,
        "num_kv_heads": optional_int(cfg, "num_key_value_heads", where, heads) or heads,
        "head_dim": (head_dim if isinstance(head_dim, int) and head_dim > 0
                     else required_int(cfg, "hidden_size", where, FAMILY) // heads),
        "gated_mlp": False,  # squared-ReLU up / down MLPs and experts
        "mlp_free_layer_ids": tuple(free),
        **mamba2_fields(len(linear), required_int(cfg, "mamba_num_heads", where, FAMILY),
                        required_int(cfg, "mamba_head_dim", where, FAMILY),
                        required_int(cfg, "n_groups", where, FAMILY),
                        required_int(cfg, "ssm_state_size", where, FAMILY),
                        required_int(cfg, "conv_kernel", where, FAMILY),
                        STATE_DTYPES.get(state or "", "")),
    }
    if "moe" not in blocks:
        out["ffn_size"] = required_int(cfg, "intermediate_size", where, FAMILY)
        return out
    out.update(num_experts=required_int(cfg, "n_routed_experts", where, FAMILY),
               experts_per_token=required_int(cfg, "num_experts_per_tok", where, FAMILY),
               ffn_size=required_int(cfg, "moe_intermediate_size", where, FAMILY),
               moe_latent_size=optional_int(cfg, "moe_latent_size", where))
    shared = optional_int(cfg, "moe_shared_expert_intermediate_size", where)
    if shared:
        out.update(num_shared_experts=1, shared_expert_ffn_size=shared)
    if dense:
        out.update(dense_layer_ids=tuple(dense), num_dense_layers=len(dense),
                   dense_ffn_size=required_int(cfg, "intermediate_size", where, FAMILY))
    if out["experts_per_token"] > out["num_experts"]:
        raise ValueError(f"{where}: num_experts_per_tok={out['experts_per_token']} exceeds the "
                         f"{out['num_experts']} experts")
    return out


GRANITE_HYBRID = "granitemoehybrid"
# transformers' GraniteMoeHybridConfig defaults for the Mamba-2 keys a release may omit
GRANITE_MAMBA_DEFAULTS = {"mamba_expand": 2, "mamba_n_heads": 128, "mamba_n_groups": 1,
                          "mamba_d_state": 256, "mamba_d_conv": 4}


def granite_hybrid_fields(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """ModelSpec fields of a Granite 4.0 hybrid's Mamba-2 mixers (see the module docstring);
    its experts are read by `moe_families.more_moe_fields`, its attention as any decoder's."""
    L = cfg["num_hidden_layers"]  # (validated by hf_config_fields)
    names = list_field(cfg, "layer_types", where, str) or ["mamba"] * L
    kinds = [BLOCK_NAMES.get(n) for n in names]
    if len(kinds) != L or not set(kinds) <= {"mamba", "attention"}:
        raise ValueError(f"{where}: field 'layer_types' must list {L} entries of 'mamba' / "
                         f"'attention' (or 'linear_attention' / 'full_attention'), got {names!r}")
    if "attention" not in kinds:
        raise ValueError(f"{where}: every one of the {L} layers is Mamba-2 ('layer_types' "
                         "names no attention layer); kvpd needs at least one to hold the KV cache")
    for key, want in (("mamba_proj_bias", False), ("mamba_conv_bias", True)):
        if cfg.get(key, want) is not want:
            raise ValueError(f"{where}: field {key!r} is {cfg.get(key)!r}; kvpd prices Granite "
                             f"4.0's Mamba-2 layers as released ({key}: {str(want).lower()})")
    m = {k: optional_int(cfg, k, where, v) for k, v in GRANITE_MAMBA_DEFAULTS.items()}
    inner = m["mamba_expand"] * required_int(cfg, "hidden_size", where, GRANITE_HYBRID)
    d_head = cfg.get("mamba_d_head", "auto")
    if d_head in ("auto", None):
        d_head = inner // max(m["mamba_n_heads"], 1)
    if isinstance(d_head, bool) or not isinstance(d_head, int) or \
            d_head * m["mamba_n_heads"] != inner:
        raise ValueError(f"{where}: mamba_n_heads ({m['mamba_n_heads']}) x mamba_d_head "
                         f"({cfg.get('mamba_d_head')!r}) must equal mamba_expand x hidden_size "
                         f"({inner})")
    linear = sum(k == "mamba" for k in kinds)
    return (mamba2_fields(linear, m["mamba_n_heads"], d_head, m["mamba_n_groups"],
                          m["mamba_d_state"], m["mamba_d_conv"]) if linear else {})
