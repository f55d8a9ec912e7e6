"""`kvpd simulate SCENARIO.yaml [--out DIR] [--set k=v ...] [--compare B.yaml]`."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a scenario's trace against a simulated cluster",
        description="Simulate a scenario: print a summary table, write summary.json, per-request "
        "records, time series and PNG plots into --out (default: the scenario's output.dir).",
    )
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--out", help="output folder (default: output.dir of the scenario, else runs/NAME)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set scheduler.max_num_seqs=64 (repeatable)")
    p.add_argument("--compare", metavar="B.yaml", help="also run B and print both side by side")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--csv", action="store_true", help="write per-request records as CSV")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    p.set_defaults(func=run)


def _run_one(path: str, args: argparse.Namespace):
    from simulator.run import run_scenario
    from simulator.scenario import load_scenario

    overrides = list(args.overrides)
    if args.no_plots:
        overrides.append("output.plots=false")
    if args.csv:
        overrides.append("output.records=csv")
    sc = load_scenario(path, overrides)
    return run_scenario(sc, progress=args.progress or None)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from simulator.report import summary_table

    results = [_run_one(args.scenario, args)]
    if args.compare:
        results.append(_run_one(args.compare, args))
    for i, res in enumerate(results):
        # output.dir is relative to the current folder, like --out
        out = res.scenario.output.dir or f"runs/{res.scenario.name}"
        if args.out:
            out = args.out if i == 0 else str(Path(args.out) / f"compare-{res.scenario.name}")
        res.write(out)
        res.extra["out_dir"] = out
    if args.json:
        print(json.dumps([r.summary for r in results] if args.compare else results[0].summary, indent=2))
    else:
        print(summary_table([r.summary for r in results], [r.scenario.name for r in results]))
        for r in results:
            print(f"wrote {r.extra['out_dir']}/summary.json")
    return 0
