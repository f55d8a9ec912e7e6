"""Which fused-MoE kernel config vLLM and SGLang run: a tuned one, or the old fallback.

Both engines' Triton `fused_moe` look each MoE shape up as a file
`E={experts on the GPU},N={intermediate per GPU},device_name={GPU}[,dtype=...]` and, with no
such file, run `get_default_config`. For 16-bit experts that fallback was one tile for all
large batches (BLOCK_SIZE_M 64, N 64, K 32, no num_warps / num_stages):
- vLLM until v0.16: PR #34846 replaced it in v0.17.0 ("many-expert models see up to 2x
  speedup at large batch size"), read in the v0.16.0 and v0.17.0 wheels;
- SGLang in every release read, 0.4.3.post2 to 0.5.7 (`fused_moe_triton_config.py`); later
  releases are not read, so the rule stops at 0.5.7.

kvpd prices that fallback as `cluster.fused_moe_config: legacy_default` (kernels.yaml
`grouped_gemm.legacy_default`, fitted to vLLM PR #24700's measured fallback: `python
bench/diagnostics/moe_kernels.py`). The `vllm` and `sglang` engine presets set it
(`fused_moe_fallback_rule`) when the model's 16-bit experts have no tuned file for the GPU in
that version (`simulator/catalog/fused_moe_configs.json`, read from the released wheels).
Quantized experts are left alone: block-FP8's fallback set its warps and stages all along,
and the other methods run other kernels.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from packaging.version import Version

from simulator.cost.catalog_file import read_catalog
from simulator.engines.scenario_model import raw_model
from simulator.engines.version import parse_version

CONFIGS_FILE = "fused_moe_configs.json"
VLLM_FIXED_FROM = Version("0.17.0")  # vLLM PR #34846's batch-aware defaults
SGLANG_LAST_READ = Version("0.5.7")  # the newest SGLang release whose fallback was read
SIXTEEN_BIT = ("bf16", "fp16", "bfloat16", "float16")

# The catalog parts looked up: those whose device names (hardware.yaml `aliases`,
# torch.cuda.get_device_name(), spaces as _ as both engines name their files) appear in vLLM
# 0.16.0's and SGLang 0.5.7's configs, and NVIDIA's A10, A10G and L4. A part sold as several
# boards has each board's name, and a file for any of them counts. Other parts are not looked up.
LOOKED_UP_PARTS = ("a10", "a10g", "l4", "l40s", "a100-40gb-sxm", "a100-80gb-sxm", "a800-80gb-sxm",
                   "h100-sxm", "h100-pcie", "h200-sxm", "h800-sxm", "h20", "b200", "gb200",
                   "rtx-pro-6000")


@cache
def _catalog(engine: str) -> tuple[Version, dict[str, Version]]:
    """(the first catalogued version, file name -> the first version that ships it)."""
    data = read_catalog(CONFIGS_FILE)[engine]
    return (Version(data["versions"][0]),
            {name: Version(v) for name, v in data["first_shipped"].items()})


def config_file_name(experts: int, intermediate: int, device: str) -> str:
    """The engines' file name (without .json) of a 16-bit shape: E, N per GPU, the device."""
    return f"E={experts},N={intermediate},device_name={device}"


def has_tuned_config(engine: str, name: str, version: Version) -> bool:
    """Whether `engine` ("vllm" or "sglang") `version` ships `name`, by the catalogued
    wheels: a file counts from the first catalogued version that has it (a version between
    two catalogued ones may have shipped it earlier), and a version before the first
    catalogued one is read as that one."""
    first_catalogued, first = _catalog(engine)
    shipped = first.get(name)
    return shipped is not None and shipped <= max(version, first_catalogued)


def fused_moe_fallback_rule(engine: str, data: dict[str, Any], cluster: dict[str, Any],
                            version: Any) -> list[str]:
    """`cluster.fused_moe_config: legacy_default` where `engine` ("vllm" or "sglang") at
    `version` runs the old fallback for the scenario's 16-bit experts on its GPU; the rule it
    used, or nothing."""
    from simulator.cost.hardware import device_names, scenario_accelerator
    from simulator.defaults import DEFAULT_HARDWARE

    v = parse_version(version)
    if v is None or "fused_moe_config" in cluster or "pd" in cluster:
        return []
    if (engine == "vllm" and v >= VLLM_FIXED_FROM) or (engine == "sglang" and v > SGLANG_LAST_READ):
        return []
    try:
        model = raw_model(data)
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
    if acc.name not in LOOKED_UP_PARTS:
        return []
    tp, ep = int(cluster.get("tp", 1)), int(cluster.get("ep", 1))
    if ep > 1:  # whole experts, E / ep of them on each GPU
        experts, per_gpu = model.num_experts // ep, model.ffn_size
    else:  # every expert split tp ways
        experts, per_gpu = model.num_experts, model.ffn_size // tp
    names = [config_file_name(experts, per_gpu, device.replace(" ", "_"))
             for device in device_names(acc.name)]
    if any(has_tuned_config(engine, name, v) for name in names):
        return []
    files = " or ".join(f"{name}.json" for name in names)
    cluster["fused_moe_config"] = "legacy_default"
    until = ("the fallback it had before v0.17 (vLLM PR #34846)" if engine == "vllm" else
             "its fallback config (SGLang 0.4.3-0.5.7's get_default_config)")
    label = "vLLM" if engine == "vllm" else "SGLang"
    return [f"fused_moe_config legacy_default: {label} {v} ships no {files}, so its fused "
            f"MoE runs {until}"]
