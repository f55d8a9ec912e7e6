"""The simulator reads every tiny config the real engine runs as the engine builds it: the same
parameters (so weight bytes and the memory plan agree) and the same sliding layers (so both
backends free the same KV blocks)."""

from __future__ import annotations

import pytest

from realexec.engine.configs import TINY, builtin_config
from realexec.engine.family_rules import layer_windows
from realexec.engine.model_loader import load_model
from simulator.cost.models import ModelSpec

# Qwen2 / Qwen3 / Qwen2-MoE / Qwen3-MoE slide by their own rules when `use_sliding_window`
WINDOWED = {
    "qwen2-sw": ("tiny-qwen2", {"num_hidden_layers": 4, "max_window_layers": 1}),
    "qwen3-sw": ("tiny-qwen3", {"num_hidden_layers": 4, "max_window_layers": 1}),
    "qwen2-moe-sw": ("tiny-qwen2-moe", {"num_hidden_layers": 4, "max_window_layers": 3}),
    "qwen3-moe-sw": ("tiny-qwen3-moe", {}),
}
# text-only in the simulator: the multimodal release's vision tower is not a serving cost it
# prices (its text model is checked as tiny-gemma3)
TEXT_ONLY = {"tiny-gemma3-mm"}


def _config(name: str) -> dict:
    if name in WINDOWED:
        base, patch = WINDOWED[name]
        return {**builtin_config(base), "use_sliding_window": True, "sliding_window": 10,
                **patch}
    return builtin_config(name)


@pytest.mark.parametrize("name", [n for n in TINY if n not in TEXT_ONLY])
def test_the_simulator_counts_every_parameter_the_engine_builds(name):
    loaded = load_model(name, dtype="fp32", device="cpu", seed=0)
    assert ModelSpec.from_hf_config(builtin_config(name)).num_params == sum(
        p.numel() for p in loaded.model.parameters())


@pytest.mark.parametrize("name", [*TINY, *WINDOWED])
def test_the_simulator_slides_the_layers_the_engine_slides(name):
    cfg = _config(name)
    hf_cfg = load_model(cfg, dtype="fp32", device="cpu", seed=0).model.config
    windows = layer_windows(getattr(hf_cfg, "text_config", None) or hf_cfg)
    spec = ModelSpec.from_hf_config(cfg)
    sliding = [w for w in windows if w]
    assert spec.num_sliding_layers == len(sliding)
    assert {spec.sliding_window} == (set(sliding) or {0})


@pytest.mark.parametrize("name", [n for n in TINY if n not in TEXT_ONLY
                                  and ModelSpec.from_hf_config(builtin_config(n))
                                  .has_linear_attention])
def test_the_simulator_sizes_each_requests_recurrent_state_as_the_engine(name):
    """Gated DeltaNet and Mamba-2 layers: the bytes of one request's state (its state matrices
    and convolution inputs over all linear layers), fp32 as the engine runs them here."""
    import torch

    from realexec.engine.kv_cache import KVCacheSpec
    from realexec.engine.linear_attention import state_blocks
    from realexec.engine.paged_model import PagedCausalLM

    model = PagedCausalLM(load_model(name, dtype="fp32", device="cpu", seed=0).model)
    four_bytes = KVCacheSpec(num_layers=1, num_kv_heads=1, head_dim=1, block_size=1,
                             dtype=torch.float32, num_planes=1)  # a "block" of 4 bytes
    spec = ModelSpec.from_hf_config(builtin_config(name))
    assert 4 * state_blocks(model, four_bytes) == spec.linear_state_bytes("fp32") > 0
