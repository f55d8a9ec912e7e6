"""Run a scenario: build its trace and cluster, replay the arrivals in SimPy (open loop, or a
closed loop under `workload.max_concurrency`: `simulator.cluster.load`), and collect
per-request records, time series and the summary."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simpy

import workloads
from simulator.cluster.cluster import SimCluster
from simulator.cluster.load import ClosedLoop, check_servable, open_loop
from simulator.cluster.timeline import Timeline
from simulator.core.request import Request, SamplingParams
from simulator.cost.models import get_model
from simulator.metrics import SLO, request_records, summarize, write_records, write_summary
from simulator.scenario import Scenario


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
    return trace


def make_requests(trace: workloads.Trace) -> list[Request]:
    """One `Request` per trace row; the output length becomes max_tokens (ignore_eos)."""
    params: dict[int, SamplingParams] = {}
    has_hashes = trace.hash_block_size is not None and trace.hash_ids is not None
    has_ids = trace.prompt_token_ids is not None
    out = []
    arrival = trace.arrival_s.tolist()
    prompt = trace.prompt_len.tolist()
    output = trace.output_len.tolist()
    for i in range(len(trace)):
        n_out = max(int(output[i]), 1)
        sp = params.get(n_out)
        if sp is None:
            sp = params[n_out] = SamplingParams(max_tokens=n_out, ignore_eos=True)
        out.append(Request(
            request_id=str(i),
            prompt_token_ids=trace.prompt_token_ids_of(i) if has_ids else None,
            num_prompt_tokens=int(prompt[i]),
            prompt_hash_ids=trace.hash_ids_of(i) if has_hashes else None,
            hash_block_size=int(trace.hash_block_size) if has_hashes else 0,
            sampling_params=sp,
            arrival_time=float(arrival[i]),
        ))
    return out


@dataclass
class SimResult:
    scenario: Scenario
    requests: list[Request]
    summary: dict
    records: dict[str, np.ndarray]
    timeline: Timeline
    cluster: SimCluster
    wall_s: float
    extra: dict = field(default_factory=dict)

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write summary.json, requests.{parquet,csv}, timeseries.parquet (and plots)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = [out / "summary.json"]
        write_summary(self.summary, written[0])
        ext = self.scenario.output.records
        written.append(write_records(self.records, out / f"requests.{ext}"))
        if self.scenario.output.timeseries:
            written.append(write_records(self.timeline.columns(), out / "timeseries.parquet"))
        (out / "scenario.json").write_text(self.scenario.model_dump_json(indent=2))
        written.append(out / "scenario.json")
        if self.scenario.output.plots:
            from simulator.plots import plot_run

            written += plot_run(self, out)
        return written


def run_scenario(sc: Scenario, *, progress: bool | None = None) -> SimResult:
    t0 = time.perf_counter()
    model = get_model(sc.model if not isinstance(sc.model, str) or not sc.model.endswith(".json")
                      else str(sc.resolve(sc.model)))
    max_model_len = sc.scheduler.max_model_len or model.max_position_embeddings
    trace = build_trace(sc, max_model_len)
    requests = make_requests(trace)
    env = simpy.Environment()
    timeline = Timeline(enabled=sc.output.timeseries)
    show = sc.sim.progress if progress is None else progress
    bar = None
    if show:
        from tqdm import tqdm

        bar = tqdm(total=len(requests), unit="req", desc="simulating", mininterval=0.5)

    loop: ClosedLoop | None = None

    def on_finished(_replica, finished: list[Request]) -> None:
        if bar is not None:
            bar.update(len(finished))
        if loop is not None:
            loop.on_finished(finished)

    cluster = SimCluster(env, sc, model, timeline, on_finished)
    keys = sc.workload.benchmark_keys()
    if keys:
        pools = ([("colocated", cluster.replicas[0].scheduler)] if sc.cluster.pd is None else
                 [("prefill", cluster.prefill_replicas[0].scheduler),
                  ("decode", cluster.decode_replicas[0].scheduler)])
        check_servable(sc.source, keys, requests, pools)
    if sc.workload.max_concurrency is not None:
        loop = ClosedLoop(env, requests, cluster.submit, sc.workload.max_concurrency)
        env.process(loop.process())
    else:
        env.process(open_loop(env, requests, cluster.submit))
    env.run()
    if bar is not None:
        bar.close()
    unfinished = [r.request_id for r in requests if not r.is_finished]
    if unfinished:
        raise RuntimeError(f"simulation ended with {len(unfinished)} unfinished requests, e.g. {unfinished[:5]}")
    wall = time.perf_counter() - t0
    records = request_records(requests)
    extra = {
        "scenario": sc.name,
        "sim": {
            "simulated_s": float(env.now),
            "num_steps": int(sum(r.num_steps for r in cluster.replicas)),
            "requests_per_wall_s": len(requests) / wall if wall > 0 else None,
        },
        "cluster": [
            {"role": p.role, "replicas": p.spec.replicas, "tp": p.spec.tp, "pp": p.spec.pp,
             "hardware": p.accelerator.name, "num_gpu_blocks": p.num_gpu_blocks,
             "num_cpu_blocks": p.num_cpu_blocks}
            for p in cluster.pools
        ],
        "replica_busy_fraction": {
            r.name: (r.busy_s / env.now if env.now else 0.0) for r in cluster.replicas
        },
    }
    if loop is not None:
        extra["load"] = {"max_concurrency": loop.max_concurrency, "max_in_flight": loop.max_in_flight}
    summary = summarize(
        requests,
        slo=SLO(sc.slo.ttft_s, sc.slo.tpot_s),
        kv_peak_usage=cluster.kv_peak_usage(),
        prefix_hit_rate=cluster.prefix_hit_rate(),
        wall_s=wall,
        records=records,
        extra=extra,
    )
    if hasattr(cluster, "kv_links"):
        summary["kv_transfer_s"] = _transfer_stats(records["kv_transfer_s"])
    return SimResult(sc, requests, summary, records, timeline, cluster, wall)


def _transfer_stats(values: np.ndarray) -> dict:
    v = values[~np.isnan(values)]
    if not v.size:
        return {"count": 0}
    return {"count": int(v.size), "mean": float(v.mean()), "p50": float(np.median(v)),
            "p99": float(np.percentile(v, 99))}
