"""`kvpd report RESULTS [--format html|md] [--out FILE]`: a sweep or capacity report."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="render a sweep or capacity result as HTML (or Markdown) with plots",
        description="Render the results of `kvpd sweep` (a folder with sweep.json and "
        "results.parquet) or `kvpd capacity` (capacity.json) as a self-contained HTML page "
        "with PNG plots (Pareto front of goodput vs cost, metrics vs each axis, heatmaps for "
        "pairs of axes; capacity curves) and the table, or as a Markdown summary.",
    )
    p.add_argument("results", help="results folder, results.parquet/.csv or capacity.json")
    p.add_argument("--format", choices=("html", "md"), default="html", help="default html")
    p.add_argument("--out", help="report file (default: RESULTS/report.html or report.md)")
    p.add_argument("--metric", default="slo.goodput_rps",
                   help="sweep metric for the Pareto front, heatmaps and ranking")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvpd.commands.out_paths import check_out_file
    from simulator.plan.report import write_report

    if args.out:
        check_out_file(args.out, "--out")
    path = write_report(args.results, args.format, args.out, args.metric)
    print(f"wrote {path}")
    return 0
