"""Front-end serving metrics, exposed through `prometheus_client` under vLLM's metric names.

Names: where vLLM has the metric, its exact name (`vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`,
`vllm:num_preemptions_total`, `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
`vllm:request_success_total`, `vllm:time_to_first_token_seconds`,
`vllm:inter_token_latency_seconds`, `vllm:time_per_output_token_seconds`,
`vllm:e2e_request_latency_seconds`, `vllm:request_queue_time_seconds`), so dashboards and
alerts written for vLLM read kvpd unchanged; kvpd's own figures are `kvpd:`-prefixed
(`kvpd:num_requests_in_flight`, `kvpd:worker_up`, `kvpd:worker_restarts_total`,
`kvpd:num_requests_waiting_for_kv`, `kvpd:requests_submitted_total`,
`kvpd:kv_transfer_bytes_total`, `kvpd:kv_transfer_seconds_total`). Every series carries
`model_name` (vLLM's label); per-worker series also `worker` and `role`.

Latencies are the front end's (client-side): TTFT from receipt to the first token's arrival,
inter-token latency between consecutive tokens' arrivals (tokens that arrive together count
0), queue time from receipt to the first step of the worker that ran the prompt. Per-worker
counters are the workers' own, summed over a worker's restarts.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import Counter
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_LATEST

# Bucket upper bounds (s), vLLM's (vllm/engine/metrics.py): TTFT; TPOT and inter-token
# latency; end-to-end and queue time ("request latency" buckets).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                  2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


class Histogram:
    """Bucket counts of observations (seconds)."""

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = name, help_text, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        if math.isnan(value):
            return
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def family(self, model: str) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(self.name, self.help, labels=["model_name"])
        acc, rows = 0, []
        for bound, c in zip(self.buckets, self.counts):
            acc += c
            rows.append((str(bound), acc))
        rows.append(("+Inf", self.count))
        fam.add_metric([model], rows, self.sum)
        return fam


class ServingMetrics:
    """Updated by the client's I/O thread as requests finish; rendered by `/metrics`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Time to first token (front end).", TTFT_BUCKETS_S)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Time between consecutive tokens' arrivals (front end).",
                             TPOT_BUCKETS_S)
        self.tpot = Histogram("vllm:time_per_output_token_seconds",
                              "Mean time per output token after the first, per request.",
                              TPOT_BUCKETS_S)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "End-to-end request latency (front end).", E2E_BUCKETS_S)
        self.queue = Histogram("vllm:request_queue_time_seconds",
                               "Receipt to the first engine step of the request.", E2E_BUCKETS_S)
        self.finished: Counter[str] = Counter()
        self.num_submitted = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.kv_transfer_bytes = 0
        self.kv_transfer_seconds = 0.0

    def on_submit(self) -> None:
        with self._lock:
            self.num_submitted += 1

    def on_finish(self, req: Any) -> None:
        """Record a finished `ClientRequest`."""
        with self._lock:
            self.finished[req.finish_reason or "unknown"] += 1
            self.prompt_tokens += len(req.prompt_token_ids)
            self.generation_tokens += len(req.token_ids)
            times = req.token_times
            if times:
                self.ttft.observe(times[0] - req.t_submit)
                self.e2e.observe(times[-1] - req.t_submit)
            if len(times) > 1:
                self.tpot.observe((times[-1] - times[0]) / (len(times) - 1))
                for a, b in zip(times, times[1:]):
                    self.itl.observe(b - a)
            if req.first_scheduled is not None:
                self.queue.observe(max(0.0, req.first_scheduled - req.t_submit))
            if "transfer_s" in req.kv:
                self.kv_transfer_bytes += int(req.kv.get("bytes", 0))
                self.kv_transfer_seconds += float(req.kv["transfer_s"])

    def families(self, workers: dict[str, dict[str, Any]], in_flight: int,
                 model: str) -> list[Any]:
        """The metric families; `workers` is `EngineClient.workers_status()`."""
        wl = ["model_name", "worker", "role"]

        def per_worker(fam: Any, key: str, counter: bool = False) -> Any:
            for n, w in workers.items():
                value = float(w["stats"].get(key, 0))
                if counter:
                    value += float(w.get("base_counters", {}).get(key, 0))
                fam.add_metric([model, n, w["role"]], value)
            return fam

        def one(fam: Any, value: float) -> Any:
            fam.add_metric([model], value)
            return fam

        with self._lock:
            fams = [
                per_worker(GaugeMetricFamily("vllm:num_requests_running",
                                             "Requests in each worker's batch.", labels=wl),
                           "num_running"),
                per_worker(GaugeMetricFamily("vllm:num_requests_waiting",
                                             "Requests queued in each worker.", labels=wl),
                           "num_waiting"),
                per_worker(GaugeMetricFamily("vllm:kv_cache_usage_perc",
                                             "Fraction of each worker's KV blocks in use (0-1).",
                                             labels=wl), "kv_usage"),
                per_worker(CounterMetricFamily("vllm:prefix_cache_queries",
                                               "Prompt tokens looked up in the prefix cache.",
                                               labels=wl), "prefix_queries_tokens", True),
                per_worker(CounterMetricFamily("vllm:prefix_cache_hits",
                                               "Prompt tokens found in the prefix cache.",
                                               labels=wl), "prefix_hit_tokens", True),
                per_worker(CounterMetricFamily("vllm:num_preemptions",
                                               "Preemptions by each worker's scheduler.",
                                               labels=wl), "num_preemptions", True),
                per_worker(GaugeMetricFamily("kvpd:num_requests_waiting_for_kv",
                                             "Decode-side requests whose KV is in flight.",
                                             labels=wl), "num_waiting_for_kv"),
            ]
            up = GaugeMetricFamily("kvpd:worker_up", "1 if the worker is up and not stalled.",
                                   labels=wl)
            restarts = CounterMetricFamily("kvpd:worker_restarts", "Times each worker was "
                                           "restarted after dying.", labels=wl)
            for n, w in workers.items():
                up.add_metric([model, n, w["role"]], 1.0 if w["alive"] and not w["stalled"] else 0.0)
                restarts.add_metric([model, n, w["role"]], float(w["restarts"]))
            success = CounterMetricFamily("vllm:request_success", "Finished requests by "
                                          "finish reason.", labels=["model_name", "finished_reason"])
            for k, v in sorted(self.finished.items()):
                success.add_metric([model, k], float(v))
            fams += [up, restarts, success,
                     one(GaugeMetricFamily("kvpd:num_requests_in_flight", "Requests accepted "
                                           "and not yet finished.", labels=["model_name"]),
                         in_flight),
                     one(CounterMetricFamily("kvpd:requests_submitted", "Requests accepted by "
                                             "the front end.", labels=["model_name"]),
                         self.num_submitted),
                     one(CounterMetricFamily("vllm:prompt_tokens", "Prompt tokens of finished "
                                             "requests.", labels=["model_name"]),
                         self.prompt_tokens),
                     one(CounterMetricFamily("vllm:generation_tokens", "Tokens generated for "
                                             "finished requests.", labels=["model_name"]),
                         self.generation_tokens),
                     one(CounterMetricFamily("kvpd:kv_transfer_bytes", "KV bytes moved "
                                             "prefill -> decode.", labels=["model_name"]),
                         self.kv_transfer_bytes),
                     one(CounterMetricFamily("kvpd:kv_transfer_seconds", "Seconds spent in KV "
                                             "transfers.", labels=["model_name"]),
                         self.kv_transfer_seconds)]
            fams += [h.family(model) for h in (self.ttft, self.itl, self.tpot, self.e2e,
                                               self.queue)]
        return fams


class _Snapshot:
    def __init__(self, fams: list[Any]) -> None:
        self.fams = fams

    def collect(self) -> list[Any]:
        return self.fams


def render_metrics(metrics: ServingMetrics, workers: dict[str, dict[str, Any]], in_flight: int,
                   model: str = "") -> bytes:
    """The Prometheus text exposition of `metrics` and the workers' latest stats."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(metrics.families(workers, in_flight, model)))
    return generate_latest(registry)
