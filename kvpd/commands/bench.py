"""`kvpd bench ladder`: the KV-cache ladder benchmark of the real executor."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks of the real executor")
    bsub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    lad = bsub.add_parser(
        "ladder",
        help="tokens/s and TTFT from no cache to paged + ORCA batching, vs HF generate",
        description="KV-cache ladder: (1) no cache, (2) contiguous cache, (3) paged, 1 request, "
        "(4) paged + static batching, (5) paged + ORCA, (6) HF generate padded batches.",
    )
    from realexec.fidelity.ladder import add_arguments  # light: heavy imports happen inside run

    add_arguments(lad)
    lad.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from realexec.fidelity.ladder import main

    return main(args)
