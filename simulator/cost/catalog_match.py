"""Close-match suggestions for unknown catalog names (difflib), shared by the catalogs."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def normalize_name(name: str) -> str:
    """Catalog lookup key: lower case, `_` and spaces read as `-`."""
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def close_matches(name: str, candidates: Iterable[str], n: int = 5) -> list[str]:
    """Up to `n` candidates that look like `name`, best first.

    Uses difflib ratios, plus candidates that contain `name` (or are contained in it), so
    "llama" suggests every Llama and "h100" suggests "h100-sxm" and "h100-pcie".
    """
    key = normalize_name(name)
    pool = sorted(set(candidates))
    # names that extend the given one first ("a100" -> the A100 parts), then look-alikes
    found = [c for c in pool if key and c.startswith(key)]
    found += [c for c in pool if key and (key in c or c in key) and c not in found]
    found += [c for c in difflib.get_close_matches(key, pool, n=n, cutoff=0.5) if c not in found]
    return found[:n]


def unknown_name_error(kind: str, name: str, candidates: Iterable[str],
                       listed: Iterable[str] | None = None) -> ValueError:
    """A ValueError for an unknown `kind` name that lists close matches among `candidates`, or
    else every name of `listed` (default: the candidates; a catalog whose aliases would bury
    its names passes the names alone)."""
    pool = sorted(set(candidates))
    matches = close_matches(name, pool)
    if matches:
        hint = "did you mean: " + ", ".join(matches) + "?"
    elif listed is not None:
        hint = "known: " + ", ".join(listed) + f" (and their aliases: `kvpd {kind} list`)"
    else:
        hint = "known: " + ", ".join(pool)
    return ValueError(f"unknown {kind} {name!r}; {hint}")
