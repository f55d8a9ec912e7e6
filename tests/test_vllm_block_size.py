"""The block sizes the `vllm` preset takes from vLLM's own platform code: forced for its MLA
kernels (read in the 0.7.3, 0.8.5, 0.10.0 and 0.11.0 wheels)."""

from __future__ import annotations

import pytest

from simulator.scenario import scenario_from_dict


def _scenario(model: str, hardware: str, version: str | None, **cache) -> object:
    engine = {"name": "vllm", **({"version": version} if version else {})}
    return scenario_from_dict({"model": model, "hardware": hardware, "dtype": "fp8",
                               "cluster": {"tp": 8}, "engine": engine,
                               **({"cache": cache} if cache else {})})


@pytest.mark.parametrize(("model", "hardware", "version", "block"), [
    ("deepseek-v3", "h200-sxm", "0.11.0", 64),  # FlashMLA
    ("deepseek-v3", "h200-sxm", "0.8.5", 64),
    ("deepseek-v3", "h200-sxm", None, 64),
    ("deepseek-v3", "h200-sxm", "0.7.3", 16),  # before FlashMLA's forcing
    ("deepseek-v3", "b200", "0.11.0", 128),  # CUTLASS MLA, Blackwell's default
    ("deepseek-v3", "b200", "0.10.0", 16),  # (FlashMLA did not run on Blackwell then)
    ("deepseek-v3.2", "b200", "0.13.0", 64),  # FlashMLA sparse on any part
    ("deepseek-v3", "mi300x", "0.11.0", 16),  # ROCm: left alone
    ("llama-3.1-70b", "h200-sxm", "0.11.0", 16),  # no MLA
])
def test_vllm_forces_its_mla_kernels_block_size(model, hardware, version, block):
    sc = _scenario(model, hardware, version)
    assert sc.cache.block_size == block
    assert any(n.startswith(f"block_size {block}") for n in sc.engine_notes) == (block != 16)


def test_a_block_size_the_scenario_gives_is_kept():
    assert _scenario("deepseek-v3", "h200-sxm", "0.11.0", block_size=32).cache.block_size == 32
