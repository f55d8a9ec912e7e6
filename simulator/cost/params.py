"""`CostParams`: the few physical knobs of the roofline cost model, with sourced defaults.

Every parameter is non-negative and means one thing (a fraction of a peak, or seconds), so
calibration (issue 8) can fit them with `scipy.optimize.least_squares` over
`to_vector()` / `from_vector()` and write them back with `save()`. A saved profile records
the `device` and `model` it was measured on; the cost model refuses it for another one.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

# Efficiencies are fractions of the datasheet peak in (0, 1]; overheads are seconds >= 0.
EFFICIENCY_FIELDS = ("gemm_compute_efficiency", "gemm_memory_efficiency",
                     "attn_compute_efficiency", "attn_memory_efficiency", "comm_efficiency",
                     "gemv_memory_efficiency")
OVERHEAD_FIELDS = ("step_overhead_s", "layer_overhead_s", "token_overhead_s",
                   "request_overhead_s", "decode_attn_overhead_s")
# Fractions in [0, 1] describing how an executor departs from the ideal roofline (issue 8:
# fitted on the CPU executor; their defaults are the ideal GPU kernels, leaving estimates as is).
BEHAVIOUR_FIELDS = ("decode_padding", "overlap")
# Host seconds of a serving engine's loop outside its engine steps (a calibration measures
# them from the profile's serving probe, simulator/calibrate/loop.py; not fitted).
LOOP_FIELDS = ("loop_overhead_s", "kv_handoff_step_s", "kv_handoff_s", "kv_handoff_token_s",
               "kv_land_s", "kv_land_token_s", "idle_wake_s", "idle_wake_tau_s")
# ... of which time constants, not host work: a faster device does not shorten them
LOOP_TIME_CONSTANTS = ("idle_wake_tau_s",)
# Per-size factors (tuples of positive floats) that a calibration measures, not fits.
TABLE_FIELDS = ("linear_token_factors", "lm_head_row_factors")


@dataclass
class CostParams:
    """Efficiencies (fractions of peak) and overheads (seconds) of one device + model."""

    # Dense GEMMs reach the "maximum achievable matmul FLOPS" (MAMF), 51-87% of peak across
    # the accelerators measured (S. Bekman, ml-engineering, MAMF comparison table); 0.75 is
    # its NVIDIA middle. `default_for` uses the part's MAMF figure and its kernel profile
    # (simulator/catalog/kernels.yaml: FP8/INT8 GEMMs, attention, streaming) where it has
    # them; the class defaults below are for parts without one (Apple GPUs, the CPU).
    gemm_compute_efficiency: float = 0.75
    # Streaming weights: STREAM-like copies reach ~85-92% of datasheet HBM bandwidth on
    # A100/H100 (BabelStream results); 0.85 leaves room for GEMM tails on small batches.
    gemm_memory_efficiency: float = 0.85
    # One-row GEMMs (GEMV: every linear layer of a one-token step, the LM head of a
    # one-request step) stream their weights at this fraction of bandwidth. GPU GEMV kernels
    # stream like GEMMs (default: as gemm_memory_efficiency); CPU BLAS has a dedicated GEMV
    # kernel that streams ~1.8x faster than its small-M GEMM, which packs the weights first
    # (fp32 MKL, 1 thread, measured here: a 65 MB LM head takes 6.1 ms for 1 row, 10.8 ms for
    # 4). Fitted by `kvpd calibrate`.
    gemv_memory_efficiency: float = 0.85
    # Prefill attention: FlashAttention-2 reaches 50-73% of peak on A100 (Dao 2023,
    # arXiv:2307.08691); FA3 ~75% on H100 (Shah et al. 2024, arXiv:2407.08608). Variable-length
    # serving batches sit at the low end: 0.5.
    attn_compute_efficiency: float = 0.5
    # Paged decode attention gathers 16-token KV blocks; paged kernels (vLLM PagedAttention,
    # FlashInfer, Ye et al. 2025, arXiv:2501.01005) reach well below streaming bandwidth at
    # short contexts: 0.7 (order of magnitude, calibration refines it).
    attn_memory_efficiency: float = 0.7
    # All-reduce bus bandwidth / link bandwidth: nccl-tests on 8x H100 NVLink report
    # ~360-480 GB/s bus bandwidth against 450 GB/s per direction: 0.8.
    comm_efficiency: float = 0.8
    # Scheduler, input preparation, sampling launch and output processing once per step.
    # vLLM v1 keeps this CPU time to a few hundred us per step with CUDA graphs (vLLM v1
    # alpha blog, 2025-01-27); 0.3 ms (order of magnitude, calibrated per device).
    step_overhead_s: float = 3e-4
    # Kernel launch gaps per layer (~8 kernels, each ~0.5 us under CUDA graphs; NVIDIA CUDA
    # Graphs blog, 2019): 4 us.
    layer_overhead_s: float = 4e-6
    # Host-side work per scheduled token (position/slot-mapping tensors, detokenising):
    # ~0.1 us per token in numpy (order of magnitude, calibrated per device).
    token_overhead_s: float = 1e-7
    # Host-side work per scheduled request per step, whatever its tokens: its block-table
    # row and attention metadata, sampling its token, appending it and checking stops
    # (Python per request in the CPU executor, realexec/engine/attention.py and runner.py). 0:
    # folded into step_overhead_s (GPU estimates). Fitted by `kvpd calibrate`. This CPU,
    # llama-50m: without it the fit priced decode steps of 24-48 requests at short contexts
    # 3-9% low and long ones 1-3% high, in every profile, and real serving batches (short
    # Gamma contexts) 4-5% low.
    request_overhead_s: float = 0.0
    # Fixed seconds per layer of a step that has decodes, whatever their number and
    # contexts: setting up the batched decode attention (the CPU executor builds a gather,
    # a mask and one SDPA call per layer, realexec/engine/attention.py). 0: fused paged kernels,
    # whose launch is in layer_overhead_s. Fitted by `kvpd calibrate`. This CPU, llama-50m:
    # the profile's decode steps at a 32-token context took 0.8-2 ms more than their KV
    # reads explain, and the fit without this term priced them 4-8% low.
    decode_attn_overhead_s: float = 0.0
    # Padded decode attention: a batched decode kernel that gathers every decode's KV padded to
    # the longest decode context of the step (the real CPU executor: KV gather + one batched
    # SDPA, realexec/engine/attention.py) reads and multiplies sum_ctx + p x (decodes x max_ctx -
    # sum_ctx) KV tokens. 0: paged kernels touch only each request's own blocks (vLLM
    # PagedAttention / FlashInfer); 1: fully padded. Fitted by `kvpd calibrate`.
    decode_padding: float = 0.0
    # Memory/compute overlap of one operator: it takes max(c, m) + (1 - overlap) x min(c, m).
    # 1: the roofline (GPU kernels hide memory traffic behind arithmetic); a CPU core stalls
    # on part of it (fitted 0.4-0.7 on the CPU executor, issue 8 report).
    overlap: float = 1.0
    # Small-row GEMM passes: fp32 MKL has no small-M kernel and runs a GEMM of 1 < rows < this
    # value as `rows` GEMV passes over the weights (measured: 2 or 3 rows cost 1.8x / 2.7x one
    # row, 4 rows 2.3x for a 2 MB matrix); applied to the per-layer linears, whose rows are
    # the step's tokens. The LM head is exempt: the CPU executor pads its 2-3 rows to 4
    # (realexec/engine/paged_model.py), so it runs as one GEMM. 0: off (GPU GEMMs read weights once).
    gemm_row_passes_below: int = 0
    # GEMM size effects the roofline cannot see (BLAS kernel choice, tile quantisation):
    # element i multiplies the per-layer linears (qkv, o, MLP) of a step of i + 1 tokens
    # (`linear_token_factors`) or the LM head of a step of i + 1 requests
    # (`lm_head_row_factors`); sizes beyond a table get 1. Measured by `kvpd calibrate` from
    # the profile's timings of the executor's own linears at every size, relative to the
    # sizes the step fit saw (simulator/calibrate/linears.py). fp32 MKL, 1 thread, this CPU:
    # without them, real decode batches of 5, 7, 9, 11 requests were priced 7-10% low while
    # 8, 12, 16 fitted within 1% (bench/diagnostics/step_errors_by_size.py). Empty: off (roofline alone).
    linear_token_factors: tuple[float, ...] = ()
    lm_head_row_factors: tuple[float, ...] = ()
    # Serving loop, per engine step, outside the step itself: polling for new requests and
    # pushing the step's tokens to the front end. The simulator adds it to every step of a
    # replica. 0: folded into step_overhead_s (GPU estimates; vLLM overlaps it with the
    # step). Measured by `kvpd calibrate` from the serving probe's gaps between back-to-back
    # steps; this CPU, llama-50m: 0.2-0.35 ms (1-2% of a decode step).
    loop_overhead_s: float = 0.0
    # PD prefill worker, once per step that completed prompts (`kv_handoff_step_s`), per
    # request whose prompt it completed (`kv_handoff_s`) and per token of those prompts
    # (`kv_handoff_token_s`): handing the KV to the transport (one message per request,
    # usually one gathered frame: a copy of the prompt's KV; realexec/serving/pd/kv_wire.py) and its first
    # token to the front end, before the next step starts and before that first token goes
    # out. 0: an asynchronous connector. Measured like loop_overhead_s
    # (simulator/calibrate/loop.py); this CPU, llama-50m (run 16's real prefill worker, steps
    # that went straight on): 1.5 ms after a step that handed off one prompt, 2.3 after 2-4.
    kv_handoff_step_s: float = 0.0
    kv_handoff_s: float = 0.0
    kv_handoff_token_s: float = 0.0
    # PD decode worker, per request whose received KV it writes into its pool (`kv_land_s`)
    # and per token written (`kv_land_token_s`), between two of its steps: the write delays
    # the next step of every running request. 0: the KV lands without host work (a
    # connector that writes into the pool as it receives). Measured like loop_overhead_s;
    # this CPU, llama-50m: 0.26-2.2 ms per request of 64-1024 tokens (bench/kv_handoff.py).
    kv_land_s: float = 0.0
    kv_land_token_s: float = 0.0
    # The first step after a replica sat idle g seconds (nothing to run) takes
    # idle_wake_s x (1 - exp(-g / idle_wake_tau_s)) longer than the same step run back to back.
    # 0: none (GPU estimates). Measured by `kvpd profile` (a prompt step after idle gaps of
    # 0-1 s, realexec/fidelity/profile/idle_wake.py) and fitted by `kvpd calibrate`
    # (simulator/calibrate/idle_wake.py); this CPU VM, llama-50m: ~+22 ms after 1 s, tau ~0.4 s.
    idle_wake_s: float = 0.0
    idle_wake_tau_s: float = 0.0
    # Pipeline micro-batches per step when pp > 1 (0: one per stage, vLLM's virtual engines).
    pp_microbatches: int = 0
    # Provenance: the device and model a calibration fitted these on (None: defaults).
    device: str | None = None
    model: str | None = None
    source: str = "defaults (simulator/cost/params.py)"
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes kept on save/load

    FIT_FIELDS = EFFICIENCY_FIELDS + OVERHEAD_FIELDS + BEHAVIOUR_FIELDS
    # Integer parameters a calibration chooses (not part of the least-squares vector).
    INT_FIELDS = ("gemm_row_passes_below", "pp_microbatches")

    def __post_init__(self) -> None:
        for name in TABLE_FIELDS:  # YAML gives lists
            if isinstance(getattr(self, name), list):
                setattr(self, name, tuple(getattr(self, name)))
        self.validate("CostParams")

    def validate(self, where: str) -> None:
        """Raise ValueError naming `where` and the field when a value is out of range."""
        for name in EFFICIENCY_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ValueError(f"{where}: {name} must be a fraction in (0, 1], got {v!r}")
        for name in OVERHEAD_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise ValueError(f"{where}: {name} must be seconds >= 0, got {v!r}")
        for name in BEHAVIOUR_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"{where}: {name} must be a fraction in [0, 1], got {v!r}")
        for name in LOOP_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise ValueError(f"{where}: {name} must be seconds >= 0, got {v!r}")
        for name in self.INT_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{where}: {name} must be an integer >= 0, got {v!r}")
        for name in TABLE_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, tuple) or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool)
                    and math.isfinite(x) and x > 0 for x in v):
                raise ValueError(f"{where}: {name} must be a list of factors > 0, got {v!r}")

    def wake_extra_s(self, idle_s: float) -> float:
        """Seconds the first step after `idle_s` idle seconds takes beyond the same step run
        back to back: idle_wake_s x (1 - exp(-idle_s / idle_wake_tau_s))."""
        if self.idle_wake_s <= 0 or idle_s <= 0 or self.idle_wake_tau_s <= 0:
            return 0.0
        return self.idle_wake_s * -math.expm1(-idle_s / self.idle_wake_tau_s)

    @classmethod
    def default_for(cls, accelerator: Any, compute: str = "bf16") -> CostParams:
        """Defaults for `accelerator` running GEMMs in `compute` (bf16, fp8, fp4, int8, fp32): the
        part's measured matmul efficiency (MAMF) where the catalog has one, and its kernel
        profile's efficiencies (simulator/catalog/kernels.yaml); `efficiency_sources` says
        where each came from."""
        from simulator.cost.kernels import KernelProfile, kernel_profile

        prof = kernel_profile(accelerator)
        eff = getattr(accelerator, "matmul_efficiency", None)
        if not isinstance(prof, KernelProfile):  # Apple, CPU: flat defaults
            return cls(gemm_compute_efficiency=eff) if eff else cls()
        gemm = eff or prof.bf16_efficiency
        gemm *= prof.relative(compute)
        return cls(gemm_compute_efficiency=gemm,
                   layer_overhead_s=prof.layer_floor_s or cls.layer_overhead_s,
                   gemm_memory_efficiency=prof.weight_stream_efficiency,
                   gemv_memory_efficiency=prof.weight_stream_efficiency,
                   attn_compute_efficiency=prof.attn_prefill_efficiency,
                   attn_memory_efficiency=prof.attn_decode_efficiency)

    # ---- fitting helpers (issue 8) ----
    def to_vector(self) -> list[float]:
        """The fitted parameters, in `FIT_FIELDS` order."""
        return [float(getattr(self, f)) for f in self.FIT_FIELDS]

    def from_vector(self, values: list[float], **meta: Any) -> CostParams:
        """A copy with `FIT_FIELDS` replaced by `values` (and metadata such as device/model)."""
        if len(values) != len(self.FIT_FIELDS):
            raise ValueError(f"expected {len(self.FIT_FIELDS)} values, got {len(values)}")
        return dataclasses.replace(self, **dict(zip(self.FIT_FIELDS, map(float, values))), **meta)

    @classmethod
    def fit_bounds(cls) -> tuple[list[float], list[float]]:
        """Lower/upper bounds for `least_squares` in `FIT_FIELDS` order."""
        lo = [1e-3] * len(EFFICIENCY_FIELDS) + [0.0] * len(OVERHEAD_FIELDS + BEHAVIOUR_FIELDS)
        hi = [1.0] * len(EFFICIENCY_FIELDS + OVERHEAD_FIELDS + BEHAVIOUR_FIELDS)
        return lo, hi

    # ---- YAML ----
    def to_dict(self) -> dict[str, Any]:
        params = {f: getattr(self, f) for f in (*self.FIT_FIELDS, *self.INT_FIELDS)}
        params.update({f: float(getattr(self, f)) for f in LOOP_FIELDS if getattr(self, f)})
        params.update({f: [float(x) for x in getattr(self, f)] for f in TABLE_FIELDS
                       if getattr(self, f)})
        return {"device": self.device, "model": self.model, "source": self.source,
                "params": params, "extra": dict(self.extra)}

    def save(self, path: str) -> None:
        """Write a calibration profile (YAML with device/model metadata)."""
        with open(path, "w") as f:
            yaml.safe_dump(self.to_dict(), f, sort_keys=False)

    @classmethod
    def load(cls, path: str, device: str | None = None, model: str | None = None) -> CostParams:
        """Read a profile written by `save`; with `device`/`model`, refuse a profile of another."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"calibration file not found: {path} (written by "
                                    "`kvpd calibrate`)")
        try:
            with open(path) as f:
                data = yaml.safe_load(f)
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
            raise ValueError(f"{path}: expected a mapping with a 'params' mapping")
        top = set(data) - {"device", "model", "source", "params", "extra"}
        if top:
            raise ValueError(f"{path}: unknown top-level field(s) {sorted(top)}")
        allowed = {*cls.FIT_FIELDS, *cls.INT_FIELDS, *LOOP_FIELDS, *TABLE_FIELDS}
        bad = set(data["params"]) - allowed
        if bad:
            raise ValueError(f"{path}: unknown parameter(s) {sorted(bad)}; expected {sorted(allowed)}")
        values = dict(data["params"])
        if "gemm_memory_efficiency" in values:  # files from before the GEMV term: GEMV = GEMM
            values.setdefault("gemv_memory_efficiency", values["gemm_memory_efficiency"])
        try:
            params = cls(**values, device=data.get("device"), model=data.get("model"),
                         source=str(data.get("source") or path), extra=dict(data.get("extra") or {}))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        hw = params.extra.get("hardware")
        if hw is not None:  # the scenario `hardware` mapping `kvpd calibrate` wrote for it
            if not isinstance(hw, dict):
                raise ValueError(f"{path}: extra.hardware must be a mapping (a scenario's "
                                 f"hardware for this calibration), got {hw!r}")
            spec = {k: v for k, v in hw.items() if k not in CALIBRATION_USE_KEYS}
            if spec:
                from simulator.cost.hardware import get_accelerator

                try:
                    get_accelerator(spec)
                except ValueError as exc:
                    raise ValueError(f"{path}: extra.hardware: {exc}") from None
        params.check_applies(device, model, where=path)
        return params

    def check_applies(self, device: str | None, model: str | None, where: str = "cost params") -> None:
        """Raise ValueError if this profile was measured on another device or model."""
        if device is not None and self.device is not None and self.device != device:
            raise ValueError(f"{where}: profile is for device {self.device!r}, not {device!r}")
        if model is not None and self.model is not None and self.model != model:
            raise ValueError(f"{where}: profile is for model {self.model!r}, not {model!r}")


# keys of a scenario's `hardware` mapping that say how to use a calibration, not what the
# device is (`simulator.cluster.cluster.resolve_hardware`)
CALIBRATION_USE_KEYS = ("calibration", "serving_speed", "serving_loop")

_FIELD_SOURCES = {  # CostParams field -> kernels.yaml field it defaults to
    "gemm_memory_efficiency": "weight_stream_efficiency",
    "gemv_memory_efficiency": "weight_stream_efficiency",
    "attn_compute_efficiency": "attn_prefill.efficiency",
    "attn_memory_efficiency": "attn_decode.efficiency",
}


def efficiency_sources(params: CostParams, accelerator: Any,
                       compute: str = "bf16") -> dict[str, tuple[float, str]]:
    """Each efficiency field of `params`: (value, where it came from) - a calibration file,
    the hardware catalog's MAMF figure, a kernels.yaml entry, or the params.py default."""
    from simulator.cost.kernels import KernelProfile, kernel_profile

    prof = kernel_profile(accelerator)
    defaults = CostParams.default_for(accelerator, compute)
    out: dict[str, tuple[float, str]] = {}
    for name in EFFICIENCY_FIELDS:
        v = float(getattr(params, name))
        if params.device is not None or v != getattr(defaults, name):
            src = params.source
        elif name == "gemm_compute_efficiency":
            mamf = getattr(accelerator, "matmul_efficiency", None)
            src = (f"simulator/catalog/hardware.yaml {accelerator.name}.matmul_efficiency (MAMF)"
                   if mamf else (prof.source("gemm.bf16_efficiency")
                                 if isinstance(prof, KernelProfile) else "simulator/cost/params.py"))
            if compute in ("fp8", "int8", "fp4") and isinstance(prof, KernelProfile):
                key = "gemm.fp4_relative" if compute == "fp4" else "gemm.fp8_relative"
                src += f" x {prof.source(key)}"
        elif isinstance(prof, KernelProfile) and name in _FIELD_SOURCES:
            src = prof.source(_FIELD_SOURCES[name])
        else:
            src = "simulator/cost/params.py default"
        out[name] = (v, src)
    return out
