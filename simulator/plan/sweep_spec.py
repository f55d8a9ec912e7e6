"""Sweep files: a base scenario plus axes over any scenario key, expanded into points.

Schema (YAML; unknown keys are refused)::

    name: batching                  # default: the file's stem
    base: ../quickstart.yaml        # base scenario, relative to this file
    set:                            # overrides for every point: mapping or ["k=v", ...]
      workload.window_s: [0, 60]
    mode: grid                      # grid (default) | random | lhs (Latin hypercube)
    samples: 32                     # random / lhs: number of points drawn
    seed: 0                         # random / lhs: sampling seed
    out: runs/sweeps/batching       # results folder, relative to the current folder
    cost_table: {h200-sxm: 3.50}    # USD per accelerator-hour, over the catalog's prices
    axes:
      scheduler.max_num_batched_tokens: [2048, 4096, 8192]          # values
      workload.target_rate: {min: 2, max: 16, num: 8, log: true}    # range
      scheduler.max_num_seqs: {min: 16, max: 256, integer: true}
      pd_split:                                                     # linked axis
        linked:
          - {cluster.pd.prefill.replicas: 1, cluster.pd.decode.replicas: 3}
          - {cluster.pd.prefill.replicas: 2, cluster.pd.decode.replicas: 2}

A grid takes the product of every axis (a range needs `num` there); random and lhs draw
`samples` points, ranges uniformly (or log-uniformly) and value lists / linked axes as
categories. Every point is validated as a full scenario before any simulation runs.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulator.plan.keys import build_scenario, check_key, integer_key, set_path
from simulator.scenario import Scenario, parse_override, read_scenario_yaml
from simulator.yaml_file import read_yaml_mapping

SPEC_KEYS = ("name", "description", "base", "set", "mode", "samples", "seed", "out", "cost_table",
             "axes")
RANGE_KEYS = ("min", "max", "num", "log", "integer")
MODES = ("grid", "random", "lhs")
# A grid past this many points is almost surely a typo (a list where a range was meant).
MAX_POINTS = 100_000
# Range samples are rounded to this many significant digits so tables and ids stay readable.
SIG_DIGITS = 6


@dataclass(frozen=True)
class Axis:
    """One sweep axis: `name` is a scenario key, or a label for a linked axis."""

    name: str
    values: tuple[Any, ...] = ()  # explicit values (or one dict of key -> value per linked entry)
    lo: float | None = None
    hi: float | None = None
    num: int | None = None
    log: bool = False
    integer: bool = False
    linked: bool = False

    @property
    def is_range(self) -> bool:
        return self.lo is not None

    def scenario_keys(self) -> list[str]:
        """The scenario keys this axis sets."""
        if self.linked:
            return list(dict.fromkeys(k for v in self.values for k in v))
        return [self.name]

    def grid_values(self) -> list[Any]:
        if not self.is_range:
            return list(self.values)
        if self.num is None:
            raise ValueError(f"axes.{self.name}: a range needs 'num' in a grid sweep "
                             f"(or use mode: random / lhs)")
        u = np.linspace(0.0, 1.0, self.num) if self.num > 1 else np.array([0.0])
        return [self.at(float(x), endpoint=True) for x in u]

    def at(self, u: float, endpoint: bool = False) -> Any:
        """The value at quantile u in [0, 1) (in [0, 1] with `endpoint`)."""
        if not self.is_range:
            return self.values[min(int(u * len(self.values)), len(self.values) - 1)]
        lo, hi = float(self.lo), float(self.hi)
        if self.integer:
            if endpoint:
                x = lo + u * (hi - lo) if not self.log else math.exp(
                    math.log(lo) + u * (math.log(hi) - math.log(lo)))
                return int(round(x))
            # floor over [lo, hi + 1) gives every integer the same share
            if self.log:
                x = math.exp(math.log(lo) + u * (math.log(hi + 1) - math.log(lo)))
            else:
                x = lo + u * (hi + 1 - lo)
            return int(min(math.floor(x), hi))
        x = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))) if self.log \
            else lo + u * (hi - lo)
        return _round_sig(x)


@dataclass(frozen=True)
class Point:
    """One sweep point: the overrides it applies and its axis values (for the table)."""

    index: int
    overrides: dict[str, Any]
    axes: dict[str, Any]

    @property
    def point_id(self) -> str:
        return point_id(self.overrides)


@dataclass
class SweepSpec:
    """A loaded, validated sweep: base scenario data, axes and the expanded points."""

    name: str
    source: str
    base_data: dict[str, Any]
    base_source: str
    base_dir: str
    axes: list[Axis]
    mode: str = "grid"
    samples: int | None = None
    seed: int = 0
    out: str | None = None
    description: str = ""
    cost_table: dict[str, float] = field(default_factory=dict)
    points: list[Point] = field(default_factory=list)

    def fingerprint(self) -> str:
        """A stable hash of the base scenario (after `set`): results of another base differ."""
        text = json.dumps({"base": self.base_data, "dir": self.base_dir}, sort_keys=True,
                          default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def scenario(self, point: Point) -> Scenario:
        return build_scenario(self.base_data, point.overrides, self.base_source, self.base_dir)


def point_id(overrides: dict[str, Any]) -> str:
    """A stable id for a point from its overrides (key order does not matter)."""
    text = json.dumps(overrides, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _round_sig(x: float, digits: int = SIG_DIGITS) -> float:
    return float(f"{x:.{digits}g}")


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{where}: expected a finite number, got {v!r}")
    return float(v)


def parse_axis(name: Any, spec: Any, where: str) -> Axis:
    """One `axes` entry: a list of values, a range mapping, or `{linked: [...]}`."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: axis names must be non-empty strings, got {name!r}")
    w = f"{where}.{name}"
    if isinstance(spec, dict) and "linked" in spec:
        if set(spec) != {"linked"}:
            raise ValueError(f"{w}: a linked axis takes only 'linked' (a list of key: value mappings)")
        entries = spec["linked"]
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"{w}.linked: empty sweep axis; expected a non-empty list of mappings")
        for i, e in enumerate(entries):
            if not isinstance(e, dict) or not e:
                raise ValueError(f"{w}.linked[{i}]: expected a mapping of scenario key -> value")
            for k in e:
                check_key(str(k), f"{w}.linked[{i}]")
        return Axis(name, tuple(dict(e) for e in entries), linked=True)
    check_key(name, where)
    if isinstance(spec, list):
        if not spec:
            raise ValueError(f"{w}: empty sweep axis; give at least one value")
        return Axis(name, tuple(spec))
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - set(RANGE_KEYS))
        if unknown or "min" not in spec or "max" not in spec:
            raise ValueError(f"{w}: a range takes {', '.join(RANGE_KEYS)} (min and max required)"
                             + (f"; unknown: {', '.join(map(str, unknown))}" if unknown else ""))
        lo, hi = _number(spec["min"], f"{w}.min"), _number(spec["max"], f"{w}.max")
        if not lo <= hi:
            raise ValueError(f"{w}: needs min <= max, got min={lo:g} max={hi:g}")
        log, integer = spec.get("log", False), spec.get("integer", False)
        if not isinstance(log, bool) or not isinstance(integer, bool):
            raise ValueError(f"{w}: 'log' and 'integer' must be true or false")
        if log and lo <= 0:
            raise ValueError(f"{w}: a log range needs min > 0, got {lo:g}")
        if not integer and integer_key(name):
            raise ValueError(f"{w}: {name} takes whole numbers, and a range samples real "
                             "ones; add integer: true")
        num = spec.get("num")
        if num is not None and (isinstance(num, bool) or not isinstance(num, int) or num < 1):
            raise ValueError(f"{w}.num: expected an integer >= 1, got {num!r}")
        return Axis(name, lo=lo, hi=hi, num=num, log=log, integer=integer)
    raise ValueError(f"{w}: expected a list of values, a range {{min, max, num}} or "
                     f"{{linked: [...]}}, got {spec!r}")


def _short(key: str) -> str:
    """The last two parts of a key path ("cluster.pd.prefill.replicas" -> "prefill.replicas")."""
    return ".".join(key.split(".")[-2:])


def _point(index: int, axes: list[Axis], choice: list[Any]) -> Point:
    overrides: dict[str, Any] = {}
    labels: dict[str, Any] = {}
    for axis, value in zip(axes, choice):
        if axis.linked:
            overrides.update(value)
            labels[axis.name] = ",".join(f"{_short(k)}={v}" for k, v in value.items())
        else:
            overrides[axis.name] = value
            labels[axis.name] = value
    return Point(index, overrides, labels)


def expand(axes: list[Axis], mode: str, samples: int | None, seed: int) -> list[Point]:
    """The sweep's points, in a stable order; duplicates (same overrides) are dropped."""
    if mode == "grid":
        lists = [a.grid_values() for a in axes]
        total = math.prod(len(v) for v in lists)
        if total > MAX_POINTS:
            raise ValueError(f"the grid has {total} points (> {MAX_POINTS}); shrink an axis or "
                             f"use mode: random / lhs with samples")
        choices = list(itertools.product(*lists))
    else:
        if samples is None:
            raise ValueError(f"mode {mode}: needs 'samples' (number of points to draw)")
        if mode == "lhs":
            from scipy.stats import qmc

            u = qmc.LatinHypercube(d=len(axes), seed=seed).random(samples)
        else:
            u = np.random.default_rng(seed).random((samples, len(axes)))
        choices = [[a.at(float(x)) for a, x in zip(axes, row)] for row in u]
    points, seen = [], set()
    for choice in choices:
        p = _point(len(points), axes, list(choice))
        if p.point_id not in seen:
            seen.add(p.point_id)
            points.append(p)
    return points


def _set_overrides(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if isinstance(raw, dict):
        items = list(raw.items())
    elif isinstance(raw, list):
        items = []
        for text in raw:
            path, value = parse_override(str(text))
            items.append((".".join(path), value))
    else:
        raise ValueError(f"{where}: expected a mapping of key: value or a list of 'key=value'")
    for k, _ in items:
        check_key(str(k), where)
    return {str(k): v for k, v in items}


def _validate_points(spec: SweepSpec) -> None:
    """Build every point's scenario; report the first bad ones, naming their overrides; then
    refuse a `cost_table` name that is neither a catalog part nor one a point runs on."""
    from simulator.plan.pricing import check_cost_table_names, cluster_cost
    from simulator.preflight import preflight

    errors = []
    used: list[str] = []
    for p in spec.points:
        try:
            sc = spec.scenario(p)
            preflight(sc)
            if spec.cost_table:
                cost = cluster_cost(sc, spec.cost_table)
                used += [price[0] for price in cost.prices] + list(cost.unpriced)
        except (ValueError, FileNotFoundError) as exc:
            errors.append(f"point {p.index} {json.dumps(p.overrides, default=str)}:\n  "
                          + str(exc).replace("\n", "\n  "))
            if len(errors) >= 3:
                break
    if errors:
        raise ValueError(f"{spec.source}: invalid sweep values (base scenario {spec.base_source})\n"
                         + "\n".join(errors))
    check_cost_table_names(spec.cost_table, list(dict.fromkeys(used)), f"{spec.source}: cost_table",
                           "point")


def load_sweep(path: str | Path, overrides: list[str] | None = None) -> SweepSpec:
    """Read and validate a sweep file; `overrides` ("k=v") apply to the base scenario."""
    path = Path(path)
    raw = read_yaml_mapping(path, "sweep")
    return sweep_from_dict(raw, str(path), str(path.resolve().parent), overrides)


def sweep_from_dict(raw: Any, source: str = "<sweep>", base_dir: str = ".",
                    overrides: list[str] | None = None) -> SweepSpec:
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: a sweep must be a YAML mapping")
    unknown = sorted(set(map(str, raw)) - set(SPEC_KEYS))
    if unknown:
        close = {u: difflib.get_close_matches(u, SPEC_KEYS, n=1) for u in unknown}
        hints = ", ".join(f"{u}" + (f" (did you mean {c[0]}?)" if c else "") for u, c in close.items())
        raise ValueError(f"{source}: unknown keys {hints}; allowed: {', '.join(SPEC_KEYS)}")
    if not raw.get("base"):
        raise ValueError(f"{source}: 'base' (the base scenario file) is required")
    base_path = Path(raw["base"]).expanduser()
    if not base_path.is_absolute():
        base_path = Path(base_dir) / base_path
    if not base_path.is_file():
        raise FileNotFoundError(f"{source}: base scenario not found: {base_path}")
    base_data = read_scenario_yaml(base_path)
    common = _set_overrides(raw.get("set"), f"{source}: set")
    common.update(_set_overrides(list(overrides or []), "--set"))
    for k, v in common.items():
        set_path(base_data, k, v)
    mode = raw.get("mode", "grid")
    if mode not in MODES:
        raise ValueError(f"{source}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    samples, seed = raw.get("samples"), raw.get("seed", 0)
    for key, val, lo in (("samples", samples, 1), ("seed", seed, 0)):
        if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < lo):
            raise ValueError(f"{source}: {key} must be an integer >= {lo}, got {val!r}")
    axes_raw = raw.get("axes")
    if not axes_raw:
        raise ValueError(f"{source}: empty sweep: 'axes' must map at least one scenario key to "
                         f"values, e.g. axes: {{scheduler.max_num_seqs: [64, 128]}}")
    if not isinstance(axes_raw, dict):
        raise ValueError(f"{source}: axes must be a mapping of scenario key -> values")
    axes = [parse_axis(k, v, f"{source}: axes") for k, v in axes_raw.items()]
    keys = [k for a in axes for k in a.scenario_keys()]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ValueError(f"{source}: axes set {', '.join(dup)} more than once")
    cost_table = raw.get("cost_table") or {}
    if not isinstance(cost_table, dict):
        raise ValueError(f"{source}: cost_table must map accelerator names to USD per hour")
    for k, v in cost_table.items():
        if _number(v, f"{source}: cost_table.{k}") < 0:
            raise ValueError(f"{source}: cost_table.{k}: expected a price >= 0 in USD per hour, "
                             f"got {v!r}")
    name = raw.get("name") or Path(source).stem
    spec = SweepSpec(
        name=str(name), source=source, base_data=base_data, base_source=str(base_path),
        base_dir=str(base_path.resolve().parent), axes=axes, mode=mode, samples=samples,
        seed=int(seed), out=raw.get("out"), description=str(raw.get("description", "")),
        cost_table={str(k): float(v) for k, v in cost_table.items()},
    )
    spec.points = expand(axes, mode, samples, spec.seed)
    _validate_points(spec)
    return spec
