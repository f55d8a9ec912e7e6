"""Run a scenario: build its trace and cluster, replay the arrivals in SimPy (open loop, or a
closed loop under `workload.max_concurrency`: `simulator.cluster.load`), and collect
per-request records, time series and the summary."""

from __future__ import annotations

import sys
import time

import workloads
from simulator.progress import ProgressBar
from simulator.scenario import Scenario
from simulator.simulation import (  # noqa: F401  (re-exported: the run's public pieces)
    RowsResult,
    SimResult,
    finish_result,
    iter_requests,
    make_requests,
    simulate_rows,
)


def build_trace(sc: Scenario, max_model_len: int | None = None) -> workloads.Trace:
    """The scenario's workload as a `Trace`, after its transforms."""
    w = sc.workload
    if w.trace and w.synthetic:
        raise ValueError("workload: give either 'trace' or 'synthetic', not both")
    if w.trace:
        try:
            trace = workloads.load_trace(sc.resolve(w.trace), w.format, columns=w.columns,
                                         **w.options)
        except workloads.TraceError as exc:  # callers may re-hint it (exc.hinted) for their CLI
            exc.args = (f"workload.trace: {exc.hinted('workload.options.skip_invalid: true drops them')}",)
            raise
    elif w.synthetic:
        trace = workloads.synthesize(w.synthetic, seed=sc.seed if w.seed is None else w.seed)
    else:
        raise ValueError("workload: needs a 'trace' file or a 'synthetic' spec")
    if w.jitter:
        trace = workloads.jitter_arrivals(trace, seed=sc.seed)
    if w.window_s is not None:
        trace = workloads.time_window(trace, *w.window_s)
    if w.limit is not None:
        trace = workloads.first_n(trace, w.limit)
    if w.scale_prompt != 1.0 or w.scale_output != 1.0:
        trace = workloads.scale_lengths(trace, prompt=w.scale_prompt, output=w.scale_output)
    if w.arrival is not None:
        trace = workloads.retime(trace, w.arrival, sc.seed if w.seed is None else w.seed,
                                 "workload.arrival")
    if (w.rate_scale is not None or w.target_rate is not None) and trace.duration_s <= 0:
        key = "rate_scale" if w.rate_scale is not None else "target_rate"
        raise ValueError(f"workload.{key}: every request of {trace.name!r} arrives at t = 0 "
                         "(a burst); there is no rate to scale")
    if w.rate_scale is not None:
        trace = workloads.scale_time(trace, 1.0 / w.rate_scale)
    if w.target_rate is not None:
        trace = workloads.rescale_rate(trace, w.target_rate)
    if w.over_max_len != "keep" and max_model_len:
        trace = workloads.limit_prompt_len(trace, max_model_len, mode=w.over_max_len)
    if len(trace) == 0:
        raise ValueError(f"workload: the trace {trace.name!r} yields no requests after its transforms")
    if w.warmup_requests >= len(trace):
        raise ValueError(f"{sc.source or sc.name}: workload.warmup_requests = "
                         f"{w.warmup_requests} leaves none of the "
                         f"workload's {len(trace)} requests to measure; allowed: 0 to "
                         f"{len(trace) - 1}")
    return trace


def run_scenario(sc: Scenario, *, progress: bool | None = None,
                 keep_requests: bool | None = None) -> SimResult:
    """Simulate `sc`. `progress`, `keep_requests`: override `sim.progress`, `sim.keep_requests`.
    With `sim.processes` > 1 a qualifying scenario runs its replicas in several processes
    (`simulator.multiproc`), with identical results."""
    keep = sc.sim.keep_requests if keep_requests is None else keep_requests
    show = sc.sim.progress if progress is None else progress
    t0 = time.perf_counter()
    model = sc.model_spec()
    max_model_len = sc.scheduler.max_model_len or model.max_position_embeddings
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
