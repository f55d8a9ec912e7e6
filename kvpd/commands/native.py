"""`kvpd native build|status|clean`: the shared core compiled with mypyc (simulator.native)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "native", help="compile the shared core with mypyc (about 1.6x faster simulations)",
        description="Compile simulator/core with mypyc into a cache folder; with KVPD_NATIVE=1 "
                    "kvpd loads it whenever it matches the sources (same results, about "
                    "1.6x faster simulations). Needs a C compiler and mypy: pip install -e \".[native]\".")
    p.add_argument("action", choices=("build", "status", "clean"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvpd.cli import UserError
    from simulator import native

    if args.action == "build":
        try:
            native.build()
        except RuntimeError as exc:
            raise UserError(f"kvpd native build: {exc}") from exc
    elif args.action == "clean":
        print(f"removed {native.clean()} native build(s) from {native.cache_root()}")
    else:
        print(native.status())
    return 0
