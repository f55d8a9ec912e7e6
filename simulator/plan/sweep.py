"""Run a sweep: every point of a `SweepSpec` on a backend, resumable.

Results folder layout:

- `sweep.json`: the sweep (name, base scenario and its fingerprint, axes, points count)
- `points.jsonl`: one line per finished point (ok or failed), appended as points finish,
  so an interrupted sweep loses nothing; a re-run skips the points already in it
- `results.parquet`, `results.csv`: the table (see `simulator.plan.table`)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.plan.keys import BaseScenario
from simulator.plan.sweep_spec import SweepSpec
from simulator.plan.table import table_rows, write_table
from simulator.plan.worker import PointTask, run_point

META = "sweep.json"
POINTS = "points.jsonl"


@dataclass
class SweepOutcome:
    out_dir: Path
    rows: list[dict[str, Any]]  # the table, in point order
    ran: int  # points simulated in this call
    skipped: int  # points found done in points.jsonl
    failed: int  # failed points in the table
    wall_s: float  # this call's wall time, seconds
    backend: str = ""
    workers: int = 1
    paths: list[Path] = field(default_factory=list)


def axis_columns(spec: SweepSpec) -> list[str]:
    """Table columns for the axes: each axis, plus the keys a linked axis sets."""
    cols: list[str] = []
    for axis in spec.axes:
        cols.append(axis.name)
        if axis.linked:
            cols.extend(k for k in axis.scenario_keys() if k not in cols)
    return cols


def default_out_dir(spec: SweepSpec) -> Path:
    return Path(spec.out or f"runs/sweeps/{spec.name}")


def read_points(path: Path) -> dict[str, dict[str, Any]]:
    """Finished points by id; a line that is not a JSON object (a torn last line of an
    interrupted write, a damaged one) is ignored: its point runs again."""
    done: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return done
    for line in path.read_bytes().splitlines():
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(row, dict) and "point_id" in row:
            done[row["point_id"]] = row
    return done


def _meta(spec: SweepSpec) -> dict[str, Any]:
    return {
        "kind": "sweep", "name": spec.name, "description": spec.description,
        "source": spec.source, "base": spec.base_source, "fingerprint": spec.fingerprint(),
        "mode": spec.mode, "samples": spec.samples, "seed": spec.seed,
        "axes": [{"name": a.name, "keys": a.scenario_keys(), "linked": a.linked, "range": a.is_range,
                  "log": a.log} for a in spec.axes],
        "axis_columns": axis_columns(spec), "num_points": len(spec.points),
        "cost_table": spec.cost_table,
    }


def prepare_out_dir(spec: SweepSpec, out_dir: Path, restart: bool) -> None:
    """Refuse to mix results of another base scenario; `restart` discards old results."""
    meta_path = out_dir / META
    if restart and out_dir.is_dir():
        for name in (META, POINTS, "results.parquet", "results.csv"):
            (out_dir / name).unlink(missing_ok=True)
    elif meta_path.is_file():
        try:
            old = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            old = {}
        if not isinstance(old, dict):  # not a sweep.json kvpd wrote: overwritten below
            old = {}
        if old.get("fingerprint") not in (None, spec.fingerprint()):
            raise ValueError(
                f"{out_dir} holds results of a different base scenario (from {old.get('base')}; "
                f"its contents or --set changed). Use --restart to discard them, or --out "
                f"another folder.")
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path.write_text(json.dumps(_meta(spec), indent=2, default=str) + "\n")


def run_sweep(spec: SweepSpec, out_dir: str | Path | None = None, *, backend: Any = "process",
              workers: int | None = None, address: str | None = None, restart: bool = False,
              retry_failed: bool = False, progress: bool = True,
              connect_timeout_s: float = 5.0, point_timeout_s: float | None = None) -> SweepOutcome:
    """Simulate the points not yet in `out_dir`, append each to points.jsonl as it
    finishes, then write the table. `backend` is a name (see `make_backend`) or a
    backend object (kept open); `point_timeout_s` fails a point that simulates longer.
    Ctrl-C stops the sweep and still writes the table."""
    from simulator.plan.backends import make_backend

    t0 = time.perf_counter()
    out = Path(out_dir) if out_dir is not None else default_out_dir(spec)
    # Connect first: a bad backend or an unreachable Ray address fails before any work.
    owned = isinstance(backend, str)
    engine = make_backend(backend, workers=workers, address=address,
                          connect_timeout_s=connect_timeout_s) if owned else backend
    try:
        prepare_out_dir(spec, out, restart)
        done = read_points(out / POINTS)
        if retry_failed:
            done = {k: v for k, v in done.items() if v.get("status") == "ok"}
        todo = [p for p in spec.points if p.point_id not in done]
        base = BaseScenario(spec.base_data, spec.base_source, spec.base_dir, spec.cost_table)
        tasks = [PointTask(p.point_id, base, p.overrides, point_timeout_s) for p in todo]
        ran = 0
        try:
            ran = _run_tasks(engine, tasks, done, out / POINTS, len(spec.points), progress,
                             spec.name)
        finally:
            rows = table_rows(spec.points, done, axis_columns(spec))
            paths = write_table(rows, out)
    finally:
        if owned:
            engine.close()
    failed = sum(r["status"] != "ok" for r in rows)
    return SweepOutcome(out, rows, ran, len(spec.points) - len(todo), failed,
                        time.perf_counter() - t0, engine.name, engine.workers, paths)


def _run_tasks(engine: Any, tasks: list[PointTask], done: dict[str, dict], log: Path,
               total: int, progress: bool, name: str) -> int:
    """Run `tasks`, recording each result in `done` and appending it to `log`."""
    from tqdm import tqdm

    bar = tqdm(total=total, initial=total - len(tasks), unit="pt", desc=f"sweep {name}",
               disable=not progress, dynamic_ncols=True)
    failed = sum(r.get("status") != "ok" for r in done.values())
    ran = 0
    if log.is_file() and log.stat().st_size:
        with log.open("rb") as fh:  # a torn last line (interrupted write) must not swallow ours
            fh.seek(-1, 2)
            torn = fh.read(1) != b"\n"
        if torn:
            with log.open("a") as fh:
                fh.write("\n")
    with log.open("a") as fh:
        for i, ok, value in engine.map_unordered(run_point, tasks):
            task = tasks[i]
            row = value if ok else {"point_id": task.point_id, "overrides": task.overrides,
                                    "status": "failed", "error": f"worker failed: {value}",
                                    "point_wall_s": None, "metrics": {}}
            fh.write(json.dumps(row, default=str) + "\n")
            fh.flush()
            done[task.point_id] = row
            ran += 1
            failed += row["status"] != "ok"
            bar.set_postfix(failed=failed, refresh=False)
            bar.update(1)
    bar.close()
    return ran

