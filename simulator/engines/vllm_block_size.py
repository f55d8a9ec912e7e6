"""The KV block size vLLM forces for multi-head latent attention (DeepSeek-V2/V3, Kimi K2).

vLLM's CUDA platform (`CudaPlatformBase.check_and_update_config`) sets the block size its
default MLA kernel needs, whatever `--block-size` says, read in the released wheels:
- 0.7.3: none (16 tokens);
- 0.8.5 and 0.10.0: 64 where FlashMLA runs (Hopper; `is_flashmla_supported`);
- 0.11.0: 128 on Blackwell (CUTLASS MLA, its default there), 64 on Hopper (FlashMLA), and 64
  for DeepSeek Sparse Attention (FlashMLA sparse) on any part.
Earlier Ampere parts run Triton MLA at 16 tokens. Versions between the ones read follow the
next one read (FlashMLA's forcing landed after 0.7.3, in 0.8.0; 0.10.1-0.10.2 are taken as
0.10.0). ROCm is left alone (its AITER MLA wants block size 1, off by default).
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from simulator.defaults import DEFAULT_HARDWARE
from simulator.engines.scenario_model import readable_model
from simulator.engines.version import from_release

FLASHMLA_FROM = Version("0.8.0")  # the first release after FlashMLA's forcing (0.7.3: none)
CUTLASS_MLA_DEFAULT_FROM = Version("0.11.0")  # Blackwell's default MLA kernel (0.10.0: none)


def mla_block_size_rule(data: dict[str, Any], cache: dict[str, Any], version: Any) -> list[str]:
    """`cache.block_size` for a vLLM scenario (`version`; None: current) of an MLA model on
    NVIDIA, where the key is not set: the size vLLM forces for its MLA kernel there."""
    from simulator.cost.hardware import scenario_accelerator
    from simulator.cost.kernels import kernel_profile

    if "block_size" in cache or not from_release(version, FLASHMLA_FROM):
        return []
    model = readable_model(data)
    if model is None or not model.is_mla:
        return []
    try:
        acc = scenario_accelerator(data.get("hardware", DEFAULT_HARDWARE))
    except (ValueError, OSError):  # the scenario check names what it cannot read
        return []
    if acc.vendor != "nvidia":
        return []
    arch = getattr(kernel_profile(acc), "arch", "")
    current = from_release(version, CUTLASS_MLA_DEFAULT_FROM)
    if model.is_sparse_attention and current:
        block, kernel = 64, "FlashMLA sparse"
    elif arch == "blackwell" and current:
        block, kernel = 128, "CUTLASS MLA"
    elif arch == "hopper":
        block, kernel = 64, "FlashMLA"
    else:
        return []
    cache["block_size"] = block
    label = f"vLLM {version}" if version else "vLLM"
    return [f"block_size {block}: {label} forces it for {kernel}, its MLA kernel for "
            f"{model.name} on {acc.name} ({arch})"]
