"""Front-end serving metrics in the Prometheus text exposition format (version 0.0.4):
request counters, client-side TTFT / TPOT / E2E histograms, and gauges from the workers'
latest stats (queue length, running requests, KV usage, worker up)."""

from __future__ import annotations

import bisect
import math
import threading
from collections import Counter
from typing import Any

# Bucket upper bounds (s), vLLM's for its TTFT and TPOT histograms (vllm/engine/metrics.py).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                  2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


class Histogram:
    """Cumulative-bucket histogram (seconds)."""

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

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        acc = 0
        for bound, c in zip(self.buckets, self.counts):
            acc += c
            lines.append(f'{self.name}_bucket{{le="{bound}"}} {acc}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        lines += [f"{self.name}_sum {self.sum}", f"{self.name}_count {self.count}"]
        return lines


class ServingMetrics:
    """Updated by the client's I/O thread as requests finish; rendered by `/metrics`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ttft = Histogram("kvpd_time_to_first_token_seconds",
                              "Client-side time to first token.", TTFT_BUCKETS_S)
        self.tpot = Histogram("kvpd_time_per_output_token_seconds",
                              "Client-side mean time per output token after the first.", TPOT_BUCKETS_S)
        self.e2e = Histogram("kvpd_e2e_request_latency_seconds",
                             "Client-side end-to-end request latency.", E2E_BUCKETS_S)
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
            if "transfer_s" in req.kv:
                self.kv_transfer_bytes += int(req.kv.get("bytes", 0))
                self.kv_transfer_seconds += float(req.kv["transfer_s"])

    def render(self, workers: dict[str, dict[str, Any]], in_flight: int) -> str:
        """The exposition text; `workers` is `EngineClient.workers_status()`."""
        out: list[str] = []

        def gauge(name: str, help_text: str, rows: list[tuple[str, float]], kind: str = "gauge") -> None:
            out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
            out.extend(f"{name}{labels} {value}" for labels, value in rows)

        def per_worker(key: str) -> list[tuple[str, float]]:
            return [(f'{{worker="{n}",role="{w["role"]}"}}', float(w["stats"].get(key, 0)))
                    for n, w in workers.items()]

        with self._lock:
            gauge("kvpd_num_requests_running", "Requests running in each worker's batch.",
                  per_worker("num_running"))
            gauge("kvpd_num_requests_waiting", "Requests queued in each worker (queue length).",
                  per_worker("num_waiting"))
            gauge("kvpd_num_requests_waiting_for_kv", "Decode-side requests whose KV is in flight.",
                  per_worker("num_waiting_for_kv"))
            gauge("kvpd_kv_cache_usage_ratio", "Fraction of each worker's KV blocks in use.",
                  per_worker("kv_usage"))
            gauge("kvpd_worker_up", "1 if the worker is up, 0 if it is down.",
                  [(f'{{worker="{n}",role="{w["role"]}"}}', 1.0 if w["alive"] else 0.0)
                   for n, w in workers.items()])
            gauge("kvpd_num_requests_in_flight", "Requests accepted and not yet finished.",
                  [("", float(in_flight))])
            gauge("kvpd_requests_submitted_total", "Requests accepted by the front end.",
                  [("", float(self.num_submitted))], "counter")
            gauge("kvpd_request_success_total", "Finished requests by finish reason.",
                  [(f'{{finish_reason="{k}"}}', float(v)) for k, v in sorted(self.finished.items())],
                  "counter")
            gauge("kvpd_prompt_tokens_total", "Prompt tokens of finished requests.",
                  [("", float(self.prompt_tokens))], "counter")
            gauge("kvpd_generation_tokens_total", "Tokens generated for finished requests.",
                  [("", float(self.generation_tokens))], "counter")
            gauge("kvpd_kv_transfer_bytes_total", "KV bytes moved prefill -> decode.",
                  [("", float(self.kv_transfer_bytes))], "counter")
            gauge("kvpd_kv_transfer_seconds_total", "Seconds spent in KV transfers.",
                  [("", self.kv_transfer_seconds)], "counter")
            for h in (self.ttft, self.tpot, self.e2e):
                out.extend(h.render())
        return "\n".join(out) + "\n"
