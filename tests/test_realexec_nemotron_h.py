"""Nemotron-H (Mamba-2 hybrids) in the real executor: its config checks and what its blocks hold.

Greedy token identity with `transformers` runs in the shared correctness matrix
(tests/realexec_reference.py FAMILIES, LINEAR_FAMILIES)."""

from __future__ import annotations

import pytest

from realexec.engine.configs import builtin_config
from realexec.engine.model_loader import load_model
from realexec.engine.paged_model import PagedCausalLM

NAME = "tiny-nemotron-h"


def test_only_attention_blocks_cache_kv_and_only_mamba_blocks_hold_a_state():
    pm = PagedCausalLM(load_model(NAME, dtype="fp32", device="cpu", seed=0).model)
    types = builtin_config(NAME)["layers_block_type"]
    assert pm.linear == [t == "linear_attention" for t in types]
    assert pm.kv_layers == [t == "full_attention" for t in types]
    assert pm.num_kv_layers == 2 and pm.kv_index[2] == 0 and pm.kv_index[5] == 1
    assert pm.head_dim == 16 and pm.num_kv_heads == 2


@pytest.mark.parametrize("field", ["num_key_value_heads", "head_dim", "mamba_num_heads",
                                   "mamba_head_dim", "ssm_state_size", "n_groups",
                                   "conv_kernel", "intermediate_size", "n_routed_experts",
                                   "num_experts_per_tok", "moe_intermediate_size",
                                   "moe_shared_expert_intermediate_size"])
def test_a_config_missing_a_field_its_blocks_need_is_refused_naming_it(field):
    """NemotronHConfig would fill in its 8B-class defaults, a different model than the file's."""
    cfg = builtin_config(NAME)
    del cfg[field]
    with pytest.raises(ValueError, match=f"Nemotron-H config is missing field '{field}'"):
        load_model(cfg)


def test_block_fields_are_needed_only_by_the_blocks_present():
    cfg = builtin_config(NAME)
    cfg["layers_block_type"] = ["linear_attention", "full_attention", "mlp"]
    for field in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "moe_shared_expert_intermediate_size"):
        del cfg[field]
    assert PagedCausalLM(load_model(cfg, seed=0).model).num_kv_layers == 1


def test_the_older_field_names_of_the_first_releases_are_read():
    """Nemotron-H-56B's config.json spells `mamba_n_groups`-style names and
    `attention_head_dim` (which NemotronHConfig itself ignores, building 128-wide heads)."""
    cfg = builtin_config(NAME)
    cfg["hybrid_override_pattern"] = "ME*-M*E"
    del cfg["layers_block_type"]
    cfg["mamba_n_groups"] = cfg.pop("n_groups")
    cfg["mamba_d_conv"] = cfg.pop("conv_kernel")
    cfg["attention_head_dim"] = cfg.pop("head_dim")
    loaded = load_model(cfg, seed=0)
    c = loaded.config
    assert (c.n_groups, c.conv_kernel, c.head_dim) == (2, 4, 16)
    assert loaded.num_params == load_model(NAME, seed=0).num_params


def test_a_config_without_its_block_pattern_is_refused():
    cfg = builtin_config(NAME)
    del cfg["layers_block_type"]
    with pytest.raises(ValueError, match="needs its block pattern"):
        load_model(cfg)
    cfg["hybrid_override_pattern"] = "M*X"
    with pytest.raises(ValueError, match="string of M, \\*, -, E"):
        load_model(cfg)


def test_a_block_list_is_checked_name_by_name():
    cfg = builtin_config(NAME)
    cfg["layers_block_type"][1] = "attn"
    with pytest.raises(ValueError, match="field 'layers_block_type' must list the blocks.*'attn'"):
        load_model(cfg)
    cfg["layers_block_type"] = ["mamba", "moe", "attention", "mlp", "mamba", "attention", "moe"]
    assert load_model(cfg, seed=0).config.layer_types == builtin_config(NAME)["layers_block_type"]
