"""Field specs and the scalar value parsers used on the row-by-row (error) path.

Each parser takes the raw cell (a CSV string or a JSON value) and returns the
parsed value, or raises `BadValue(expected)`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date
from typing import Any

# Kinds of field. datetime: wall clock -> int64 ns since the Unix epoch (UTC if no offset);
# number: finite float >= 0; count: integer >= 0 (tokens); int: any integer (ids);
# ids: list of integers >= 0 (JSON list, or space-separated in CSV); str: text.
KINDS = ("datetime", "number", "count", "int", "ids", "str")

EXPECTED = {
    "datetime": "a timestamp like 2023-11-16 18:15:46.6805900",
    "number": "a non-negative number",
    "count": "a non-negative integer",
    "int": "an integer",
    "ids": "a list of non-negative integers",
    "str": "text",
}


@dataclass(frozen=True)
class Field:
    """Maps a source column / JSON key to an output key with a value kind."""

    key: str  # output key, e.g. "arrival", "prompt_len", "model"
    column: str  # column name in the CSV header or key in each JSON record
    kind: str
    required: bool = True


class BadValue(Exception):
    """Raised by a value parser: the cell does not hold what `expected` says."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


_DT = re.compile(
    r"\s*(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"\s*(Z|[+-]\d{2}:?\d{2})?\s*$"
)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_NS = 1_000_000_000


def parse_datetime_ns(raw: Any) -> int:
    """'YYYY-MM-DD[ T]HH:MM:SS[.f (1-9 digits)][Z|+HH:MM]' -> ns since the Unix epoch (UTC)."""
    m = _DT.match(raw) if isinstance(raw, str) else None
    if not m:
        raise BadValue(EXPECTED["datetime"])
    y, mo, d, h, mi, s, frac, tz = m.groups()
    try:
        days = date(int(y), int(mo), int(d)).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        raise BadValue(EXPECTED["datetime"]) from None
    if int(h) > 23 or int(mi) > 59 or int(s) > 60:
        raise BadValue(EXPECTED["datetime"])
    seconds = days * 86400 + int(h) * 3600 + int(mi) * 60 + int(s)
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return seconds * _NS + (int(frac.ljust(9, "0")) if frac else 0)


def parse_number(raw: Any) -> float:
    if isinstance(raw, bool):
        raise BadValue(EXPECTED["number"])
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError):
        raise BadValue(EXPECTED["number"]) from None
    if not math.isfinite(value) or value < 0:
        raise BadValue(EXPECTED["number"])
    return value


def _parse_integer(raw: Any, expected: str) -> int:
    if isinstance(raw, bool):
        raise BadValue(expected)
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        text = raw.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            raw = float(text)
        except ValueError:
            raise BadValue(expected) from None
    # Integral floats such as 12.0 are accepted (some exporters write counts as floats).
    if isinstance(raw, float) and math.isfinite(raw) and raw == int(raw):
        return int(raw)
    raise BadValue(expected)


def parse_count(raw: Any) -> int:
    value = _parse_integer(raw, EXPECTED["count"])
    if not 0 <= value < 2**63:
        raise BadValue(EXPECTED["count"])
    return value


def parse_int(raw: Any) -> int:
    value = _parse_integer(raw, EXPECTED["int"])
    if not -(2**63) <= value < 2**63:
        raise BadValue(EXPECTED["int"])
    return value


def parse_ids(raw: Any) -> list[int]:
    if isinstance(raw, str):
        raw = raw.split()
    if not isinstance(raw, list):
        raise BadValue(EXPECTED["ids"])
    try:
        out = [parse_count(v) for v in raw]
    except BadValue:
        raise BadValue(EXPECTED["ids"]) from None
    return out


def parse_str(raw: Any) -> str:
    if isinstance(raw, (dict, list)) or raw is None:
        raise BadValue(EXPECTED["str"])
    return str(raw)


PARSERS = {
    "datetime": parse_datetime_ns,
    "number": parse_number,
    "count": parse_count,
    "int": parse_int,
    "ids": parse_ids,
    "str": parse_str,
}


def column_mapping(
    defaults: dict[str, str], user: dict[str, str] | None, fmt: str
) -> dict[str, str]:
    """`defaults` (output key -> source column) overridden by the user's mapping.

    Keys of `user` must be keys of `defaults`; a ValueError names the allowed ones.
    """
    mapping = dict(defaults)
    for key, column in (user or {}).items():
        if key not in defaults:
            raise ValueError(
                f"{fmt}: unknown column key {key!r}; allowed keys: {', '.join(defaults)}"
            )
        if not isinstance(column, str) or not column:
            raise ValueError(
                f"{fmt}: column for {key!r} must be a non-empty string, got {column!r}"
            )
        mapping[key] = column
    return mapping


def reject_options(fmt: str, options: dict[str, Any], allowed: tuple[str, ...] = ()) -> None:
    """ValueError naming any format option a loader does not take."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        took = ", ".join(allowed) if allowed else "none"
        raise ValueError(f"{fmt}: unknown option(s) {', '.join(unknown)}; allowed: {took}")
