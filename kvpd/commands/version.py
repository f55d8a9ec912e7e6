"""`kvpd version`: print the versions of kvpd and the libraries it uses."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import platform


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("version", help="print kvpd's version and its libraries' versions")
    p.set_defaults(func=run)


def library_versions() -> dict[str, str]:
    """Installed versions of kvpd and its main libraries ('absent' if not installed)."""
    out = {"python": platform.python_version()}
    for name in ("kvpd", "simpy", "numpy", "scipy", "pyzmq", "torch", "transformers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    return out


def run(args: argparse.Namespace) -> int:
    for name, version in library_versions().items():
        print(f"{name:14s} {version}")
    return 0
