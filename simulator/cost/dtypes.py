"""Element sizes of the dtypes kvpd prices (bytes per weight, KV entry or activation), with
the quantization scales a stored weight carries."""

from __future__ import annotations

DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5,
                "fp4": 0.5}
DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16",
                  "half": "fp16", "float8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
                  "w4a16": "int4", "awq": "int4", "gptq": "int4", "w8a8": "int8",
                  "nvfp4": "fp4", "mxfp4": "fp4", "e2m1": "fp4"}
# int4 checkpoints (AWQ/GPTQ) store one fp16 scale and one packed 4-bit zero point per
# group of 128 weights: 2.5 bytes / 128 weights (AutoAWQ / AutoGPTQ default group_size=128).
INT4_GROUP_OVERHEAD_BYTES = 2.5 / 128
# FP4 (E2M1) block scales per weight: NVFP4 has one FP8 E4M3 scale per 16 values (plus one
# FP32 per tensor; NVIDIA technical blog "Introducing NVFP4", 2025-06); MXFP4 one E8M0 scale
# per 32 values (OCP Microscaling Formats (MX) v1.0 specification, 2023-09).
FP4_SCALE_BYTES = {"nvfp4": 1.0 / 16, "mxfp4": 1.0 / 32}

def normalize_dtype(dtype: str) -> str:
    """Canonical dtype name: one of fp32, bf16, fp16, fp8, int8, int4, fp4."""
    key = str(dtype).strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}")
    return key


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of `dtype` (fp32, bf16, fp16, fp8, int8, int4, fp4 -> 4, 2, 2, 1, 1,
    0.5, 0.5)."""
    return DTYPE_BYTES[normalize_dtype(dtype)]


def matrix_weight_bytes(dtype: str) -> float:
    """Bytes per stored matrix weight in `dtype`, including int4 group scales and the FP4
    block scales (NVFP4's, the larger of the two FP4 formats; `Precision` knows the format)."""
    dt = normalize_dtype(dtype)
    extra = {"int4": INT4_GROUP_OVERHEAD_BYTES, "fp4": FP4_SCALE_BYTES["nvfp4"]}.get(dt, 0.0)
    return DTYPE_BYTES[dt] + extra
