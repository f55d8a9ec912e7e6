"""Validation helpers for the plain-dict specs of `synthesize` (and the lengths loader).

Every error is a ValueError that names the key (dotted path) and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def check_mapping(spec: Any, where: str) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected a mapping (dict), got {type(spec).__name__}")
    return spec


def check_keys(
    spec: dict[str, Any], allowed: Iterable[str], where: str, context: str | None = None
) -> None:
    """Unknown keys -> ValueError listing the allowed ones (`context`, e.g. 'process gamma')."""
    allowed = list(allowed)
    for key in spec:
        if key not in allowed:
            ctx = f" for {context}" if context else ""
            raise ValueError(f"{where}.{key}: unknown key{ctx}; allowed keys: {', '.join(allowed)}")


def require(spec: dict[str, Any], key: str, where: str, what: str) -> Any:
    if key not in spec:
        raise ValueError(f"{where}.{key}: required ({what})")
    return spec[key]


def number(
    spec: dict[str, Any],
    key: str,
    where: str,
    *,
    default: Any = ...,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    integer: bool = False,
) -> Any:
    """spec[key] as a float (or int if `integer`) within [lo, hi] (lo excluded if `lo_open`)."""
    if key not in spec:
        if default is ...:
            raise ValueError(f"{where}.{key}: required ({_range_text(lo, hi, lo_open, integer)})")
        return default
    value = spec[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and integer:
        ok = float(value).is_integer()
    if ok:
        ok = math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        raise ValueError(
            f"{where}.{key}: expected {_range_text(lo, hi, lo_open, integer)}, got {value!r}"
        )
    return int(value) if integer else float(value)


def boolean(spec: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = spec.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def choice(
    spec: dict[str, Any], key: str, where: str, allowed: Iterable[str], default: Any = ...
) -> str:
    allowed = list(allowed)
    if key not in spec:
        if default is ...:
            raise ValueError(f"{where}.{key}: required (one of {', '.join(allowed)})")
        return default
    value = spec[key]
    if value not in allowed:
        raise ValueError(f"{where}.{key}: expected one of {', '.join(allowed)}, got {value!r}")
    return value


def _range_text(lo: float | None, hi: float | None, lo_open: bool, integer: bool) -> str:
    kind = "an integer" if integer else "a number"
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"<= {hi:g}")
    return kind + (" " + " and ".join(parts) if parts else "")
