"""Simulating a trace's rows on a scenario's cluster (`simulate_rows`) and turning what that
gives into the summary and `SimResult` (`finish_result`): the parts `run_scenario` and the
multi-process runner (`simulator.multiproc`) share."""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simpy

import workloads
from simulator.accuracy import run_accuracy
from simulator.cluster.cluster import SimCluster
from simulator.cluster.load import ClosedLoop, WarmupDrain, check_servable, open_loop
from simulator.cluster.timeline import Timeline
from simulator.collector import RequestCollector
from simulator.core.request import Request, SamplingParams
from simulator.metrics import SLO, summarize, write_records, write_summary
from simulator.progress import ProgressBar
from simulator.scenario import Scenario


def make_requests(trace: workloads.Trace, ignore_eos: bool = False) -> list[Request]:
    """One `Request` per trace row; the output length becomes max_tokens, which a simulated
    request always reaches. `ignore_eos`: whether its client told the engine so
    (`workload.ignore_eos`)."""
    return list(iter_requests(trace, ignore_eos=ignore_eos))


def iter_requests(trace: workloads.Trace, rows: Iterable[int] | None = None,
                  ignore_eos: bool = False) -> Iterator[Request]:
    """`make_requests`, one request at a time (of `rows` only, when given), so a run holds only
    the requests that have arrived and not finished; request i has id str(i)."""
    params: dict[int, SamplingParams] = {}
    has_hashes = trace.hash_block_size is not None and trace.hash_ids is not None
    has_ids = trace.prompt_token_ids is not None
    arrival = trace.arrival_s.tolist()
    prompt = trace.prompt_len.tolist()
    output = trace.output_len.tolist()
    for i in range(len(trace)) if rows is None else rows:
        n_out = max(int(output[i]), 1)
        sp = params.get(n_out)
        if sp is None:
            sp = params[n_out] = SamplingParams(max_tokens=n_out, ignore_eos=ignore_eos)
        yield Request(
            request_id=str(i),
            prompt_token_ids=trace.prompt_token_ids_of(i) if has_ids else None,
            num_prompt_tokens=int(prompt[i]),
            prompt_hash_ids=trace.hash_ids_of(i) if has_hashes else None,
            hash_block_size=int(trace.hash_block_size) if has_hashes else 0,
            sampling_params=sp,
            arrival_time=float(arrival[i]),
        )


@dataclass
class SimResult:
    """A run's results. `requests` (every `Request`, with its token times) is only kept with
    `sim.keep_requests`; the records and the summary are always there."""

    scenario: Scenario
    kept_requests: list[Request] | None
    summary: dict
    records: dict[str, np.ndarray]
    timeline: Timeline
    cluster: SimCluster | None  # None when the replicas ran in several processes
    wall_s: float
    extra: dict = field(default_factory=dict)

    @property
    def requests(self) -> list[Request]:
        if self.kept_requests is None:
            raise RuntimeError("this run released its requests as they finished; run it with "
                               "sim.keep_requests: true (kvpd simulate --keep-requests) to keep "
                               "every request and its token times")
        return self.kept_requests

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


@dataclass
class RowsResult:
    """What simulating some rows of a trace gives, before the summary (picklable without the
    cluster: `multiproc` ships it between processes)."""

    collector: RequestCollector
    timeline: Timeline
    cluster: SimCluster | None
    simulated_s: float
    num_steps: int
    pools: list[dict]
    busy_s: dict[str, float]
    kv_peak_usage: float
    prefix_queries_tokens: int
    prefix_hit_tokens: int
    has_links: bool
    load: dict | None = None
    api_server_busy_s: dict[str, float] = field(default_factory=dict)  # handler s per server


@contextmanager
def _fewer_gc_passes() -> Iterator[None]:
    """Run a simulation with the objects built so far (trace, cluster) out of the cyclic
    collector's passes and young collections 20x rarer than CPython's default (every 700 net
    allocations): the run makes millions of short-lived objects, few of them cyclic (measured
    on the Azure conversation trace, bench/sim_speed.py (a): collections took ~4% of the run
    at the default, <2% so). Results do not depend on it; restored afterwards."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], 14_000), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def simulate_rows(sc: Scenario, model, trace: workloads.Trace, rows: list[int] | None, *,
                  progress: ProgressBar | None, keep_requests: bool,
                  replica_names: list[str] | None = None) -> RowsResult:
    """Run the trace's `rows` (all when None) through the scenario's cluster (or, with
    `replica_names`, through a cluster of just those colocated replicas)."""
    env = simpy.Environment()
    timeline = Timeline(enabled=sc.output.timeseries)
    collector = RequestCollector(len(trace), keep=keep_requests,
                                 expected=None if rows is None else len(rows),
                                 measured_from=sc.workload.warmup_requests)
    loop: ClosedLoop | None = None
    drain = WarmupDrain(env, sc.workload.warmup_requests) if sc.workload.warmup_drain else None
    if drain is not None and rows is not None:
        raise ValueError("workload.warmup_drain waits for every warm-up request: run the whole "
                         "trace in one process")

    def on_finished(_replica, finished: list[Request]) -> None:
        collector.add(finished)
        if progress is not None:
            progress.update(len(finished))
        if loop is not None:
            loop.on_finished(finished)
        if drain is not None:
            drain.on_finished(finished)

    cluster = SimCluster(env, sc, model, timeline, on_finished, replica_names=replica_names)
    requests = iter_requests(trace, rows, sc.workload.ignore_eos)
    keys = sc.workload.benchmark_keys()
    if keys:  # every request is checked up front, so build them once, as a list
        requests = list(requests)
        pools = ([("colocated", cluster.replicas[0].scheduler)] if sc.cluster.pd is None else
                 [("prefill", cluster.prefill_replicas[0].scheduler),
                  ("decode", cluster.decode_replicas[0].scheduler)])
        check_servable(sc.source, keys, requests, pools)
    if sc.workload.max_concurrency is not None:
        loop = ClosedLoop(env, requests, cluster.submit, sc.workload.max_concurrency, drain)
        env.process(loop.process())
    else:
        env.process(open_loop(env, requests, cluster.submit, drain))
    with _fewer_gc_passes():
        env.run()
    if progress is not None:
        progress.close()
    total = len(trace) if rows is None else len(rows)
    if collector.num_finished != total:
        unfinished = [r.request_id for rep in cluster.replicas for r in rep.scheduler.requests.values()]
        raise RuntimeError(f"simulation ended with {total - collector.num_finished} unfinished "
                           f"requests, e.g. {unfinished[:5]}")
    return RowsResult(
        collector=collector, timeline=timeline, cluster=cluster, simulated_s=float(env.now),
        num_steps=cluster.num_steps(),
        pools=[{"role": p.role, "replicas": p.spec.replicas, "tp": p.spec.tp, "pp": p.spec.pp,
                "hardware": p.accelerator.name, "num_gpu_blocks": p.num_gpu_blocks,
                "num_cpu_blocks": p.num_cpu_blocks,
                **({"kv_group_layers": p.memory.kv_group_layers,
                    "sliding_groups": p.memory.sliding_groups} if p.memory.sliding_groups else {}),
                **({"dp_attention": True} if p.dp_cost is not None else {})}
               for p in cluster.pools],
        busy_s={r.name: r.busy_s for r in cluster.replicas},
        kv_peak_usage=cluster.kv_peak_usage(),
        prefix_queries_tokens=cluster.prefix_tokens()[0],
        prefix_hit_tokens=cluster.prefix_tokens()[1],
        has_links=hasattr(cluster, "kv_links"),
        load=_load_extra(loop, drain),
        api_server_busy_s={name: s.busy_s for name, s in cluster.front_ends.items()},
    )


def _load_extra(loop: ClosedLoop | None, drain: WarmupDrain | None) -> dict | None:
    """The summary's `load` section: the closed loop's limit and peak, and when a warm-up drain
    let the measured requests go (simulated s)."""
    out: dict = {}
    if loop is not None:
        out.update(max_concurrency=loop.max_concurrency, max_in_flight=loop.max_in_flight)
    if drain is not None:
        out["warmup_drained_s"] = drain.drained_at_s
    return out or None


def finish_result(sc: Scenario, res: RowsResult, wall: float) -> SimResult:
    """The summary and `SimResult` of a finished run (`wall`: its wall seconds)."""
    records = res.collector.records()
    n = len(records["arrival_s"])
    now = res.simulated_s
    extra = {
        "scenario": sc.name,
        "sim": {
            "simulated_s": now,
            "num_steps": res.num_steps,
            "requests_per_wall_s": n / wall if wall > 0 else None,
        },
        "cluster": res.pools,
        "replica_busy_fraction": {name: (b / now if now else 0.0) for name, b in res.busy_s.items()},
    }
    if res.load is not None:
        extra["load"] = res.load
    front = sc.api_server
    if res.api_server_busy_s:  # the share of each server's process-seconds its handlers took
        extra["api_server"] = {
            "preprocess_s": front.preprocess_s, "processes": front.processes,
            "busy_fraction": {name: (b / (now * front.processes) if now else 0.0)
                              for name, b in res.api_server_busy_s.items()}}
    q = res.prefix_queries_tokens
    summary = summarize(
        None,
        slo=SLO(sc.slo.ttft_s, sc.slo.tpot_s),
        kv_peak_usage=res.kv_peak_usage,
        prefix_hit_rate=res.prefix_hit_tokens / q if q else 0.0,
        wall_s=wall,
        records=records,
        extra=extra,
        itl=res.collector.itl,
        warmup=sc.workload.warmup_requests,
    )
    if res.has_links:
        summary["kv_transfer_s"] = _transfer_stats(records["kv_transfer_s"])
    acc = run_accuracy(sc, sc.model_spec())
    if acc is not None:  # from catalog defaults: how far such predictions were from published ones
        summary["accuracy"] = acc
    kept = res.collector.requests() if res.collector.keep else None
    return SimResult(sc, kept, summary, records, res.timeline, res.cluster, wall)


def _transfer_stats(values: np.ndarray) -> dict:
    v = values[~np.isnan(values)]
    if not v.size:
        return {"count": 0}
    return {"count": int(v.size), "mean": float(v.mean()), "p50": float(np.median(v)),
            "p99": float(np.percentile(v, 99))}
