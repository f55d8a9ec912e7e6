"""Accelerator and link catalogs (`simulator/catalog/{hardware,links}.yaml`) and their loader.

A name looks up the catalog; a dict defines a hypothetical part inline, either from
scratch (every field) or from a `base` with overrides and `<field>_scale` factors::

    get_accelerator({"base": "h100-sxm", "mem_bw_tbps_scale": 2})          # "H100 with 2x bandwidth"
    get_accelerator({"base": "h100-sxm", "name": "h100-hbm4", "memory_gib": 192,
                     "scale_up_link": {"base": "nvlink4", "bandwidth_gb_s_scale": 2}})
    get_link({"base": "ib-ndr", "latency_us": 5})

Units: bytes, bytes/s, FLOP/s, seconds in the dataclasses; the YAML keeps datasheet units
(GiB, TB/s, TFLOP/s, GB/s, us). Each quantity has one field name everywhere (the catalog,
inline parts, scenarios and `kvpd hardware show`): device memory is `memory_gib`.

Names are exact (case, `_` and spaces aside): an unknown name is refused with the closest
catalog names, never mapped to another part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from simulator.cost.catalog_file import read_catalog
from simulator.cost.catalog_match import normalize_name, unknown_name_error

GIB = 2**30  # bytes; catalog memory sizes are binary (see hardware.yaml header)

ACCEL_NUMERIC = ("bf16_tflops", "fp8_tflops", "fp4_tflops", "int8_tops", "fp32_tflops", "memory_gib",
                 "mem_bw_tbps", "sm_count", "price_per_hour", "matmul_efficiency")
ACCEL_TEXT = ("description", "vendor", "arch", "scale_up_link", "pcie", "scale_out")
ACCEL_REQUIRED = ("bf16_tflops", "memory_gib", "mem_bw_tbps")
# field names of earlier versions -> the one name each quantity has now
RENAMED_FIELDS = {"memory_gb": "memory_gib"}
LINK_NUMERIC = ("bandwidth_gb_s", "latency_us", "allreduce_call_us", "allreduce_rank_us",
                "allreduce_efficiency", "mesh_links", "large_allreduce_call_us",
                "large_allreduce_nvls_gb_s", "large_allreduce_nvls_min_tp",
                "large_allreduce_ring_gb_s")
LINK_REQUIRED = ("bandwidth_gb_s", "latency_us")
# a scale-up link's fit of its engines' TP all-reduce: all three fields or none
ALLREDUCE_FIT = ("allreduce_call_us", "allreduce_rank_us", "allreduce_efficiency")
# NCCL's all-reduce of large messages over a switched link: all four fields or none
LARGE_ALLREDUCE_FIT = ("large_allreduce_call_us", "large_allreduce_nvls_gb_s",
                       "large_allreduce_nvls_min_tp", "large_allreduce_ring_gb_s")
LINK_KINDS = ("scale_up_link", "pcie", "scale_out")


@dataclass(frozen=True)
class Link:
    """A point-to-point interconnect: per-direction bandwidth and one-way latency."""

    name: str
    bandwidth_bytes_per_s: float  # per direction
    latency_s: float
    description: str = ""
    # the engines' TP all-reduce over this link, fitted to published communicator benchmarks
    # (None: a ring of 2 (tp - 1) hops of `latency_s`; see `allreduce_fixed_s`)
    allreduce_call_s: float | None = None  # per call
    allreduce_rank_s: float = 0.0  # per call and GPU beyond the first
    allreduce_efficiency: float | None = None  # of the group's bandwidth, for the ring's bytes
    mesh_links: int | None = None  # a full mesh of this many links per GPU (None: a switch)
    # NCCL's all-reduce of large messages (None: the fit above at every size): seconds per
    # call, NVLink SHARP's algorithm bandwidth (bytes/s of message; 0: none) for groups of at
    # least `large_allreduce_nvls_min_tp` GPUs (the size it was measured at), and a ring's
    # bus bandwidth (bytes/s)
    large_allreduce_call_s: float | None = None
    large_allreduce_nvls_bytes_per_s: float = 0.0
    large_allreduce_nvls_min_tp: int = 0
    large_allreduce_ring_bytes_per_s: float = 0.0

    def transfer_time(self, num_bytes: float) -> float:
        """Seconds to move `num_bytes` over an idle link (latency + size / bandwidth)."""
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s

    def allreduce_fixed_s(self, tp: int) -> float:
        """Seconds one all-reduce among `tp` GPUs costs beyond its bytes: the fitted
        `allreduce_call_s + (tp - 1) allreduce_rank_s`, or a ring's 2 (tp - 1) hop latencies."""
        if tp <= 1:
            return 0.0
        if self.allreduce_call_s is None:
            return 2 * (tp - 1) * self.latency_s
        return self.allreduce_call_s + (tp - 1) * self.allreduce_rank_s

    def allreduce_seconds_per_byte(self, tp: int, comm_efficiency: float) -> float:
        """Seconds per byte a ring all-reduce among `tp` GPUs moves: the group's bandwidth at
        the fitted `allreduce_efficiency`, or at `comm_efficiency` without a fit."""
        return 1.0 / (self.group_bandwidth(tp) * (self.allreduce_efficiency or comm_efficiency))

    def large_allreduce_seconds_per_byte(self, tp: int) -> float | None:
        """Seconds per message byte of NCCL's all-reduce of a large message among `tp` GPUs:
        the faster of NVLink SHARP (its algorithm bandwidth, in groups of at least
        `large_allreduce_nvls_min_tp`) and a ring (its bus bandwidth over the ring's
        2 (tp - 1)/tp); None without a large-message fit."""
        algorithm = self.large_allreduce_algorithm(tp)
        if algorithm is None:
            return None
        if algorithm == "NVLink SHARP":
            return 1.0 / self.large_allreduce_nvls_bytes_per_s
        return 2.0 * (tp - 1) / tp / self.large_allreduce_ring_bytes_per_s

    def large_allreduce_algorithm(self, tp: int) -> str | None:
        """Which of NCCL's algorithms moves a large message among `tp` GPUs faster: "NVLink
        SHARP" (in groups of at least `large_allreduce_nvls_min_tp`) or "ring"; None without
        a large-message fit or an algorithm for this group."""
        if self.large_allreduce_call_s is None or tp <= 1:
            return None
        ring_algbw = self.large_allreduce_ring_bytes_per_s * tp / (2.0 * (tp - 1))
        nvls = tp >= self.large_allreduce_nvls_min_tp
        if nvls and self.large_allreduce_nvls_bytes_per_s > ring_algbw:
            return "NVLink SHARP"
        return "ring" if ring_algbw > 0 else None

    def group_bandwidth(self, tp: int) -> float:
        """Bytes/s per direction one GPU of a `tp`-GPU group can send to the others: the whole
        attachment through a switch, `tp - 1` of the `mesh_links` links of a full mesh."""
        if self.mesh_links and tp > 1:
            return self.bandwidth_bytes_per_s * min(tp - 1, self.mesh_links) / self.mesh_links
        return self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class Accelerator:
    """One accelerator (one GPU, one OAM package, one Apple GPU, or the host CPU)."""

    name: str
    bf16_tflops: float  # dense BF16/FP16, TFLOP/s
    fp8_tflops: float | None  # dense FP8, TFLOP/s
    fp32_tflops: float | None
    memory_bytes: int
    mem_bw_bytes_per_s: float
    int8_tops: float | None = None  # dense INT8 tensor TOP/s (w8a8); None: no INT8 tensor path
    fp4_tflops: float | None = None  # dense FP4 (NVFP4 / MXFP4) tensor TFLOP/s; None: no FP4 units
    scale_up_link: str | None = None
    pcie: str | None = None
    scale_out: str | None = None
    price_per_hour: float | None = None  # USD per accelerator-hour
    matmul_efficiency: float | None = None  # measured max-achievable matmul / peak
    sm_count: int | None = None  # streaming multiprocessors / compute units (wave quantization)
    arch: str = ""  # kernel family in kernels.yaml (hopper, ampere, ...); "" for none
    description: str = ""
    vendor: str = ""
    placeholder: bool = False  # figures are placeholders until calibrated (cpu)
    inline_links: dict[str, Link] = field(default_factory=dict, compare=False, hash=False)

    def peak_flops(self, compute: str) -> float:
        """Peak dense FLOP/s (OP/s for int8) of GEMMs that multiply in `compute`: bf16/fp16
        (also weight-only int4, W4A16), fp8, fp4 and int8 (W8A8 / W4A4, on those units
        only), fp32."""
        if compute in ("bf16", "fp16", "int4"):
            return self.bf16_tflops * 1e12
        if compute in ("fp8", "fp4", "int8"):
            field_name = "int8_tops" if compute == "int8" else f"{compute}_tflops"
            peak = getattr(self, field_name)
            if not peak:
                raise ValueError(f"hardware {self.name!r} has no {compute.upper()} tensor units "
                                 f"({field_name} is null)")
            return peak * 1e12
        if compute == "fp32":
            if self.fp32_tflops is None:
                raise ValueError(f"hardware {self.name!r} has no fp32_tflops figure; use bf16")
            return self.fp32_tflops * 1e12
        raise ValueError(f"unknown dtype {compute!r}; expected fp32, bf16, fp16, fp8, fp4, int8 or int4")

    def link(self, kind: str) -> Link | None:
        """The `scale_up_link`, `pcie` or `scale_out` link (None where the part has none)."""
        if kind not in LINK_KINDS:
            raise ValueError(f"link kind must be one of {LINK_KINDS}, got {kind!r}")
        name = getattr(self, kind)
        if name is None:
            return None
        return self.inline_links.get(name) or get_link(name)

    def intra_node_link(self) -> Link:
        """The link tensor/pipeline parallel traffic uses: scale-up, else PCIe, else loopback."""
        return self.link("scale_up_link") or self.link("pcie") or get_link("loopback")


# ----------------------------------------------------------------------------- loading


@cache
def _catalog(filename: str) -> dict[str, dict[str, Any]]:
    data = read_catalog(filename)
    if not isinstance(data, dict):
        raise ValueError(f"simulator/catalog/{filename}: expected a mapping of entries")
    return {normalize_name(k): v for k, v in data.items()}


def list_accelerators() -> list[str]:
    """Catalog accelerator names, in catalog order."""
    return list(_catalog("hardware.yaml"))


def list_links() -> list[str]:
    """Catalog link names, in catalog order."""
    return list(_catalog("links.yaml"))


def _check_keys(where: str, spec: dict[str, Any], allowed: set[str]) -> None:
    bad = sorted(set(spec) - allowed)
    if bad:
        raise ValueError(f"{where}: unknown field(s) {bad}; expected some of {sorted(allowed)}")


def _apply_overrides(where: str, base: dict[str, Any], spec: dict[str, Any],
                     numeric: tuple[str, ...]) -> dict[str, Any]:
    """`base` updated by explicit fields of `spec`, then multiplied by `<field>_scale`."""
    out = dict(base)
    for key, value in spec.items():
        if key in ("base",) or key.endswith("_scale"):
            continue
        out[key] = value
    for key, value in spec.items():
        if not key.endswith("_scale"):
            continue
        target = key[: -len("_scale")]
        if not _is_real(value) or value <= 0:
            raise ValueError(f"{where}: {key} must be a positive number, got {value!r}")
        if out.get(target) is None:
            raise ValueError(f"{where}: cannot scale {target}: the base has no value for it")
        if not _is_real(out[target]):
            raise ValueError(f"{where}: cannot scale {target}: {out[target]!r} is not a number")
        out[target] = out[target] * value
    return out


def _is_real(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _number(where: str, entry: dict[str, Any], key: str, required: bool) -> float | None:
    value = entry.get(key)
    if value is None:
        if required:
            raise ValueError(f"{where}: field {key!r} is required (a positive number)")
        return None
    if not _is_real(value) or value < 0:
        raise ValueError(f"{where}: field {key!r} must be a finite non-negative number, "
                         f"got {value!r}")
    return float(value)


def _field_group(where: str, entry: dict[str, Any], keys: tuple[str, ...],
                 what: str) -> dict[str, float | None]:
    """`keys` of a catalog entry that go together: every one given, or none."""
    values = {k: _number(where, entry, k, False) for k in keys}
    missing = [k for k, v in values.items() if v is None]
    if missing and len(missing) != len(keys):
        raise ValueError(f"{where}: {what} needs {', '.join(keys)} together; "
                         f"missing {', '.join(missing)}")
    return values


def _link_from_entry(name: str, entry: dict[str, Any], where: str) -> Link:
    _check_keys(where, entry, {"name", "description", *LINK_NUMERIC})
    bw = _number(where, entry, "bandwidth_gb_s", True)
    lat = _number(where, entry, "latency_us", True)
    if not bw:
        raise ValueError(f"{where}: bandwidth_gb_s must be > 0")
    fit = _field_group(where, entry, ALLREDUCE_FIT, "an all-reduce fit")
    eff = fit["allreduce_efficiency"]
    if eff is not None and not 0 < eff <= 1:
        raise ValueError(f"{where}: allreduce_efficiency must be in (0, 1], got {eff}")
    mesh = _number(where, entry, "mesh_links", False)
    if mesh is not None and (mesh < 1 or mesh != int(mesh)):
        raise ValueError(f"{where}: mesh_links must be a positive integer, got {entry['mesh_links']!r}")
    large = _field_group(where, entry, LARGE_ALLREDUCE_FIT, "a large-message all-reduce fit")
    large_call = large["large_allreduce_call_us"]
    if large_call is not None and not (large["large_allreduce_nvls_gb_s"]
                                       or large["large_allreduce_ring_gb_s"]):
        raise ValueError(f"{where}: large_allreduce_nvls_gb_s or large_allreduce_ring_gb_s must be "
                         f"> 0 (0 only for the one the link lacks)")
    nvls_tp = large["large_allreduce_nvls_min_tp"]
    if nvls_tp is not None and (nvls_tp < 1 or nvls_tp != int(nvls_tp)):
        raise ValueError(f"{where}: large_allreduce_nvls_min_tp must be a positive integer, got "
                         f"{entry['large_allreduce_nvls_min_tp']!r}")
    call = fit["allreduce_call_us"]
    return Link(name=name, bandwidth_bytes_per_s=bw * 1e9, latency_s=lat * 1e-6,
                description=str(entry.get("description", "")),
                allreduce_call_s=None if call is None else call * 1e-6,
                allreduce_rank_s=(fit["allreduce_rank_us"] or 0.0) * 1e-6,
                allreduce_efficiency=eff, mesh_links=None if mesh is None else int(mesh),
                large_allreduce_call_s=None if large_call is None else large_call * 1e-6,
                large_allreduce_nvls_bytes_per_s=(large["large_allreduce_nvls_gb_s"] or 0.0) * 1e9,
                large_allreduce_nvls_min_tp=int(nvls_tp or 0),
                large_allreduce_ring_bytes_per_s=(large["large_allreduce_ring_gb_s"] or 0.0) * 1e9)


def get_link(name_or_spec: str | dict[str, Any]) -> Link:
    """A link by catalog name, or a hypothetical one from a dict (see module docstring)."""
    catalog = _catalog("links.yaml")
    if isinstance(name_or_spec, str):
        key = normalize_name(name_or_spec)
        if key not in catalog:
            raise unknown_name_error("link", name_or_spec, catalog)
        return _link_from_entry(key, catalog[key], f"links.yaml:{key}")
    if not isinstance(name_or_spec, dict):
        raise ValueError(f"link must be a name or a mapping, got {type(name_or_spec).__name__}")
    spec = name_or_spec
    allowed = {"base", "name", "description", *LINK_NUMERIC, *(f"{k}_scale" for k in LINK_NUMERIC)}
    _check_keys("inline link", spec, allowed)
    base: dict[str, Any] = {}
    name = spec.get("name")
    if "base" in spec:
        base_key = normalize_name(str(spec["base"]))
        if base_key not in catalog:
            raise unknown_name_error("link", str(spec["base"]), catalog)
        base = catalog[base_key]
        name = name or f"{base_key}-custom"
    if not name:
        raise ValueError("inline link: give a 'name' or a 'base'")
    entry = _apply_overrides(f"inline link {name!r}", base, spec, LINK_NUMERIC)
    return _link_from_entry(str(name), entry, f"inline link {name!r}")


def _check_renamed(where: str, spec: dict[str, Any]) -> None:
    for old, new in RENAMED_FIELDS.items():
        for key in (old, f"{old}_scale"):
            if key in spec:
                raise ValueError(f"{where}: field {key!r} is now {key.replace(old, new)!r} "
                                 f"(GiB, 2^30 bytes, as `kvpd hardware show` prints it)")


def _accelerator_from_entry(name: str, entry: dict[str, Any], where: str) -> Accelerator:
    _check_renamed(where, entry)
    _check_keys(where, entry, {"name", "placeholder", "aliases", *ACCEL_NUMERIC, *ACCEL_TEXT})
    for key in ACCEL_TEXT:  # (a link may also be an inline mapping)
        value = entry.get(key)
        if value is not None and not isinstance(value, str) and not (
                key in LINK_KINDS and isinstance(value, dict)):
            raise ValueError(f"{where}: field {key!r} must be a string"
                             + (" or an inline link mapping" if key in LINK_KINDS else "")
                             + f", got {value!r}")
    nums = {k: _number(where, entry, k, k in ACCEL_REQUIRED) for k in ACCEL_NUMERIC}
    if not nums["bf16_tflops"] or not nums["mem_bw_tbps"] or not nums["memory_gib"]:
        raise ValueError(f"{where}: bf16_tflops, memory_gib and mem_bw_tbps must be > 0")
    sms = nums["sm_count"]
    if sms is not None and (sms < 1 or sms != int(sms)):
        raise ValueError(f"{where}: sm_count must be a positive integer, got {sms}")
    eff = nums["matmul_efficiency"]
    if eff is not None and not 0 < eff <= 1:
        raise ValueError(f"{where}: matmul_efficiency must be in (0, 1], got {eff}")
    inline: dict[str, Link] = {}
    links: dict[str, str | None] = {}
    for kind in LINK_KINDS:
        value = entry.get(kind)
        if isinstance(value, dict):
            link = get_link(value)
            inline[link.name] = link
            links[kind] = link.name
        elif value is None:
            links[kind] = None
        else:
            links[kind] = get_link(str(value)).name  # validates the name
    return Accelerator(
        name=name,
        bf16_tflops=nums["bf16_tflops"],
        fp8_tflops=nums["fp8_tflops"],
        fp32_tflops=nums["fp32_tflops"],
        int8_tops=nums["int8_tops"],
        fp4_tflops=nums["fp4_tflops"],
        memory_bytes=int(nums["memory_gib"] * GIB),
        mem_bw_bytes_per_s=nums["mem_bw_tbps"] * 1e12,
        scale_up_link=links["scale_up_link"],
        pcie=links["pcie"],
        scale_out=links["scale_out"],
        price_per_hour=nums["price_per_hour"],
        matmul_efficiency=eff,
        sm_count=None if sms is None else int(sms),
        arch=str(entry.get("arch") or ""),
        description=str(entry.get("description", "")),
        vendor=str(entry.get("vendor", "")),
        placeholder=bool(entry.get("placeholder", False)),
        inline_links=inline,
    )


def _accel_aliases() -> dict[str, str]:
    """Alias -> catalog key: the exact device names CUDA / ROCm report for a part (`aliases`
    in hardware.yaml), never a look-alike."""
    out: dict[str, str] = {}
    for key, entry in _catalog("hardware.yaml").items():
        for alias in entry.get("aliases") or ():
            out[normalize_name(str(alias))] = key
    return out


def _resolve_accel_name(name: str) -> str:
    """The catalog key of `name` or of a device name it lists; an unknown name is refused with
    the closest names (never mapped to another part: an A10 is not an A10G)."""
    catalog = _catalog("hardware.yaml")
    key = normalize_name(name)
    if key in catalog:
        return key
    alias = device_alias(name)
    if alias is not None:
        return alias
    raise unknown_name_error("hardware", name, catalog)


def device_alias(name: str) -> str | None:
    """The catalog key of the part whose `aliases` list `name` (a device name CUDA / ROCm
    report), else None."""
    return _accel_aliases().get(normalize_name(name))


def device_names(key: str) -> tuple[str, ...]:
    """The device names CUDA / ROCm report for catalog part `key` (its `aliases`, as written;
    () for a part without any or a name not in the catalog)."""
    entry = _catalog("hardware.yaml").get(key) or {}
    return tuple(str(a) for a in entry.get("aliases") or ())


# keys of a scenario's `hardware` mapping that say how to run the part, not what it is
# (a calibration file and its serving probe: simulator.cluster.resolve_hardware)
RUN_KEYS = ("calibration", "serving_speed", "serving_loop")


def scenario_accelerator(spec: str | dict[str, Any]) -> Accelerator:
    """The part a scenario's `hardware` value names, its run keys (RUN_KEYS) left aside."""
    if isinstance(spec, dict):
        spec = {k: v for k, v in spec.items() if k not in RUN_KEYS}
    return get_accelerator(spec)


def get_accelerator(name_or_spec: str | dict[str, Any]) -> Accelerator:
    """An accelerator by exact catalog name, or a hypothetical one from a dict.

    Dict keys: `base` (catalog name), `name`, any catalog field (`bf16_tflops`, `memory_gib`,
    `mem_bw_tbps`, `scale_up_link` (name or inline link dict), ...), and `<numeric field>_scale`
    factors. Unknown names raise ValueError listing close matches.
    """
    catalog = _catalog("hardware.yaml")
    if isinstance(name_or_spec, str):
        key = _resolve_accel_name(name_or_spec)
        return _accelerator_from_entry(key, catalog[key], f"hardware.yaml:{key}")
    if not isinstance(name_or_spec, dict):
        raise ValueError(
            f"hardware must be a name or a mapping, got {type(name_or_spec).__name__}")
    spec = name_or_spec
    _check_renamed("inline hardware", spec)
    allowed = {"base", "name", "placeholder", *ACCEL_NUMERIC, *ACCEL_TEXT,
               *(f"{k}_scale" for k in ACCEL_NUMERIC)}
    _check_keys("inline hardware", spec, allowed)
    base: dict[str, Any] = {}
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"inline hardware: field 'name' must be a string, got {name!r}")
    if "base" in spec:
        base_key = _resolve_accel_name(str(spec["base"]))
        base = catalog[base_key]
        if not name:
            changed = [k for k in spec if k not in ("base", "name")]
            name = base_key + ("-custom" if changed else "")
    if not name:
        raise ValueError("inline hardware: give a 'name' or a 'base'")
    entry = _apply_overrides(f"inline hardware {name!r}", base, spec, ACCEL_NUMERIC)
    return _accelerator_from_entry(str(name), entry, f"inline hardware {name!r}")

