"""One sweep point, run in a worker process: build the scenario from the base data and
the point's overrides, simulate it, and return a flat row of metrics (or the error)."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.plan.keys import BaseScenario

# Sweep points skip the per-step time series (it only feeds plots and timeseries.parquet;
# the summary is the same, tests/test_sweep_run.py checks it) unless a point sets it.
POINT_DEFAULTS = {"output.timeseries": False, "output.plots": False}
# Per-replica dicts become these aggregates (replica names vary between points).
PER_REPLICA = ("replica_busy_fraction", "api_server.busy_fraction")
# Metrics that measure this machine, not the simulated system.
WALL_CLOCK_METRICS = ("wall_s", "sim.requests_per_wall_s")


@dataclass(frozen=True)
class PointTask:
    """Everything a worker needs for one point (plain data, picklable)."""

    point_id: str
    base: BaseScenario
    overrides: dict[str, Any]
    timeout_s: float | None = None  # wall-clock limit of the simulation, seconds


class PointTimeout(Exception):
    """A simulation ran past its wall-clock limit."""


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise `PointTimeout` in this thread after `seconds` of wall time (SIGALRM; only in
    a main thread on POSIX, a no-op elsewhere)."""
    usable = (seconds and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def _raise(signum, frame):  # noqa: ARG001 - signal handler signature
        raise PointTimeout(f"the simulation ran past the {seconds:g} s limit")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, old)


def flatten_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A run summary as flat `a.b` -> scalar columns; lists become JSON text."""
    out: dict[str, Any] = {}

    def walk(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            if key in PER_REPLICA and isinstance(v, dict):
                vals = [float(x) for x in v.values()]
                out[f"{key}.mean"] = sum(vals) / len(vals) if vals else None
                out[f"{key}.max"] = max(vals) if vals else None
            elif isinstance(v, dict):
                walk(v, key + ".")
            elif isinstance(v, (list, tuple)):
                out[key] = json.dumps(v, default=str)
            else:
                out[key] = v

    walk(summary, "")
    return out


def _error_text(exc: BaseException) -> str:
    """The exception and the innermost frame it came from."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def simulate(task: PointTask) -> dict[str, Any]:
    """Simulate one point; returns flat metrics including `cost.*`. Raises on failure."""
    from simulator.plan.pricing import cluster_cost, cost_metrics
    from simulator.run import run_scenario
    overrides = {**POINT_DEFAULTS, **task.overrides}
    sc = task.base.build(overrides)
    with deadline(task.timeout_s):
        res = run_scenario(sc, progress=False)
    metrics = flatten_summary(res.summary)
    cost = cost_metrics(res.summary, cluster_cost(sc, task.base.cost_table))
    metrics.update({f"cost.{k}": v for k, v in cost.items()})
    return metrics


def run_point(task: PointTask) -> dict[str, Any]:
    """A result row: point_id, status ("ok" / "failed"), error, wall_s, metrics."""
    t0 = time.perf_counter()
    try:
        metrics, status, error = simulate(task), "ok", ""
    except Exception as exc:  # recorded in the table; the sweep goes on
        metrics, status, error = {}, "failed", _error_text(exc)
    return {"point_id": task.point_id, "overrides": task.overrides, "status": status,
            "error": error, "point_wall_s": time.perf_counter() - t0, "metrics": metrics}
