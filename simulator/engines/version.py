"""The version an engine's `engine.version` text names, as one comparable `Version`.

Texts come from scenarios and published setups: "0.11.0", "v0.1.0a1", "0.5.7 (docker tag)",
"0.7.4.dev181+gf35f8e22 (H200 rows), 0.7.3.dev138+g21f6ca217 ROCm (MI300X rows)". The lowest
version a text lists is taken (the oldest engine a source ran), pre-releases kept.
"""

from __future__ import annotations

import re
from typing import Any

from packaging.version import Version

_VERSION = re.compile(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?")


def parse_version(text: Any) -> Version | None:
    """The lowest major.minor.patch version (with any pre-, post- or dev-release) in `text`;
    None when it names none."""
    found = [Version(m) for m in _VERSION.findall(str(text))] if text else []
    return min(found) if found else None


def from_release(text: Any, first: Version) -> bool:
    """Whether the engine version `text` names is `first` or later; True when it names none
    (a scenario without a version means the engine as released now)."""
    v = parse_version(text)
    return v is None or v >= first
