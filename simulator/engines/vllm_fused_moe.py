"""Which fused-MoE kernel config vLLM runs: a tuned one, or its fallback before v0.17.

vLLM's Triton `fused_moe` looks each MoE shape up in `fused_moe/configs` as
`E={experts on the GPU},N={intermediate per GPU},device_name={GPU}[,dtype=...]` and, with no
such file, runs `get_default_config`. Until v0.16 that fallback was one tile for all large
batches (BLOCK_SIZE_M 64, N 64, K 32, no num_warps / num_stages): vLLM PR #34846 replaced it
in v0.17.0 ("many-expert models see up to 2x speedup at large batch size"), read in the
v0.16.0 and v0.17.0 wheels. kvpd prices that fallback as `cluster.fused_moe_config:
legacy_default` (kernels.yaml `grouped_gemm.legacy_default`, fitted to vLLM PR #24700's
measured fallback: `python bench/diagnostics/moe_kernels.py`).

The `vllm` engine preset sets it (`vllm_fused_moe_rule`) for a version before 0.17 when the
model's 16-bit experts have no tuned file for the GPU in that version
(`simulator/catalog/vllm_fused_moe_configs.json`, from the released wheels). Quantized
experts are left alone: block-FP8's fallback set its warps and stages all along, and the
other methods run other kernels.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from packaging.version import Version

from simulator.cost.catalog_file import read_catalog
from simulator.engines.version import parse_version

CONFIGS_FILE = "vllm_fused_moe_configs.json"
FIXED_FROM = Version("0.17.0")  # vLLM PR #34846's batch-aware defaults
SIXTEEN_BIT = ("bf16", "fp16", "bfloat16", "float16")

# torch.cuda.get_device_name() of each catalog part, spaces as _ (as vLLM names its files;
# the names that appear in v0.16.0's fused_moe/configs, and NVIDIA's names of the A10, A10G
# and L4). Other parts are not looked up.
VLLM_DEVICE_NAMES = {
    "a10": "NVIDIA_A10",
    "a10g": "NVIDIA_A10G",
    "l4": "NVIDIA_L4",
    "l40s": "NVIDIA_L40S",
    "a100-40gb-sxm": "NVIDIA_A100-SXM4-40GB",
    "a100-80gb-sxm": "NVIDIA_A100-SXM4-80GB",
    "a800-80gb-sxm": "NVIDIA_A800-SXM4-80GB",
    "h100-sxm": "NVIDIA_H100_80GB_HBM3",
    "h100-pcie": "NVIDIA_H100_PCIe",
    "h200-sxm": "NVIDIA_H200",
    "h20": "NVIDIA_H20",
    "b200": "NVIDIA_B200",
    "gb200": "NVIDIA_GB200",
}


@cache
def _first_shipped() -> dict[str, Version]:
    data = read_catalog(CONFIGS_FILE)
    return {name: Version(v) for name, v in data["first_shipped"].items()}


def config_file_name(experts: int, intermediate: int, device: str) -> str:
    """vLLM's file name (without .json) of a 16-bit shape: E, N per GPU, the device."""
    return f"E={experts},N={intermediate},device_name={device}"


def has_tuned_config(name: str, version: Version) -> bool:
    """Whether vLLM `version` ships `name`, by the catalogued wheels: a file counts from the
    first catalogued version that has it (a version between two catalogued ones may have
    shipped it earlier), and a version before 0.7.3 is read as 0.7.3."""
    first = _first_shipped().get(name)
    return first is not None and first <= max(version, Version("0.7.3"))


def vllm_fused_moe_rule(data: dict[str, Any], cluster: dict[str, Any],
                        version: Any) -> list[str]:
    """`cluster.fused_moe_config: legacy_default` for a vLLM version before 0.17 whose 16-bit
    experts have no tuned file for the scenario's GPU; the rule it used, or nothing."""
    from simulator.cost.hardware import scenario_accelerator
    from simulator.cost.models import get_model
    from simulator.defaults import DEFAULT_HARDWARE, DEFAULT_MODEL

    v = parse_version(version)
    if v is None or v >= FIXED_FROM or "fused_moe_config" in cluster or "pd" in cluster:
        return []
    try:
        model = get_model(data.get("model", DEFAULT_MODEL))
        acc = scenario_accelerator(data.get("hardware", DEFAULT_HARDWARE))
    except (ValueError, OSError):  # the scenario check names what it cannot read
        return []
    if not model.is_moe or data.get("quantization") is not None:
        return []
    dtype = data.get("dtype")
    if dtype is None and model.checkpoint_quant_method:  # released quantized: as released
        return []
    if str(dtype or "bf16") not in SIXTEEN_BIT:
        return []
    device = VLLM_DEVICE_NAMES.get(acc.name)
    if device is None:
        return []
    tp, ep = int(cluster.get("tp", 1)), int(cluster.get("ep", 1))
    if ep > 1:  # whole experts, E / ep of them on each GPU
        experts, per_gpu = model.num_experts // ep, model.ffn_size
    else:  # every expert split tp ways
        experts, per_gpu = model.num_experts, model.ffn_size // tp
    name = config_file_name(experts, per_gpu, device)
    if has_tuned_config(name, v):
        return []
    cluster["fused_moe_config"] = "legacy_default"
    return [f"fused_moe_config legacy_default: vLLM {v} ships no {name}.json, so its fused "
            "MoE runs the fallback config it had before v0.17 (vLLM PR #34846)"]
