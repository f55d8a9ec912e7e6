"""`kvpd sweep SWEEP.yaml [--backend process|ray|serial] [--address ADDR] [--out DIR]`."""

from __future__ import annotations

import argparse

from kvpd.commands.arg_types import positive_float, positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="simulate a scenario over a grid / random / Latin-hypercube sample of its keys",
        description="Run every point of a sweep file (a base scenario plus axes over scenario "
        "keys) in parallel and write one table (results.parquet, results.csv) with the axes "
        "and every summary metric. Re-running skips the points already done; a failing point "
        "is recorded with its error. See scenarios/sweeps/ for examples.",
    )
    p.add_argument("sweep", help="sweep YAML file")
    p.add_argument("--out", help="results folder (default: the file's 'out', else runs/sweeps/NAME)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the base scenario for every point (repeatable)")
    p.add_argument("--backend", choices=("process", "ray", "serial"), default="process",
                   help="where points run: local process pool (default), Ray, or this process")
    p.add_argument("--workers", type=positive_int, help="pool size (default: CPU count; Ray: local CPUs)")
    p.add_argument("--address", help="Ray cluster address (HOST:PORT, ray://HOST:PORT, auto)")
    p.add_argument("--connect-timeout", type=positive_float, default=5.0, metavar="S",
                   help="seconds to wait for a Ray address before giving up (default 5)")
    p.add_argument("--point-timeout", type=positive_float, metavar="S",
                   help="fail a point whose simulation runs longer than S seconds")
    p.add_argument("--restart", action="store_true", help="discard the folder's earlier results")
    p.add_argument("--retry-failed", action="store_true", help="re-run points that failed before")
    p.add_argument("--dry-run", action="store_true", help="list the points and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--report", action="store_true", help="also write report.html into the folder")
    p.add_argument("--attainment", type=float, default=0.9, metavar="FRACTION",
                   help="rank only points where at least this fraction of requests met the "
                   "scenario's slo block (default 0.9, DistServe's usual target)")
    p.set_defaults(func=run)


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def print_ranking(rows: list[dict], axes: list[str], attainment: float) -> None:
    """The five points of highest goodput among those meeting the attainment target."""
    meets = sorted((r for r in rows if (r.get("slo.attainment") or 0.0) >= attainment),
                   key=lambda r: -(r.get("slo.goodput_rps") or 0.0))
    if not rows:
        return
    print(f"best goodput among points with SLO attainment >= {attainment:g} ({len(meets)} of "
          f"{len(rows)} points; goodput = requests meeting the SLOs per second of the run):")
    if not meets:
        top = max(r.get("slo.attainment") or 0.0 for r in rows)
        print(f"  none: the highest attainment is {top:.3f}; lower --attainment or the load")
    for r in meets[:5]:
        where = ", ".join(f"{c}={_fmt(r.get(c))}" for c in axes)
        print(f"  {r['slo.goodput_rps']:.3f} req/s  attainment {r['slo.attainment']:.3f}  {where}")


def run(args: argparse.Namespace) -> int:
    import json

    from kvpd.commands.out_paths import check_out_dir
    from simulator.plan.sweep import axis_columns, default_out_dir, run_sweep
    from simulator.plan.sweep_spec import load_sweep

    if not 0 < args.attainment <= 1:
        raise ValueError(f"--attainment must be in (0, 1], got {args.attainment}")
    spec = load_sweep(args.sweep, args.overrides)
    if args.dry_run:
        print(f"{spec.name}: {len(spec.points)} points ({spec.mode})")
        for p in spec.points:
            print(f"  {p.index:4d} {p.point_id}  {json.dumps(p.overrides, default=str)}")
        return 0
    check_out_dir(args.out or default_out_dir(spec), "--out")  # before any simulation
    out = run_sweep(spec, args.out, backend=args.backend, workers=args.workers,
                    address=args.address, restart=args.restart, retry_failed=args.retry_failed,
                    progress=not args.no_progress, connect_timeout_s=args.connect_timeout,
                    point_timeout_s=args.point_timeout)
    print(f"{spec.name}: {len(spec.points)} points, {out.ran} simulated, {out.skipped} already "
          f"done, {out.failed} failed; {out.wall_s:.1f} s on {out.backend} x{out.workers}")
    failed = [r for r in out.rows if r["status"] != "ok"]
    for r in failed[:5]:
        axes = {c: r.get(c) for c in axis_columns(spec)}
        print(f"  failed point {r['point']} {json.dumps(axes, default=str)}: {r['error']}")
    ok = [r for r in out.rows if r["status"] == "ok"]
    print_ranking(ok, axis_columns(spec), args.attainment)
    for path in out.paths:
        print(f"wrote {path}")
    if args.report:
        from simulator.plan.report import write_report

        print(f"wrote {write_report(out.out_dir)}")
    return 0 if ok or not out.rows else 1
