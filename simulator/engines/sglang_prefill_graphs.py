"""What turns SGLang's piecewise CUDA graphs for prefill off for a given model and GPU, beyond
the server settings (`presets._sglang_prefill_graphs`): read in the released wheels v0.5.10,
v0.5.11 and v0.5.12, the releases that turn the graphs on by default.

- Model architectures SGLang lists without them (`configs/model_config.py`
  `piecewise_cuda_graph_disabled_model_archs`: DeepSeek-V3.2's sparse attention, Qwen3-Next,
  GLM-5, Ling 2.5; v0.5.12 adds DeepSeek-V4).
- The MoE runner: `ServerArgs._handle_moe_kernel_config` turns them off under
  `--moe-runner-backend flashinfer_trtllm` (or `flashinfer_mxfp4`) for every model but gpt-oss
  ("bypassed topk is incompatible with torch.compile"), and that is the runner SGLang picks on
  its own (`--moe-runner-backend auto`, `--moe-a2a-backend none`) on SM100 GPUs (B200, B300,
  GB200, GB300: kvpd's `blackwell` parts) in `_handle_model_specific_adjustments`:
  - DeepSeek-V3's architecture (DeepSeek-V3/R1, Kimi K2) with FP8 or NVFP4 experts, and from
    v0.5.12 with BF16 ones too;
  - Qwen3-MoE, Qwen3-Next and Qwen3.5 with FP8, NVFP4 or BF16 experts.
  A prefill step outside the graphs pays its layers' dispatch (`simulator/cost/eager_dispatch.py`).
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

PCG_DISABLED_ARCHS = ("DeepseekV32ForCausalLM", "Qwen3NextForCausalLM", "GlmMoeDsaForCausalLM",
                      "BailingMoeV2_5ForCausalLM", "LLaDAModelLM")
PCG_DISABLED_ARCHS_FROM = {"DeepseekV4ForCausalLM": Version("0.5.12")}
DEEPSEEK_ARCHS = ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration",
                  "MistralLarge3ForCausalLM", "GlmMoeDsaForCausalLM")
DEEPSEEK_BF16_TRTLLM_FROM = Version("0.5.12")  # `or self.quantization is None` in its condition
QWEN_MOE_ARCHS = ("Qwen3MoeForCausalLM", "Qwen3VLMoeForConditionalGeneration",
                  "Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration")
SM100_ARCH = "blackwell"  # kvpd's kernel family of the SM 10.x parts


def arch_without_graphs(architecture: str, version: Version) -> bool:
    """Whether SGLang `version` lists `architecture` without piecewise CUDA graphs."""
    since = PCG_DISABLED_ARCHS_FROM.get(architecture)
    return architecture in PCG_DISABLED_ARCHS or (since is not None and version >= since)


def sm100_trtllm_moe(architecture: str, experts: str | None, gpu_arch: str | None,
                     version: Version) -> bool:
    """Whether SGLang `version` runs this model's experts on flashinfer_trtllm by default.
    `experts`: "FP8", "NVFP4", "BF16" (16-bit weights) or None (any other quantization)."""
    if gpu_arch != SM100_ARCH or experts is None:
        return False
    if architecture in DEEPSEEK_ARCHS:
        return experts != "BF16" or version >= DEEPSEEK_BF16_TRTLLM_FROM
    return architecture in QWEN_MOE_ARCHS


def expert_precision(data: dict[str, Any], modelopt: str | None) -> str | None:
    """The raw scenario's experts as SGLang's rule reads them: "FP8" / "NVFP4" (`modelopt`, as
    `presets._modelopt_weights` gives it), "BF16" for 16-bit weights, None for the rest."""
    if modelopt is not None:
        return modelopt
    dtype = data.get("dtype", "bf16")
    return "BF16" if dtype in ("bf16", "fp16") and data.get("quantization") is None else None
