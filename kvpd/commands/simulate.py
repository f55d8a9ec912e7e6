"""`kvpd simulate SCENARIO.yaml [--out DIR] [--set k=v ...] [--compare B.yaml]`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

SKIP_HINT = "--set workload.options.skip_invalid=true drops them"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a scenario's trace against a simulated cluster",
        description="Simulate a scenario: print a summary table and write summary.json, per-request "
        "records, time series and PNG plots into a new folder runs/NAME[+overrides][-N] (or --out).",
    )
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--out", help="output folder (default: the scenario's output.dir, else "
                   "runs/NAME plus the overrides; a new numbered folder when that one holds a run)")
    p.add_argument("--force", action="store_true",
                   help="write into --out even when it already holds a run")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set scheduler.max_num_seqs=64 (repeatable)")
    p.add_argument("--compare", metavar="B.yaml", help="also run B (with the same --set) and print "
                   "both side by side with the difference")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--csv", action="store_true", help="write per-request records as CSV")
    p.add_argument("--progress", action="store_true", help="show a progress line (redrawn at "
                   "most twice a second; every 10 s when not on a terminal)")
    p.add_argument("--keep-requests", action="store_true", help="keep every request's token "
                   "times in memory (sim.keep_requests; by default they are reduced and released)")
    p.add_argument("--processes", type=int, metavar="N", help="simulate independent replicas in "
                   "N processes (sim.processes; round_robin colocated clusters only)")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    p.set_defaults(func=run)


def label(name: str, overrides: list[str]) -> str:
    """A run's column title: the scenario name plus the overrides that changed it."""
    return name + "".join(f" [{o}]" for o in overrides)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("_")


def default_out(name: str, overrides: list[str], base: Path | None = None) -> Path:
    """`base` (default runs/NAME, +k=v per override), numbered -2, -3, ... when that folder
    already holds files, so no run overwrites another."""
    base = base or Path("runs") / _slug(name + "".join(f"+{o}" for o in overrides))
    out, n = base, 1
    while out.exists() and any(out.iterdir()):
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def _checked_out(out: Path, force: bool) -> Path:
    from kvpd.commands.out_paths import check_out_dir

    check_out_dir(out, "--out")  # a folder that can be written, before anything runs
    if out.is_dir() and (out / "summary.json").exists() and not force:
        raise ValueError(f"{out} already holds a run (summary.json); pass --force to overwrite "
                         "it, or drop --out for a new folder")
    return out


def _load(path: str, overrides: list[str]) -> Any:
    """The scenario with every name and file checked; errors start with the scenario file."""
    from simulator.preflight import preflight_as
    from simulator.scenario import load_scenario

    sc = load_scenario(path, overrides)
    preflight_as(sc, path, pools=True)
    return sc


def _simulate(path: str, sc: Any, progress: bool) -> Any:
    import workloads
    from simulator.run import run_scenario

    try:
        return run_scenario(sc, progress=progress or None)
    except workloads.TraceError as exc:
        raise ValueError(f"{path}: workload.trace: {exc.hinted(SKIP_HINT)}") from None


def rejected_note(summary: dict, sc: Any) -> str | None:
    """A line when the scheduler rejected requests it could never serve (their latencies are
    not in the figures), with the keys that change it; None when it rejected none."""
    reqs = summary.get("requests") or {}
    n, total = reqs.get("rejected", 0), reqs.get("total", 0)
    if not n:
        return None
    limit = sc.max_model_len()
    return (f"WARNING: {n} of {total} requests were rejected, not served (prompt + max_tokens "
            f"past max_model_len = {limit} tokens, or past the whole KV pool); the latency and "
            "throughput figures leave them out. workload.over_max_len: clip shortens them, "
            "workload.scale_prompt / scale_output scale the lengths")


def run(args: argparse.Namespace) -> int:
    import json

    from simulator.accuracy import accuracy_line
    from simulator.cost.memory_plan import linear_attention_note, mixed_window_note
    from simulator.cost.precision import checkpoint_note
    from simulator.report import summary_table

    overrides = list(args.overrides)
    extra = (["output.plots=false"] if args.no_plots else []) + (
        ["output.records=csv"] if args.csv else []) + (
        ["sim.keep_requests=true"] if args.keep_requests else []) + (
        [f"sim.processes={args.processes}"] if args.processes is not None else [])
    paths = [args.scenario] + ([args.compare] if args.compare else [])
    # every scenario and output folder is checked before anything is simulated
    scenarios = [_load(p, overrides + extra) for p in paths]
    outs: list[Path] = []
    for i, sc in enumerate(scenarios):
        if args.out:
            out = Path(args.out) if i == 0 else Path(args.out) / f"compare-{_slug(sc.name)}"
            outs.append(_checked_out(out, args.force))
        else:  # output.dir is relative to the current folder, like --out
            base = Path(sc.output.dir) if sc.output.dir else None
            out = default_out(sc.name, overrides, base)
            while out in outs:  # two runs of one name in one call
                out = out.with_name(out.name + "-b")
            outs.append(out)
    names = [label(sc.name, overrides) for sc in scenarios]
    results = []
    for path, sc, out in zip(paths, scenarios, outs):
        res = _simulate(path, sc, args.progress)
        res.extra["out_dir"] = str(out)
        res.extra["written"] = [str(p) for p in res.write(out)]
        results.append(res)
    if args.json:
        print(json.dumps([r.summary for r in results] if args.compare else results[0].summary,
                         indent=2))
        return 0
    for name, sc, res in zip(names, scenarios, results):
        for note in sc.engine_notes:  # what the scenario's `engine` filled in
            print(f"{name}: engine {sc.engine.name}: {note}")
        note = checkpoint_note(sc.model_spec(), sc.dtype, sc.quantization_mapping())
        if note:
            print(f"{name}: quantization {note}; set quantization.method/scope to override")
        pool = res.summary["cluster"][-1]  # (a PD deployment's decode pool)
        note = (mixed_window_note(sc.model_spec(), pool.get("kv_group_layers", 0),
                                  pool.get("sliding_groups", 0))
                or linear_attention_note(sc.model_spec()))
        if note:
            print(f"{name}: KV plan: {note}")
    print(summary_table([r.summary for r in results], names))
    for name, r, sc in zip(names, results, scenarios):
        if "accuracy" in r.summary:
            print(f"{name}: {accuracy_line(r.summary['accuracy'])}")
        note = rejected_note(r.summary, sc)
        if note:
            print(f"{name}: {note}")
    for name, r in zip(names, results):
        files = [Path(f).name for f in r.extra["written"]]
        print(f"\n{name}: wrote {len(files)} files to {r.extra['out_dir']}/: {', '.join(files)}")
    return 0
