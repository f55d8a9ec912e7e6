"""Running one scenario's replicas in several processes (`sim.processes`), with results
identical to the single-process run.

A run splits only when its replicas never read each other's state: a colocated cluster (no
PD: the decode pool would need the prefill pool's hand-offs), more than one replica, the
`round_robin` router (it sends trace row i to replica i mod R whatever the load, so the rows
of each replica are known before the run; the load-reading routers are not), no host sharing
(neighbours slow each other's steps) and an open loop (`workload.max_concurrency` counts the
requests in flight across all replicas). Replica r{j} runs in process j mod P; each process
simulates its replicas on their rows, with the same cluster, and the parent merges the
records (by trace row), the exact ITL distributions, step counts, busy times and time series.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Iterable

import numpy as np

from simulator.collector import RequestCollector
from simulator.progress import ProgressBar
from simulator.scenario import Scenario
from simulator.simulation import RowsResult, finish_result, simulate_rows


def split_refusal(sc: Scenario) -> str | None:
    """Why `sc` cannot run its replicas in separate processes, or None when it can."""
    c = sc.cluster
    if c.pd is not None:
        return "a PD cluster's prefill and decode pools hand every request over"
    if c.replicas < 2:
        return "one replica: nothing to split"
    if c.router != "round_robin":
        return (f"cluster.router {c.router!r} reads every replica's state for each request "
                "(only round_robin splits)")
    if (c.host_memory_share or 1.0) < 1.0 or (c.host_compute_share or 1.0) < 1.0:
        return "replicas sharing a host (cluster.host_*_share) slow each other's steps"
    if sc.workload.max_concurrency is not None:
        return "workload.max_concurrency counts the requests in flight across all replicas"
    if c.dp_attention:
        return "cluster.dp_attention routes requests over every replica's attention ranks"
    if sc.workload.warmup_drain:
        return "workload.warmup_drain holds the measured requests until every warm-up one ends"
    return None


class _SharedCount:
    """A progress sink for a child: adds finished requests to a counter the parent reads."""

    def __init__(self, counter) -> None:
        self.counter = counter
        self.pending = 0

    def update(self, n: int) -> None:
        self.pending += n
        if self.pending >= 256:
            self.flush()

    def flush(self) -> None:
        with self.counter.get_lock():
            self.counter.value += self.pending
        self.pending = 0

    def close(self) -> None:
        self.flush()


def _child(sc: Scenario, trace, rows, names, keep: bool, counter, conn) -> None:
    try:
        sink = _SharedCount(counter) if counter is not None else None
        res = simulate_rows(sc, sc.model_spec(), trace, rows, progress=sink, keep_requests=keep,
                            replica_names=names)
        res.cluster = None  # simpy state does not cross processes
        res.collector.rows_only(np.asarray(rows, dtype=np.int64))
        conn.send(("ok", res))
    except BaseException as exc:  # report it to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def run_split(sc: Scenario, model, trace, t0: float, *, progress: bool, keep_requests: bool):
    """`run_scenario` for a scenario `split_refusal` accepts, in min(sim.processes, replicas)
    processes (`t0`: perf_counter when the run began)."""
    n, R = len(trace), sc.cluster.replicas
    P = min(sc.sim.processes, R)
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    counter = ctx.Value("q", 0) if progress else None
    replica_of_row = np.arange(n) % R
    parts = []
    for p in range(P):
        mine = [j for j in range(R) if j % P == p]
        rows = np.flatnonzero(np.isin(replica_of_row, mine))
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(sc, trace, rows.tolist(), [f"r{j}" for j in mine],
                                                keep_requests, counter, child), daemon=True)
        proc.start()
        child.close()
        parts.append((proc, parent, rows))
    bar = ProgressBar(n) if progress else None
    results = []
    for proc, conn, rows in parts:
        while bar is not None and not conn.poll(0.5):
            bar.set(counter.value)
        try:
            status, payload = conn.recv()
        except EOFError:
            status, payload = "error", f"the process died (exit code {proc.join() or proc.exitcode})"
        proc.join()
        if status != "ok":
            for other, _, _ in parts:
                other.kill()
            raise RuntimeError(f"sim.processes: a process simulating replicas failed: {payload}")
        results.append((payload, rows))
    if bar is not None:
        bar.set(counter.value)
        bar.close()
    collector = RequestCollector(n, keep=keep_requests)
    timeline = results[0][0].timeline
    for res, rows in results:
        collector.merge(res.collector, rows)
        if res is not results[0][0]:
            timeline.rows.extend(res.timeline.rows)
    first = results[0][0]
    merged = RowsResult(
        collector=collector, timeline=timeline, cluster=None,
        simulated_s=max(r.simulated_s for r, _ in results),
        num_steps=sum(r.num_steps for r, _ in results),
        pools=[dict(first.pools[0], replicas=R)],
        busy_s=_by_replica(r.busy_s for r, _ in results),
        kv_peak_usage=max(r.kv_peak_usage for r, _ in results),
        prefix_queries_tokens=sum(r.prefix_queries_tokens for r, _ in results),
        prefix_hit_tokens=sum(r.prefix_hit_tokens for r, _ in results),
        has_links=False,
        api_server_busy_s=_by_replica(r.api_server_busy_s for r, _ in results),
    )
    return finish_result(sc, merged, time.perf_counter() - t0)


def _by_replica(parts: Iterable[dict[str, float]]) -> dict[str, float]:
    """Per-replica figures of every process, one mapping in replica order (r0, r1, ...)."""
    return dict(sorted(((k, v) for part in parts for k, v in part.items()),
                       key=lambda kv: int(kv[0][1:])))
