"""Precision of one replica as separate knobs: the weights' storage dtype, how they were
quantized (`quantization.method`, `group_size`), and the KV-cache dtype.

The knobs map to vLLM's: `dtype` (activations), `quantization` (the checkpoint's method) and
`kv_cache_dtype` ("auto": the activations' 16-bit dtype, whatever the weights).

    method  weights       GEMMs run in                      needs on the part
    (none)  fp32/bf16/fp16  that dtype                        -
    fp8     fp8 (E4M3)    FP8 tensor cores (W8A8, per-tensor  fp8_tflops
                          or per-channel scales)
    w8a8    int8          INT8 tensor cores (SmoothQuant)     int8_tops
    awq     int4          16-bit tensor cores after in-kernel  a weight-only kernel (Marlin)
    gptq    int4 or int8  dequantization (W4A16 / W8A16)      for the part's architecture
    nvfp4   fp4 (E2M1)    FP4 tensor cores (W4A4, block       fp4_tflops; else the weight-
    mxfp4                 scales in the MMA); weight-only      only kernel (W4A16), as vLLM's
                          (W4A16) on parts without FP4 units   Marlin FP4 path on Hopper/Ampere

`quantization.scope` says which matrices the method covers:
    all             every decoder-layer matrix (vLLM's FP8, AWQ and GPTQ checkpoints)
    experts         the routed MoE experts only (gpt-oss's MXFP4 release: modules_to_not_convert
                    keeps attention, router, embeddings and LM head in BF16)
    mlp             every MLP matrix: dense MLPs, shared and routed experts; attention left out
                    (NVIDIA's ModelOpt NVFP4 DeepSeek exports: exclude_modules `self_attn*`)
    mlp_and_o_proj  those and the attention output projection; the q/k/v projections left
                    out (nvidia/DeepSeek-R1-0528-FP4-v2: "additionally quantizes the wo module
                    in attention layers", its model card)
What the scope leaves out is stored and multiplied in the activations' 16 bits. The MoE router
goes with the dense MLPs (its weights are under 1% of a layer's MLP); the LM head is 16-bit in
every scope.

A precision the part cannot run, or a method with no cost model, is refused by `resolve`
naming the part and what it supports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.cost.dtypes import FP4_SCALE_BYTES, dtype_bytes, normalize_dtype
from simulator.cost.hardware import Accelerator
from simulator.cost.kernels import kernel_profile

QUANT_METHODS = ("fp8", "w8a8", "awq", "gptq", "nvfp4", "mxfp4")
FP4_METHODS = ("nvfp4", "mxfp4")
GROUPED_METHODS = ("awq", "gptq")  # weight-only with their own group_size
KV_CACHE_DTYPES = ("auto", "bf16", "fp16", "fp8")
SCOPES = ("all", "experts", "mlp", "mlp_and_o_proj")  # the matrices `quantization.method` covers
# the parts of a decoder layer each scope covers (mlp: dense MLPs, shared experts and the router)
SCOPE_PARTS = {"all": frozenset({"qkv", "o_proj", "mlp", "experts"}),
               "experts": frozenset({"experts"}),
               "mlp": frozenset({"mlp", "experts"}),
               "mlp_and_o_proj": frozenset({"o_proj", "mlp", "experts"})}
PARTS = ("qkv", "o_proj", "mlp", "experts")
# the weight dtype each method stores, and the dtype its GEMMs compute in ("weight-only":
# 16-bit activations times dequantized weights)
_METHOD_WEIGHTS = {"fp8": ("fp8",), "w8a8": ("int8",), "awq": ("int4",), "gptq": ("int4", "int8"),
                   "nvfp4": ("fp4",), "mxfp4": ("fp4",)}
# (fp4 weights without a method: NVFP4 on NVIDIA parts, MXFP4, the OCP format, elsewhere)
_DEFAULT_METHOD = {"fp8": "fp8", "int8": "w8a8", "int4": "awq"}
# AutoAWQ and AutoGPTQ quantize in groups of 128 weights by default (their README examples,
# `q_group_size=128` / `group_size=128`); -1 is GPTQ's "one group per output channel".
DEFAULT_GROUP_SIZE = 128
# Bytes of quantization metadata per group: AWQ/GPTQ int4 store one fp16 scale and one packed
# 4-bit zero point per group (2.5 bytes); GPTQ int8 one fp16 scale and one 8-bit zero (3 bytes).
_GROUP_META_BYTES = {"int4": 2.5, "int8": 3.0}


@dataclass(frozen=True)
class Precision:
    """How one replica stores and computes: weights, their quantization, the KV cache."""

    dtype: str  # weight storage: fp32, bf16, fp16, fp8, int8, int4, fp4
    method: str | None  # quantization method (None: unquantized)
    group_size: int  # weights per quantization group (weight-only methods; -1: per channel)
    kv_cache_dtype: str  # bf16, fp16, fp8 or fp32
    compute: str  # what the GEMMs multiply in: fp32, bf16, fp8, fp4, int8
    scope: str = "all"  # the matrices `method` covers: all, or the routed MoE experts only

    @property
    def weight_only(self) -> bool:
        """Weight-only quantization (AWQ, GPTQ, FP4 without FP4 units): fewer bytes,
        dequantized in the GEMM kernel, 16-bit tensor cores."""
        return self.method in GROUPED_METHODS or (self.method in FP4_METHODS
                                                    and self.compute != "fp4")

    @property
    def activation_bytes(self) -> float:
        """Bytes per activation element (hidden states, norms, embeddings)."""
        return 4.0 if self.dtype == "fp32" else 2.0

    @property
    def matrix_weight_bytes(self) -> float:
        """Bytes per stored matrix weight, including the quantization groups' scales/zeros."""
        b = dtype_bytes(self.dtype)
        if self.method in FP4_METHODS:
            return b + FP4_SCALE_BYTES[self.method]
        if self.method in GROUPED_METHODS:
            per_group = self.group_size if self.group_size > 0 else 4096  # per channel: ~K
            b += _GROUP_META_BYTES[self.dtype] / per_group
        return b

    @property
    def dense(self) -> Precision:
        """The precision of the matrices a scope leaves out: this one for scope `all`, else
        unquantized in the activations' dtype."""
        if self.scope == "all":
            return self
        act = "fp32" if self.dtype == "fp32" else "bf16"
        return Precision(dtype=act, method=None, group_size=0, kv_cache_dtype=self.kv_cache_dtype,
                         compute=act)

    def covers(self, part: str) -> bool:
        """Whether the scope quantizes `part`: qkv (the q/k/v projections, MLA's latent ones),
        o_proj, mlp (dense MLPs, shared experts, the router) or experts (the routed ones)."""
        if part not in PARTS:
            raise ValueError(f"unknown part {part!r}; expected one of {', '.join(PARTS)}")
        return part in SCOPE_PARTS[self.scope]

    def of(self, part: str) -> Precision:
        """The precision `part`'s matrices are stored and multiplied in (`covers`)."""
        return self if self.covers(part) else self.dense

    def label(self) -> str:
        q = f" {self.method}" + (f" g{self.group_size}" if self.method in GROUPED_METHODS else "") \
            if self.method else ""
        if self.method in FP4_METHODS:
            q += " (W4A4)" if self.compute == "fp4" else " (weight-only, W4A16)"
        where = SCOPE_WORDS.get(self.scope, "")
        return f"{self.dtype}{q} weights{where}, {self.kv_cache_dtype} KV cache"

    def quantization(self) -> dict[str, Any] | None:
        """The `quantization` mapping that resolves back to this precision (None: none)."""
        if self.method is None:
            return None
        grouped = self.method in GROUPED_METHODS
        return {"method": self.method, **({"group_size": self.group_size} if grouped else {}),
                **({"scope": self.scope} if self.scope != "all" else {})}

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "quantization": self.method, "group_size": self.group_size,
                "kv_cache_dtype": self.kv_cache_dtype, "compute": self.compute,
                "scope": self.scope}


# how `Precision.label` and the CLI name a scope other than `all`
SCOPE_WORDS = {"experts": " on the routed experts (the rest 16-bit)",
               "mlp": " on the MLPs and experts (attention 16-bit)",
               "mlp_and_o_proj": " on the MLPs, experts and attention output (q/k/v 16-bit)"}


def _one_of(value: Any, allowed: tuple[str, ...], refusal: str) -> str:
    """`value` lower-cased when it is one of `allowed`, else ValueError(`refusal`)."""
    key = str(value).strip().lower()
    if key not in allowed:
        raise ValueError(refusal)
    return key


def check_method(method: Any, where: str = "quantization.method") -> str:
    """`method` if kvpd has a cost model for it, else ValueError listing the ones it has."""
    return _one_of(method, QUANT_METHODS,
                   f"{where}: kvpd has no cost model for quantization method {method!r}; "
                   f"it models: {', '.join(QUANT_METHODS)}")


def check_scope(scope: Any, where: str = "quantization.scope") -> str:
    """`scope` if it is one kvpd models, else ValueError listing them."""
    return _one_of(scope, SCOPES, f"{where}: {scope!r} is not a quantization scope; expected one "
                                  f"of {', '.join(SCOPES)} (experts: the routed MoE experts only; "
                                  "mlp: every MLP and expert; mlp_and_o_proj: those and the "
                                  "attention output projection)")


def check_kv_cache_dtype(value: Any, where: str = "cache.kv_cache_dtype",
                         allow_fp32: bool = False) -> str:
    """The canonical KV-cache dtype; fp32 only for fp32 models (`allow_fp32`, the CPU path)."""
    key = str(value).strip().lower()
    key = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp8_e4m3": "fp8",
           "fp8_e5m2": "fp8", "float8": "fp8", "float32": "fp32"}.get(key, key)
    if key == "fp32" and allow_fp32:
        return key
    if key not in KV_CACHE_DTYPES:
        raise ValueError(f"{where}: {value!r} is not a KV-cache dtype; expected one of "
                         f"{', '.join(KV_CACHE_DTYPES)}")
    return key


def supported(acc: Accelerator) -> list[str]:
    """The weight precisions `acc` can run, as `dtype[/method]` strings."""
    out = ["bf16", "fp16"]
    if acc.fp32_tflops:
        out.insert(0, "fp32")
    if acc.fp8_tflops:
        out.append("fp8")
    if acc.int8_tops:
        out.append("int8/w8a8")
    # Marlin-style weight-only GEMMs: a kernel profile, and the FP32 rate their dequantization runs at
    wo = kernel_profile(acc).weight_only is not None and bool(acc.fp32_tflops)
    if wo:
        out += ["int8/gptq", "int4/awq", "int4/gptq"]
    if acc.fp4_tflops or wo:
        out += ["fp4/nvfp4", "fp4/mxfp4"]
    return out


def resolve(acc: Accelerator, dtype: str = "bf16", quantization: dict[str, Any] | str | None = None,
            kv_cache_dtype: str | None = None, where: str = "", model: Any = None) -> Precision:
    """The `Precision` of weights `dtype` quantized by `quantization` on `acc`, or ValueError
    naming the part and what it supports when it cannot run it. With `model`, its released
    checkpoint fills what `quantization` leaves out (`checkpoint_defaults`) and a scope the
    model cannot have is refused."""
    if model is not None:
        prec = resolve(acc, dtype, checkpoint_defaults(model, dtype, quantization),
                       kv_cache_dtype, where)
        if prec.scope == "experts" and not model.is_moe:
            raise ValueError(f"quantization.scope experts: {model.name} is not a mixture of "
                             "experts (no routed experts to quantize); use scope all or mlp")
        return prec
    pre = f"{where}: " if where else ""
    dt = normalize_dtype(dtype)
    q = quantization
    if isinstance(q, str):
        q = {"method": q}
    if q is not None and not isinstance(q, dict):
        raise ValueError(f"{pre}quantization must be a mapping {{method, group_size, scope}}, "
                         f"got {q!r}")
    q = dict(q or {})
    bad = sorted(set(q) - {"method", "group_size", "scope"})
    if bad:
        raise ValueError(f"{pre}quantization: unknown key(s) {bad}; allowed: method, group_size, "
                         "scope")
    scope = check_scope(q.get("scope") or "all", f"{pre}quantization.scope")
    method = q.get("method")
    if method is not None:
        method = check_method(method, f"{pre}quantization.method")
    elif dt == "fp4":  # `dtype: mxfp4` / `nvfp4` name the format; bare fp4 takes the vendor's
        named = str(dtype).strip().lower()
        method = named if named in FP4_METHODS else ("nvfp4" if acc.vendor == "nvidia" else "mxfp4")
    elif dt in _DEFAULT_METHOD:
        method = _DEFAULT_METHOD[dt]
    if method is None and dt in ("fp32", "bf16", "fp16"):
        if "group_size" in q:
            raise ValueError(f"{pre}quantization.group_size needs a weight-only method (awq, gptq)")
    elif method is not None and dt not in _METHOD_WEIGHTS[method]:
        raise ValueError(f"{pre}quantization method {method!r} stores "
                         f"{' or '.join(_METHOD_WEIGHTS[method])} weights, not dtype {dt!r}")
    if method in FP4_METHODS and "group_size" in q:
        raise ValueError(f"{pre}quantization.group_size: {method} fixes its block size "
                         f"({int(round(1 / FP4_SCALE_BYTES[method]))} weights per scale); "
                         "leave group_size out")
    group = q.get("group_size", DEFAULT_GROUP_SIZE)
    if isinstance(group, bool) or not isinstance(group, int) or not (group > 0 or group == -1):
        raise ValueError(f"{pre}quantization.group_size must be a positive integer or -1 "
                         f"(per channel), got {group!r}")
    grouped = method in GROUPED_METHODS  # AWQ/GPTQ: a group size, fp16 activations
    compute = {"fp8": "fp8", "w8a8": "int8"}.get(method or "", "fp32" if dt == "fp32" else "bf16")
    if method in FP4_METHODS and acc.fp4_tflops:
        compute = "fp4"
    can = supported(acc)
    want = dt if method in (None, "fp8") else f"{dt}/{method}"
    if want not in can:
        why = {"fp32": " (the catalog has no fp32_tflops figure for it)",
               "fp8": " (fp8_tflops is null: no FP8 tensor cores)",
               "int8/w8a8": " (int8_tops is null: no INT8 tensor path)",
               "fp4/nvfp4": " (fp4_tflops is null and no weight-only kernel profile)",
               "fp4/mxfp4": " (fp4_tflops is null and no weight-only kernel profile)"}.get(
            want, f" (no weight-only kernel profile for arch {acc.arch or 'none'!r})"
            if kernel_profile(acc).weight_only is None else
            " (weight-only kernels dequantize at the part's fp32_tflops, which is null)")
        raise ValueError(f"{pre}{acc.name} cannot run {want} weights{why}; it supports: "
                         f"{', '.join(can)}")
    kv = check_kv_cache_dtype(kv_cache_dtype or "auto", f"{pre}kv_cache_dtype",
                              allow_fp32=dt == "fp32")
    if kv == "auto":  # vLLM: the model's activation dtype (AWQ/GPTQ checkpoints run in fp16)
        kv = "fp32" if dt == "fp32" else ("fp16" if grouped or dt == "fp16" else "bf16")
    if kv == "fp8" and acc.vendor == "apple":
        raise ValueError(f"{pre}{acc.name} cannot hold an fp8 KV cache (no FP8 on Apple GPUs); "
                         "use kv_cache_dtype auto, bf16 or fp16")
    if scope != "all" and method is None:
        raise ValueError(f"{pre}quantization.scope {scope!r} needs a quantized dtype "
                         f"(fp8, int8, int4, fp4), not {dt!r}")
    return Precision(dtype=dt, method=method, group_size=group if grouped else 0,
                     kv_cache_dtype=kv, compute=compute, scope=scope)


# the weight dtype each checkpoint method stores (for the checkpoint defaults below)
_CHECKPOINT_DTYPE = {"fp8": "fp8", "mxfp4": "fp4", "nvfp4": "fp4", "awq": "int4", "gptq": "int4"}


def checkpoint_note(model: Any, dtype: str,
                    quantization: dict[str, Any] | str | None) -> str | None:
    """What the model's released checkpoint fills into `quantization` (`checkpoint_defaults`),
    as a sentence, or None when it fills nothing."""
    filled = checkpoint_defaults(model, dtype, quantization)
    if filled == quantization or not isinstance(filled, dict):
        return None
    where = {"experts": "the routed experts", "mlp": "every MLP and expert (attention 16-bit)",
             "mlp_and_o_proj": "every MLP, expert and attention output projection (q/k/v "
                               "16-bit)"}.get(filled.get("scope"), "every matrix")
    group = f" in groups of {filled['group_size']}" if filled.get("group_size", -1) > 0 else ""
    return (f"as released: {filled['method']}{group} on {where} (the model's config.json "
            "quantization_config)")


def checkpoint_defaults(model: Any, dtype: str,
                        quantization: dict[str, Any] | str | None) -> dict[str, Any] | str | None:
    """`quantization` with the model's released checkpoint filling what it leaves out: when the
    weights are stored in the checkpoint's dtype (gpt-oss: fp4), its method (mxfp4, not the
    vendor's default fp4 format) unless `dtype` names one, and its scope (experts) for that
    method. Anything the scenario says wins; other dtypes are left as they are."""
    method = getattr(model, "checkpoint_quant_method", "")
    if not method or normalize_dtype(dtype) != _CHECKPOINT_DTYPE.get(method):
        return quantization
    q = {"method": quantization} if isinstance(quantization, str) else dict(quantization or {})
    if q.get("method") is None:
        named = str(dtype).strip().lower()
        q["method"] = named if named in FP4_METHODS else method
    if str(q["method"]).strip().lower() == method:
        if q.get("scope") is None:
            q["scope"] = model.checkpoint_quant_scope or "all"
        group = getattr(model, "checkpoint_quant_group_size", 0)
        if q.get("group_size") is None and group and method in GROUPED_METHODS:
            q["group_size"] = group
    return q
