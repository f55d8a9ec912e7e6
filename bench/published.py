"""kvpd against published serving results (bench/published/*.yaml), from uncalibrated defaults.

Each row becomes the scenario a user could have written from the published setup
(written to --out, one YAML per row, to inspect or rerun with `kvpd simulate`), is loaded
back with kvpd's scenario loader and simulated with `simulator.run.run_scenario`. Printed:
predicted vs published with the signed error per row, the median |error| per source and
overall, and the worst row. Rows the checkout cannot run (a scenario key or catalog name it
does not know yet) are listed with the loader's reason and left out of the statistics.

    PYTHONPATH=$PWD python bench/published.py [--source ID] [--row SUBSTR] [--out DIR] [--check]
                                              [--write-accuracy [PATH]]

--check exits 1 when the median |error| is above 10% or a row is beyond +-30% (issue 30's
targets), 2 when no row could run. --write-accuracy writes the error per model class and
metric family that runs from defaults report (`simulator/accuracy.py`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

# this checkout's kvpd and the bench's row readers, whichever checkout is installed
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from published_rows import (  # noqa: E402
    SUITE_DIR,
    Row,
    load_suite,
    predicted_value,
    signed_error,
    to_scenario,
)

TARGET_MEDIAN = 0.10  # issue 30: median |error| <= 10%
TARGET_WORST = 0.30  # issue 30: no row beyond +-30%


@dataclass
class Outcome:
    row: Row
    predicted: float | None = None
    error: float | None = None
    skipped: str | None = None
    assumptions: tuple[str, ...] = ()
    moe: bool = False  # the row's model is a mixture of experts (issue 34's rows)


def write_scenario(scenario: dict, out_dir: Path, row: Row, notes: list[str],
                   files: dict[str, str] | None = None) -> Path:
    """One YAML scenario per row, headed by where the published number is, with the files it
    reads (`files`: name -> text) beside it."""
    path = out_dir / row.source["id"] / f"{row.id}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    for name, text in (files or {}).items():
        (path.parent / name).write_text(text)
    head = [f"# {row.source['title']} ({row.source['date']})", f"# {row.source['url']}",
            f"# {row.where}",
            f"# published {row.metric['name']} {row.metric['stat']}: {row.metric['value']} {row.metric['unit']}"]
    head += [f"# rule: {n}" for n in notes]
    path.write_text("\n".join(head) + "\n" + yaml.safe_dump(scenario, sort_keys=False))
    return path


def run_row(row: Row, out_dir: Path, overrides: list[str] | None = None) -> Outcome:
    """Simulate `row`'s scenario; `overrides` (`--set KEY=VALUE`, as `kvpd simulate`) change
    every row's scenario, a what-if the written scenario records as a rule."""
    from simulator.run import run_scenario
    from simulator.scenario import apply_overrides, load_scenario

    try:
        conv = to_scenario(row)
        if overrides:
            apply_overrides(conv.scenario, overrides)
            conv.assumptions.extend(f"what-if --set {o} (not the published setup)" for o in overrides)
        path = write_scenario(conv.scenario, out_dir, row, conv.assumptions, conv.files)
        sc = load_scenario(path)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return Outcome(row, skipped=" ".join(str(exc).split())[:300])
    try:
        result = run_scenario(sc, progress=False)
        pred = predicted_value(row, result.summary)
    except (ValueError, RuntimeError) as exc:
        return Outcome(row, skipped="run failed: " + " ".join(str(exc).split())[:300])
    from simulator.cost.models import get_model

    return Outcome(row, pred, signed_error(pred, float(row.metric["value"])), None,
                   tuple(conv.assumptions), get_model(sc.model).is_moe)


def accuracy_of(outcomes: list[Outcome]) -> dict:
    """`simulator.accuracy.accuracy_table` of the rows that ran."""
    from simulator.accuracy import accuracy_table

    return accuracy_table((o.moe, o.row.metric["name"], o.error) for o in outcomes
                          if o.error is not None)


def summarize(outcomes: list[Outcome]) -> dict:
    """Median |error| per source and overall, and the worst row (ran rows only)."""
    ran = [o for o in outcomes if o.error is not None]
    by_source: dict[str, list[float]] = {}
    for o in ran:
        by_source.setdefault(o.row.source["id"], []).append(abs(o.error))
    worst = max(ran, key=lambda o: abs(o.error), default=None)
    by_kind: dict[str, tuple[float, int, int]] = {}  # median |error|, rows, rows beyond +-30%
    for kind, moe in (("dense", False), ("MoE", True)):
        errs = [abs(o.error) for o in ran if o.moe == moe]
        if errs:
            by_kind[kind] = (statistics.median(errs), len(errs),
                             sum(e > TARGET_WORST for e in errs))
    return {
        "ran": len(ran),
        "skipped": len(outcomes) - len(ran),
        "median_abs_by_source": {k: statistics.median(v) for k, v in sorted(by_source.items())},
        "median_abs_by_kind": by_kind,
        "median_abs": statistics.median([abs(o.error) for o in ran]) if ran else None,
        "worst": worst,
    }


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"


def print_table(outcomes: list[Outcome], stats: dict) -> None:
    print(f"{'source/row':58s} {'metric':22s} {'published':>11s} {'predicted':>11s} {'error':>8s}")
    for o in outcomes:
        m = o.row.metric
        label = f"{m['name']} {m['stat']} [{m['unit']}]"
        if o.error is None:
            print(f"{o.row.key[:58]:58s} {label:22s} {_fmt(m['value']):>11s} {'-':>11s} {'skip':>8s}  {o.skipped}")
        else:
            print(f"{o.row.key[:58]:58s} {label:22s} {_fmt(m['value']):>11s} {_fmt(o.predicted):>11s} {o.error:+8.1%}")
    print()
    print(f"rows run: {stats['ran']}, not runnable in this checkout: {stats['skipped']}")
    for src, med in stats["median_abs_by_source"].items():
        n = sum(1 for o in outcomes if o.error is not None and o.row.source["id"] == src)
        print(f"median |error| {src:40s} {med:6.1%}  ({n} rows)")
    for kind, (med, n, beyond) in stats["median_abs_by_kind"].items():
        print(f"median |error| {kind + ' models':40s} {med:6.1%}  ({n} rows, {beyond} beyond "
              f"+-{TARGET_WORST:.0%})")
    if stats["median_abs"] is not None:
        w = stats["worst"]
        print(f"median |error| {'overall':40s} {stats['median_abs']:6.1%}  (target <= {TARGET_MEDIAN:.0%})")
        print(f"worst row: {w.row.key} {w.error:+.1%}  (target within +-{TARGET_WORST:.0%})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default=str(SUITE_DIR), help="folder of source YAML files")
    ap.add_argument("--source", action="append", default=[], help="only these source ids")
    ap.add_argument("--row", action="append", default=[], help="only rows whose id contains this")
    ap.add_argument("--out", default="out/published", help="folder for the per-row scenarios")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--write-accuracy", nargs="?", const="", default=None, metavar="PATH",
                    help="write the error per model class and metric family (default "
                         "simulator/catalog/published_accuracy.json, which a run from "
                         "defaults reports as its `accuracy`); needs the whole suite")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="what-if: override a key of every row's scenario, as kvpd simulate "
                         "--set (e.g. hardware='{base: h100-sxm, bf16_tflops_scale: 0.5}')")
    args = ap.parse_args(argv)
    rows = load_suite(args.suite)
    known = sorted({r.source["id"] for r in rows})
    for s in args.source:
        if s not in known:
            ap.error(f"--source {s!r} unknown; sources: {', '.join(known)}")
    rows = [r for r in rows if (not args.source or r.source["id"] in args.source)
            and (not args.row or any(x in r.id for x in args.row))]
    if not rows:
        ap.error("no row matches the filters")
    if args.write_accuracy is not None and (args.source or args.row or args.overrides):
        ap.error("--write-accuracy needs the whole suite as published: no --source, --row or --set")
    out_dir = Path(args.out)
    outcomes = [run_row(r, out_dir, args.overrides) for r in rows]
    stats = summarize(outcomes)
    print_table(outcomes, stats)
    print(f"scenarios written under {out_dir}/")
    if args.write_accuracy is not None:
        from simulator.accuracy import ACCURACY_FILE, write_accuracy

        path = write_accuracy(accuracy_of(outcomes), Path(args.write_accuracy or ACCURACY_FILE))
        print(f"accuracy by model class and metric written to {path}")
    if not args.check:
        return 0
    if not stats["ran"]:
        return 2
    worst = abs(stats["worst"].error)
    return 0 if stats["median_abs"] <= TARGET_MEDIAN and worst <= TARGET_WORST else 1


if __name__ == "__main__":
    sys.exit(main())
