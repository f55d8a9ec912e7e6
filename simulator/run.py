"""Run a scenario: build its trace and cluster, replay the arrivals in SimPy (open loop, or a
closed loop under `workload.max_concurrency`: `simulator.cluster.load`), and collect
per-request records, time series and the summary."""

from __future__ import annotations

import sys
import time

from simulator.progress import ProgressBar
from simulator.scenario import Scenario
from simulator.scenario_trace import build_trace  # noqa: F401  (re-exported)
from simulator.simulation import (  # noqa: F401  (re-exported: the run's public pieces)
    RowsResult,
    SimResult,
    finish_result,
    iter_requests,
    make_requests,
    simulate_rows,
)


def run_scenario(sc: Scenario, *, progress: bool | None = None,
                 keep_requests: bool | None = None) -> SimResult:
    """Simulate `sc`. `progress`, `keep_requests`: override `sim.progress`, `sim.keep_requests`.
    With `sim.processes` > 1 a qualifying scenario runs its replicas in several processes
    (`simulator.multiproc`), with identical results."""
    keep = sc.sim.keep_requests if keep_requests is None else keep_requests
    show = sc.sim.progress if progress is None else progress
    t0 = time.perf_counter()
    model = sc.model_spec()
    max_model_len = sc.max_model_len(model)
    trace = build_trace(sc, max_model_len)
    if sc.sim.processes > 1:
        from simulator.multiproc import run_split, split_refusal

        why = split_refusal(sc)
        if why is None:
            return run_split(sc, model, trace, t0, progress=show, keep_requests=keep)
        print(f"{sc.source or sc.name}: sim.processes = {sc.sim.processes} ignored: {why}; "
              "running in one process", file=sys.stderr)
    res = simulate_rows(sc, model, trace, None, progress=ProgressBar(len(trace)) if show else None,
                        keep_requests=keep)
    return finish_result(sc, res, time.perf_counter() - t0)
