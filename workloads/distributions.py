"""Token-length distributions for synthetic traffic (integers >= 1), seeded.

Schema of a length mapping (`prompt_len` / `output_len` in a synthesize spec):

- `{dist: fixed, value: n}`
- `{dist: uniform, min: a, max: b}`: integers a..b inclusive
- `{dist: lognormal, mean: m | median: m, sigma: s, min: 1, max: none}`: exp(N(mu, s^2))
  rounded to the nearest integer, then clipped to [min, max]; `mean` is the mean of the
  unclipped distribution (mu = ln(mean) - s^2/2), `median` gives mu = ln(median)
- `{dist: zipf, s: exponent > 0, min: 1, max: b}`: P(v) proportional to (v - min + 1)^-s on min..b
- `{dist: trace, path: file, format: none, field: prompt_len|output_len, min, max, ...}`:
  resampled with replacement from a loaded trace (`field` defaults to the key being
  drawn; extra keys `columns`, `skip_invalid` and loader options in `options` go to
  `load_trace`); when `prompt_len` and `output_len` both resample the same file, the
  pairs are drawn together so their correlation is kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from workloads.spec import check_keys, check_mapping, choice, number, require

DISTS = ("fixed", "uniform", "lognormal", "zipf", "trace")
_KEYS = {
    "fixed": ("dist", "value"),
    "uniform": ("dist", "min", "max"),
    "lognormal": ("dist", "mean", "median", "sigma", "min", "max"),
    "zipf": ("dist", "s", "min", "max"),
    "trace": (
        "dist",
        "path",
        "format",
        "field",
        "min",
        "max",
        "columns",
        "skip_invalid",
        "options",
    ),
}
# Largest support of a bounded Zipf (probabilities are tabulated: 8 bytes per value).
MAX_ZIPF_SUPPORT = 10_000_000


def validate_length(spec: Any, where: str) -> dict[str, Any]:
    """Checked, normalised copy of a length mapping (ValueError names the bad key)."""
    spec = check_mapping(spec, where)
    dist = choice(spec, "dist", where, DISTS)
    check_keys(spec, _KEYS[dist], where, f"dist {dist}")
    out: dict[str, Any] = {"dist": dist}
    if dist == "fixed":
        out["value"] = number(spec, "value", where, lo=1, integer=True)
        return out
    if dist == "uniform":
        out["min"] = number(spec, "min", where, lo=1, integer=True)
        out["max"] = number(spec, "max", where, lo=out["min"], integer=True)
        return out
    out["min"] = number(spec, "min", where, default=1, lo=1, integer=True)
    out["max"] = number(spec, "max", where, default=None, lo=out["min"], integer=True)
    if dist == "lognormal":
        if ("mean" in spec) == ("median" in spec):
            raise ValueError(f"{where}: give exactly one of mean and median (tokens, > 0)")
        out["sigma"] = number(spec, "sigma", where, lo=0)
        if "mean" in spec:
            out["mu"] = (
                np.log(number(spec, "mean", where, lo=0, lo_open=True)) - out["sigma"] ** 2 / 2
            )
        else:
            out["mu"] = float(np.log(number(spec, "median", where, lo=0, lo_open=True)))
    elif dist == "zipf":
        out["s"] = number(spec, "s", where, lo=0, lo_open=True)
        out["max"] = number(spec, "max", where, lo=out["min"], integer=True)
        if out["max"] - out["min"] + 1 > MAX_ZIPF_SUPPORT:
            raise ValueError(f"{where}: max - min + 1 must be <= {MAX_ZIPF_SUPPORT}")
    else:
        path = require(spec, "path", where, "a trace file")
        if not isinstance(path, (str, Path)):
            raise ValueError(f"{where}.path: expected a file path, got {path!r}")
        out["path"] = str(path)
        out["format"] = spec.get("format")
        out["field"] = choice(spec, "field", where, ("prompt_len", "output_len"), default=None)
        out["columns"] = spec.get("columns")
        out["skip_invalid"] = bool(spec.get("skip_invalid", False))
        out["options"] = check_mapping(spec.get("options", {}), f"{where}.options")
    return out


def draw_lengths(spec: dict[str, Any], n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` lengths (int64 tokens) from a validated non-trace length spec."""
    dist = spec["dist"]
    if dist == "fixed":
        return np.full(n, spec["value"], dtype=np.int64)
    if dist == "uniform":
        return rng.integers(spec["min"], spec["max"], size=n, endpoint=True, dtype=np.int64)
    if dist == "lognormal":
        values = np.rint(rng.lognormal(spec["mu"], spec["sigma"], size=n))
        return clip_lengths(values, spec)
    if dist == "zipf":
        support = np.arange(spec["min"], spec["max"] + 1, dtype=np.int64)
        weights = (support - spec["min"] + 1).astype(np.float64) ** -spec["s"]
        cdf = np.cumsum(weights)
        picks = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
        return support[np.minimum(picks, len(support) - 1)]
    raise ValueError(f"draw_lengths: dist {dist!r} needs a loaded trace (use resample_lengths)")


def resample_lengths(source: np.ndarray, spec: dict[str, Any], picks: np.ndarray) -> np.ndarray:
    """`source[picks]` clipped to the spec's [min, max]."""
    return clip_lengths(source[picks], spec)


def clip_lengths(values: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    hi = spec.get("max")
    out = np.clip(values, spec.get("min", 1), hi if hi is not None else np.inf)
    return out.astype(np.int64)
