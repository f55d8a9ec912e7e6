"""A scenario's workload as a `Trace`: its trace file or synthetic spec, then its transforms
(jitter, window, limit, length scales, new arrivals, rate scaling, prompts over the context)."""

from __future__ import annotations

from typing import Any

import workloads


def build_trace(sc: Any, max_model_len: int | None = None) -> workloads.Trace:
    """The workload of `sc` (a validated `simulator.scenario.Scenario`) after its transforms."""
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
