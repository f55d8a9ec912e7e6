"""Output paths checked before any measuring: a command that would only find out at the end
that it cannot write its result (a file where a folder must go, a read-only folder) refuses
at once, naming the option and the path."""

from __future__ import annotations

import os
from pathlib import Path


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_out_dir(path: str | Path, option: str) -> Path:
    """`path` can be (or already is) a writable folder; ValueError naming `option` if not."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{option} {p}: exists and is not a folder")
    base = _nearest_existing(p)
    if not base.is_dir():
        raise ValueError(f"{option} {p}: {base} is a file, so no folder can be made there")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {p}: {base} is not writable")
    return p


def check_out_file(path: str | Path, option: str) -> Path:
    """`path` can be written as a file (its folder exists or can be made); ValueError naming
    `option` if not."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{option} {p}: is a folder, expected a file path")
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{option} {p}: exists and is not writable")
    base = _nearest_existing(p.parent)
    if not base.is_dir():
        raise ValueError(f"{option} {p}: {base} is a file, so no folder can be made there")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {p}: {base} is not writable")
    return p
