"""Kernel efficiency profiles per GPU architecture (`simulator/catalog/kernels.yaml`) and the
shape functions built on them: GEMM tile/wave quantization, FlashAttention efficiency against
the keys per query, paged decode attention, and weight-only dequantization.

These are the cost model's defaults for parts nobody here has calibrated; `CostModel`
precomputes them per operator in `__init__` so that `step_time` stays plain float arithmetic.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, get_args

from simulator.cost.catalog_file import read_catalog
from simulator.cost.hardware import Accelerator

KERNELS_FILE = "simulator/catalog/kernels.yaml"
# the kernels of one `fused_experts` call (moe_align_block_size, the w13 GEMM, the activation,
# the w2 GEMM, moe_sum): `grouped_gemm.call_s` prices them together, in place of their share
# of the layer floor
FUSED_EXPERTS_KERNELS = 5
# a dense layer's MLP among `layer_floor.kernels`: its add + RMSNorm, gate/up GEMM, activation
# and down GEMM (Nemotron-H's squared-ReLU MLP: up GEMM, activation, down GEMM and its norm)
MLP_KERNELS = 4
MLP_GEMM_KERNELS = 2
# queries per FlashAttention tile (BLOCK_M of FA2/FA3/FA4's head-dim-128 forward kernels)
ATTN_QUERY_TILE = 128
# vLLM's Triton unified attention (vllm/attention/ops/triton_unified_attention.py, v0.10.1 to
# v0.13.0 read): a program computes BLOCK_M query rows, BLOCK_Q tokens x the query heads of one
# KV head; BLOCK_M is 16, or the next power of two above 16 query heads per KV head
TRITON_ATTN_BLOCK_M = 16


# the prefill/decode attention kernels the cost model prices (cluster.attention_backend):
# flash_attn   FlashAttention-class kernels, decodes GQA-packed in every step (FA3 and FA4
#              varlen, FlashInfer, TensorRT-LLM's); kernels.yaml attn_prefill / attn_decode
# flash_attn_2 vLLM's FLASH_ATTN backend on FlashAttention-2 (compute capability 8.x): one
#              varlen call per step, whose decode rows are GQA-packed only when the whole call
#              is decode (flash_api.cpp: seqlenq_ngroups_swapped needs max_seqlen_q == 1);
#              in a step with prompt tokens each decode reads its K/V once per query head
# triton_attn  vLLM's Triton unified attention (triton_block_q below)
AttentionBackend = Literal["flash_attn", "flash_attn_2", "triton_attn"]
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)
# the fused-MoE kernel config (cluster.fused_moe_config): a tuned one (or vLLM's defaults from
# v0.17), or the old fallback (vLLM's before v0.17, SGLang's) for shapes without a tuned file
FusedMoEConfig = Literal["tuned", "legacy_default"]
FUSED_MOE_CONFIGS: tuple[str, ...] = get_args(FusedMoEConfig)


class AttentionBackendError(ValueError):
    """An attention backend the cost model cannot price for this model on this part."""


def query_group(num_heads: int, num_kv_heads: int) -> int:
    """Query heads per KV head (1 for multi-head attention)."""
    return max(1, num_heads // max(1, num_kv_heads))


def triton_block_q(num_heads: int, num_kv_heads: int) -> int:
    """Query tokens per program of vLLM's Triton unified attention: BLOCK_M // (query heads
    per KV head), as the kernel's launcher computes it (at least 1)."""
    group = query_group(num_heads, num_kv_heads)
    block_m = TRITON_ATTN_BLOCK_M if group <= TRITON_ATTN_BLOCK_M else 1 << (group - 1).bit_length()
    return max(1, block_m // group)


@dataclass(frozen=True)
class WeightOnly:
    """Marlin-style weight-only GEMMs (W4A16 / W8A16)."""

    mma_relative: float  # tensor-core efficiency / the BF16 GEMM efficiency
    rows_per_pass: int  # token rows per dequantization pass over the weights
    dequant_flops_per_weight: float  # CUDA-core FLOPs to dequantize one weight


@dataclass(frozen=True)
class GroupedGemm:
    """Grouped-GEMM (fused MoE) kernel terms (kernels.yaml grouped_gemm; used by
    simulator/cost/grouped_gemm.py)."""

    relative: float  # long-K, padding-free efficiency / the part's dense GEMM efficiency
    block_m: tuple[int, int]  # smallest and largest BLOCK_SIZE_M the kernel picks
    k_half: float  # reduction length of the per-tile pipeline fill (elements of K)
    fp8_speedup: float | None = None  # FP8 (W8A8) kernel speed / BF16 kernel speed, same shape
    # streaming the experts' weights (memory-bound, decode): None keeps them at the part's
    # weight_stream_efficiency with no fixed cost (parts without kernel tables)
    stream_efficiency: float | None = None  # long-K fraction of bandwidth the weights stream at
    call_s: float = 0.0  # fixed seconds of one fused_experts call (align, 2 GEMMs, act, sum)
    fp8_k_half: float | None = None  # k_half of the W8A8 (block-quantised) configs
    # BLOCK_SIZE_M by the step's tokens, not by rows per expert: block_m[0] while the tokens
    # are at most the experts, else block_m[1] (vLLM's fallback config before v0.17)
    block_m_by_tokens: bool = False
    # these terms under the old fallback config (grouped_gemm.legacy_default; None: not
    # measured for the arch): `fallback_grouped_gemm`
    legacy_default: GroupedGemm | None = None


@dataclass(frozen=True)
class LinearAttentionKernel:
    """Gated DeltaNet's chunked prefill kernels (kernels.yaml linear_attention): one layer's
    `chunk_gated_delta_rule` forward takes `call_s` + prompt tokens x (`token_s` +
    `token_head_s` x value heads per rank), seconds."""

    call_s: float
    token_s: float
    token_head_s: float


@dataclass(frozen=True)
class KernelProfile:
    """One architecture's kernel efficiencies (see kernels.yaml for each field's source)."""

    arch: str
    tile: tuple[int, int]  # GEMM output tile (rows = tokens, cols = output features)
    bf16_efficiency: float
    fp8_relative: float
    weight_stream_efficiency: float
    attn_prefill_efficiency: float
    attn_half_keys: float
    attn_decode_efficiency: float
    attn_decode_request_tokens: float
    weight_only: WeightOnly | None
    layer_floor_s: float = 0.0  # seconds of a dense layer's kernels beyond their rooflines
    # an FP8 KV cache's decode streaming rate over `attn_decode_efficiency`'s (GQA kernels)
    attn_decode_fp8_kv_relative: float = 1.0
    kernel_s: float = 0.0  # seconds per dependent kernel beyond its roofline
    extra_kernels: tuple[tuple[str, int], ...] = ()  # layer_floor's extra kernels per variant
    kernels: float = 0.0  # dependent kernels of a dense layer (layer_floor.kernels)
    # the dense GEMM kernels among them, each at `gemm_kernel_s` in place of `kernel_s` where
    # the part has GEMM kernel tables (layer_floor.gemm_kernel_s; None: kernel_s)
    gemm_kernel_s: float | None = None
    gemm_kernels: int = 0
    extra_gemm_kernels: tuple[tuple[str, int], ...] = ()
    grouped_gemm: GroupedGemm | None = None  # fused-MoE grouped GEMM terms (None: dense pricing)
    fp4_relative: float | None = None  # FP4 (W4A4) GEMM efficiency / BF16; None: no FP4 kernels
    # a dense GEMM's fixed time per output tile (pipeline fill, epilogue), s (0: no short-K term)
    gemm_tile_fixed_s: float = 0.0
    # FlashAttention's extra time per query tile for the causal mask's diagonal, s (0: none)
    attn_causal_tile_s: float = 0.0
    # vLLM's Triton unified attention (attention_backend triton_attn): the prefill re-reads
    # the K/V prefix once per query block and streams it at this x the part's bandwidth
    # (0: no figure for this architecture; the backend is refused)
    triton_reread_bandwidth: float = 0.0
    # Gated DeltaNet's chunked prefill (None: priced as a roofline of its FLOPs)
    linear_attention: LinearAttentionKernel | None = None
    mamba2: LinearAttentionKernel | None = None  # Mamba-2's chunked prefill (SSD), the same form

    def relative(self, compute: str) -> float:
        """GEMM efficiency of `compute` GEMMs relative to BF16 ones (1.0 for 16-bit)."""
        if compute in ("fp8", "int8"):
            return self.fp8_relative
        if compute == "fp4":
            if self.fp4_relative is None:
                raise ValueError(f"{KERNELS_FILE}: {self.arch}.gemm has no fp4_relative "
                                 "(no FP4 GEMM kernels known for this architecture)")
            return self.fp4_relative
        return 1.0

    def k_half(self, flops_per_s: float, sm_count: int | None) -> float:
        """The tile fixed time in elements of K of a GEMM running at `flops_per_s` (peak x its
        long-K efficiency) over `sm_count` SMs: each SM's K loop over a tile does 2 x tile
        rows x tile cols FLOPs per element of K (0 without the part's SM count)."""
        if not self.gemm_tile_fixed_s or not sm_count:
            return 0.0
        return self.gemm_tile_fixed_s * flops_per_s / sm_count / (2.0 * self.tile[0] * self.tile[1])

    def causal_keys(self, flops_per_s: float, sm_count: int | None, head_dim: int) -> float:
        """`attn_causal_tile_s` as extra keys per query of a FlashAttention forward running at
        `flops_per_s` (peak x efficiency) over `sm_count` SMs: each SM's 128-query tile does
        4 x head_dim FLOPs per query per key (0 without the part's SM count)."""
        if not self.attn_causal_tile_s or not sm_count:
            return 0.0
        return (self.attn_causal_tile_s * flops_per_s / sm_count
                / (ATTN_QUERY_TILE * 4.0 * head_dim))

    def prefill_half_keys(self, flops_per_s: float, sm_count: int | None, head_dim: int) -> float:
        """A prefill query's fixed FlashAttention work in keys: `attn_half_keys` plus the
        causal diagonal's (`causal_keys`; every serving prefill query is causal)."""
        return self.attn_half_keys + self.causal_keys(flops_per_s, sm_count, head_dim)

    @property
    def dense_gemm_kernel_s(self) -> float:
        """One dense GEMM kernel's fixed seconds: `gemm_kernel_s` where the part has GEMM
        kernel tables, else its share of the layer floor (`kernel_s`)."""
        return self.kernel_s if self.gemm_kernel_s is None else self.gemm_kernel_s

    def layer_kernels(self, model: Any, moe_layer: bool) -> float:
        """Dependent kernels of one decoder layer of `model`: the dense layer's, plus
        MoE routing and grouped GEMMs (on an MoE layer), shared experts, MLA's projections,
        Qwen3's q/k norms, Gemma 3's sandwich norms, DeepSeek-V3.2's sparse-attention indexer,
        Qwen3-Next's output gate and linear-attention layers (averaged over the layers;
        kernels.yaml layer_floor.extra_kernels lists each)."""
        if not self.kernel_s:
            return 0.0
        return self._count(self.kernels, self.extra_kernels, model, moe_layer)

    def layer_gemm_extra_s(self, model: Any, moe_layer: bool) -> float:
        """Seconds one layer's dense GEMM kernels add to `kernel_s` x `layer_kernels`: each
        costs `gemm_kernel_s` in its place (0 without GEMM kernel tables). The fused-MoE
        GEMMs are priced by `grouped_gemm.call_s` instead."""
        n = self._count(self.gemm_kernels, self.extra_gemm_kernels, model, moe_layer)
        return n * (self.dense_gemm_kernel_s - self.kernel_s)

    @staticmethod
    def _count(n: float, extras: tuple[tuple[str, int], ...], model: Any, moe_layer: bool) -> float:
        """A dense layer's `n` kernels plus the `extras` of the layer's variants."""
        extra = dict(extras)
        if moe_layer:
            n += extra.get("moe", 0)
            if model.shared_expert_ffn_size:
                n += extra.get("shared_expert", 0)
        if model.is_mla:
            n += extra.get("mla", 0)
        full = 1.0 - model.num_linear_layers / model.num_layers  # softmax-attention share
        if model.qk_norm:
            n += extra.get("qk_norm", 0) * full
        if model.attn_output_gate:
            n += extra.get("output_gate", 0) * full
        if model.num_linear_layers:
            kind = "mamba2" if model.linear_kind == "mamba2" else "linear_attention"
            n += extra.get(kind, 0) * (1.0 - full)
        if model.sandwich_norms:
            n += extra.get("sandwich_norms", 0)
        if model.is_sparse_attention:  # (averaged where layers share an indexer: GLM-5.2)
            n += extra.get("sparse_indexer", 0) * model.index_layer_share
        return n

    def mlp_free_layer_s(self, model: Any) -> float:
        """Seconds of the kernel floor of one layer with no MLP (Nemotron-H's): a dense
        layer's (`layer_kernels` at `kernel_s`, its GEMM kernels at `gemm_kernel_s`) without
        the MLP's `MLP_KERNELS`, `MLP_GEMM_KERNELS` of them GEMMs."""
        return (self.kernel_s * (self.layer_kernels(model, False) - MLP_KERNELS)
                + self.layer_gemm_extra_s(model, False)
                - MLP_GEMM_KERNELS * (self.dense_gemm_kernel_s - self.kernel_s))

    def moe_call_extra_s(self) -> float:
        """Seconds an MoE layer's floor adds to `kernel_s` x `layer_kernels`: the measured
        fused_experts call (`grouped_gemm.call_s`) in place of its `FUSED_EXPERTS_KERNELS`
        kernels' share (0 without a measured call)."""
        g = self.grouped_gemm
        if g is None or not g.call_s:
            return 0.0
        return g.call_s - FUSED_EXPERTS_KERNELS * self.kernel_s

    def source(self, field: str) -> str:
        """Where a default came from: the catalog entry (its comment cites the measurement)."""
        return f"{KERNELS_FILE} {self.arch}.{field}"


@cache
def _profiles() -> dict[str, KernelProfile]:
    data = read_catalog("kernels.yaml")
    return {arch: _profile(arch, entry) for arch, entry in data.items()}


def _frac(where: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise ValueError(f"{KERNELS_FILE}: {where} must be a fraction in (0, 1], got {v!r}")
    return float(v)


def _profile(arch: str, e: dict[str, Any]) -> KernelProfile:
    g, ap, ad = e["gemm"], e["attn_prefill"], e["attn_decode"]
    wo = e.get("weight_only")
    return KernelProfile(
        arch=arch, tile=(int(g["tile"][0]), int(g["tile"][1])),
        bf16_efficiency=_frac(f"{arch}.gemm.bf16_efficiency", g["bf16_efficiency"]),
        fp8_relative=_frac(f"{arch}.gemm.fp8_relative", g["fp8_relative"]),
        weight_stream_efficiency=_frac(f"{arch}.weight_stream_efficiency",
                                       e["weight_stream_efficiency"]),
        attn_prefill_efficiency=_frac(f"{arch}.attn_prefill.efficiency", ap["efficiency"]),
        attn_half_keys=float(ap["half_keys"]),
        attn_causal_tile_s=_non_negative(f"{arch}.attn_prefill.causal_tile_s",
                                         ap.get("causal_tile_s", 0.0)),
        attn_decode_efficiency=_frac(f"{arch}.attn_decode.efficiency", ad["efficiency"]),
        attn_decode_request_tokens=float(ad["request_tokens"]),
        attn_decode_fp8_kv_relative=_frac(f"{arch}.attn_decode.fp8_kv_relative",
                                          ad.get("fp8_kv_relative", 1.0)),
        **_layer_floor(arch, e.get("layer_floor")),
        grouped_gemm=_grouped(arch, e.get("grouped_gemm")),
        fp4_relative=(_relative(f"{arch}.gemm.fp4_relative", g["fp4_relative"])
                      if g.get("fp4_relative") is not None else None),
        gemm_tile_fixed_s=_non_negative(f"{arch}.gemm.tile_fixed_s", g.get("tile_fixed_s", 0.0)),
        triton_reread_bandwidth=_triton_reread(arch, e.get("triton_attn")),
        linear_attention=_linear_attention(arch, e.get("linear_attention")),
        mamba2=_linear_attention(arch, e.get("mamba2"), "mamba2"),
        weight_only=None if wo is None else WeightOnly(
            _frac(f"{arch}.weight_only.mma_relative", wo["mma_relative"]),
            int(wo["rows_per_pass"]), float(wo["dequant_flops_per_weight"])))


def _triton_reread(arch: str, t: dict[str, Any] | None) -> float:
    """`triton_attn.reread_bandwidth` (0.0 where the architecture has no entry)."""
    if t is None:
        return 0.0
    v = t.get("reread_bandwidth")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 4:
        raise ValueError(f"{KERNELS_FILE}: {arch}.triton_attn.reread_bandwidth must be a "
                         f"multiple of the part's memory bandwidth in (0, 4], got {v!r}")
    return float(v)


def _linear_attention(arch: str, t: dict[str, Any] | None,
                      key: str = "linear_attention") -> LinearAttentionKernel | None:
    """`linear_attention` or `mamba2` (None where the architecture has no entry)."""
    if t is None:
        return None
    return LinearAttentionKernel(*(_non_negative(f"{arch}.{key}.{k}", t.get(k))
                                   for k in ("call_s", "token_s", "token_head_s")))


def _relative(where: str, v: Any) -> float:
    """An efficiency relative to the BF16 one: in (0, 2] (over 1 where the part's BF16 figure
    is assumed from another part)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 2:
        raise ValueError(f"{KERNELS_FILE}: {where} must be a number in (0, 2], got {v!r}")
    return float(v)


def _non_negative(where: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise ValueError(f"{KERNELS_FILE}: {where} must be a number >= 0, got {v!r}")
    return float(v)


def _layer_floor(arch: str, f: dict[str, Any] | None) -> dict[str, Any]:
    """The KernelProfile fields of `layer_floor` (none: no floor)."""
    if f is None:
        return {}
    kernels, kernel_s = float(f["kernels"]), float(f["kernel_s"])
    out: dict[str, Any] = {
        "kernels": kernels, "kernel_s": kernel_s, "layer_floor_s": kernels * kernel_s,
        "extra_kernels": tuple((str(k), int(v)) for k, v in (f.get("extra_kernels") or {}).items())}
    if f.get("gemm_kernel_s") is None:
        return out
    gemm_s = _non_negative(f"{arch}.layer_floor.gemm_kernel_s", f["gemm_kernel_s"])
    gemms = f.get("gemm_kernels")
    if isinstance(gemms, bool) or not isinstance(gemms, int) or not 0 <= gemms <= kernels:
        raise ValueError(f"{KERNELS_FILE}: {arch}.layer_floor.gemm_kernels must be a whole "
                         f"number from 0 to layer_floor.kernels ({kernels:g}) when gemm_kernel_s "
                         f"is given, got {gemms!r}")
    out.update(gemm_kernel_s=gemm_s, gemm_kernels=gemms,
               extra_gemm_kernels=tuple((str(k), int(v)) for k, v in
                                        (f.get("extra_gemm_kernels") or {}).items()),
               layer_floor_s=(kernels - gemms) * kernel_s + gemms * gemm_s)
    return out


def _block_m(key: str, value: Any) -> tuple[int, int]:
    """A `block_m` entry [lo, hi] with 1 <= lo <= hi; ValueError naming `key` otherwise."""
    lo, hi = (int(x) for x in value)
    if not 1 <= lo <= hi:
        raise ValueError(f"{KERNELS_FILE}: {key}.block_m must be [lo, hi] with 1 <= lo <= hi, "
                         f"got {value!r}")
    return lo, hi


def _nonneg(key: str, v: Any) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
        raise ValueError(f"{KERNELS_FILE}: {key} must be a number >= 0, got {v!r}")


def _grouped(arch: str, g: dict[str, Any] | None) -> GroupedGemm | None:
    if g is None:
        return None
    lo, hi = _block_m(f"{arch}.grouped_gemm", g["block_m"])
    speedup = g.get("fp8_speedup")
    if speedup is not None and (isinstance(speedup, bool) or not isinstance(speedup, (int, float))
                                or not 0 < speedup <= 4):
        raise ValueError(f"{KERNELS_FILE}: {arch}.grouped_gemm.fp8_speedup must be a number in "
                         f"(0, 4], got {speedup!r}")
    stream = g.get("stream_efficiency")
    call_s, fp8_k_half = g.get("call_s", 0.0), g.get("fp8_k_half")
    for key, v in (("call_s", call_s), ("fp8_k_half", fp8_k_half)):
        _nonneg(f"{arch}.grouped_gemm.{key}", v)
    out = GroupedGemm(_frac(f"{arch}.grouped_gemm.relative", g["relative"]), (lo, hi),
                      float(g["k_half"]), None if speedup is None else float(speedup),
                      None if stream is None else _frac(f"{arch}.grouped_gemm.stream_efficiency", stream),
                      float(call_s), None if fp8_k_half is None else float(fp8_k_half))
    legacy = g.get("legacy_default")
    if legacy is None:
        return out
    key = f"{arch}.grouped_gemm.legacy_default"
    if not isinstance(legacy, dict) or set(legacy) != {"relative", "block_m", "k_half",
                                                       "stream_efficiency"}:
        raise ValueError(f"{KERNELS_FILE}: {key} must be a mapping of relative, block_m, "
                         f"k_half and stream_efficiency, got {legacy!r}")
    lk = legacy["k_half"]
    _nonneg(f"{key}.k_half", lk)
    # the fallback tile's K depth is the same for every dtype (BLOCK_SIZE_K 32, 3 stages)
    return dataclasses.replace(out, legacy_default=dataclasses.replace(
        out, relative=_frac(f"{key}.relative", legacy["relative"]),
        block_m=_block_m(key, legacy["block_m"]),
        k_half=float(lk), fp8_k_half=float(lk), block_m_by_tokens=True,
        stream_efficiency=_frac(f"{key}.stream_efficiency", legacy["stream_efficiency"])))


def fallback_grouped_gemm(profile: KernelProfile, part: str) -> GroupedGemm:
    """`part`'s fused-MoE terms under the old fallback config (vLLM's before v0.17, SGLang's:
    cluster.fused_moe_config legacy_default); ValueError naming `part` where its arch has no
    `grouped_gemm.legacy_default` entry."""
    g = profile.grouped_gemm
    if g is None or g.legacy_default is None:
        where = (f"kernels.yaml {profile.arch}.grouped_gemm.legacy_default" if profile.arch
                 else "it has no kernel tables in kernels.yaml")
        raise ValueError(f"{part} has no fallback-config entry ({where}): the Triton fallback "
                         "is priced on NVIDIA parts")
    return g.legacy_default


def list_archs() -> list[str]:
    return list(_profiles())


def kernel_profile(acc: Accelerator) -> NoKernels | KernelProfile:
    """The profile of `acc`'s architecture; `NO_KERNELS` for parts without one (Apple, CPU)."""
    return _profiles().get(acc.arch or "", NO_KERNELS)


@dataclass(frozen=True)
class NoKernels:
    """No shape terms: the flat `CostParams` efficiencies apply (Apple GPUs, the host CPU)."""

    arch: str = ""
    weight_only: None = None
    grouped_gemm: None = None

    def k_half(self, flops_per_s: float, sm_count: int | None) -> float:
        return 0.0

    def prefill_half_keys(self, flops_per_s: float, sm_count: int | None, head_dim: int) -> float:
        return 0.0


NO_KERNELS = NoKernels()


def wave_utilization(rows: int, cols: int, tile: tuple[int, int], sm_count: int) -> float:
    """Fraction of the full-wave rate a GEMM of `rows` x `cols` outputs reaches (tile and wave
    quantization; NVIDIA "Matrix Multiplication Background" guide): its useful work over the
    tiles it runs. The row tile shrinks to the next power of two >= rows (at least 16) for
    small batches, as cuBLAS picks narrower tiles there; a grid of fewer tiles than SMs is
    spread over all of them by split-K (no wave loss), a larger one runs in whole waves of
    `sm_count` tiles. A large GEMM of whole tiles and waves gives 1."""
    tm, tn = tile
    if rows < tm:
        tm = max(16, 1 << (rows - 1).bit_length())
    tiles = math.ceil(rows / tm) * math.ceil(cols / tn)
    slots = tiles if tiles <= sm_count else math.ceil(tiles / sm_count) * sm_count
    return rows * cols / (slots * tm * tn)


def wave_utilization_table(cols: int, tile: tuple[int, int], sm_count: int,
                           max_rows: int) -> list[float]:
    """`wave_utilization(r, cols, ...)` for r = 0 .. max_rows (element 0 is 1.0)."""
    return [1.0] + [wave_utilization(r, cols, tile, sm_count) for r in range(1, max_rows + 1)]


def check_attention_backend(backend: str, model: Any, accelerator: Any,
                            profile: KernelProfile | NoKernels | None) -> str:
    """`backend` if the cost model can price it for `model` on `accelerator`;
    AttentionBackendError naming what is allowed otherwise."""
    if backend not in ATTENTION_BACKENDS:
        raise AttentionBackendError(f"attention_backend {backend!r} unknown; allowed: "
                                    f"{', '.join(ATTENTION_BACKENDS)}")
    if backend == "flash_attn":
        return backend
    if getattr(model, "is_mla", False):
        raise AttentionBackendError(
            f"attention_backend {backend}: {model.name} uses multi-head latent attention, which "
            "vLLM runs on its MLA backends; use flash_attn")
    if backend == "flash_attn_2":
        return backend
    if not getattr(profile, "triton_reread_bandwidth", 0.0):  # (NoKernels: no figures at all)
        arch = getattr(profile, "arch", None) or "no kernel profile"
        raise AttentionBackendError(
            f"attention_backend triton_attn: no figure for {accelerator.name} ({arch}) in "
            f"{KERNELS_FILE} (triton_attn.reread_bandwidth); use flash_attn")
    return backend
