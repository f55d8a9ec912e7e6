"""The `kvpd` console script.

Each subcommand lives in its own module under `kvpd.commands` and exposes
`register(subparsers)`, which adds its parser and sets `func(args) -> int`.
Command modules keep heavy imports (torch, simpy, matplotlib) inside their
`run` functions so that `kvpd --help` stays fast and works without torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Order is the order shown by `kvpd --help`.
COMMAND_MODULES: list[str] = [
    "kvpd.commands.simulate",
    "kvpd.commands.version",
    "kvpd.commands.native",
    "kvpd.commands.trace",
    "kvpd.commands.estimate",
    "kvpd.commands.hardware",
    "kvpd.commands.model",
    "kvpd.commands.generate",
    "kvpd.commands.bench",
    "kvpd.commands.sweep",
    "kvpd.commands.capacity",
    "kvpd.commands.report",
    "kvpd.commands.serve",
    "kvpd.commands.replay",
    "kvpd.commands.profile",
    "kvpd.commands.calibrate",
    "kvpd.commands.validate",
]


class UserError(Exception):
    """An error caused by user input; printed without a traceback, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvpd",
        description=(
            "kvpd: simulate LLM serving (TTFT, TPOT, throughput) for a model, hardware, "
            "scheduler and traffic, and run the same scheduler for real with PyTorch."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe raises here, inside the handler below
        return rc
    except (UserError, ValueError, FileNotFoundError) as exc:
        print(f"kvpd {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader left (`kvpd hardware list | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout
        return 141  # 128 + SIGPIPE, as a shell reports a process the pipe closed on


if __name__ == "__main__":
    # `python -m kvpd.cli`: run the imported module's main, so that the UserError the
    # commands raise (kvpd.cli.UserError) is the class caught there, not __main__'s copy
    from kvpd.cli import main as _main

    sys.exit(_main())
