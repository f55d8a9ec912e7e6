"""Per-request records and the run summary (`summary.json`), computed from `Request`
timestamps only, so simulated and real runs produce the same files.

Definitions (seconds): TTFT = first token - arrival; TPOT = (last token - first
token) / (output tokens - 1); ITL = gaps between consecutive tokens; E2E = last
token - arrival; queueing = first scheduled - arrival. SLO attainment follows
DistServe: the fraction of all requests whose TTFT and TPOT both meet their
targets; goodput = such requests per second of the run's span. Arrival is when the request
was sent: its trace time in an open loop; under a closed loop (`workload.max_concurrency`,
`kvpd replay --max-concurrency`) the later of that and the time a slot freed, as benchmark
clients (`vllm bench serve`, `trtllm-bench`) measure TTFT from the send.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.core.request import Request, RequestStatus
from simulator.distribution import ExactDistribution

PERCENTILES = (50, 90, 99)
COMPLETED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)


@dataclass(frozen=True)
class SLO:
    """Latency targets (s); None = no target on that metric."""

    ttft_s: float | None = None
    tpot_s: float | None = None


def _nan(x: float | None) -> float:
    return float("nan") if x is None else float(x)


def request_records(requests: Iterable[Request]) -> dict[str, np.ndarray]:
    """One row per request, as numpy columns (NaN where a metric does not apply)."""
    return records_and_gaps(list(requests))[0]


def records_and_gaps(rows: list[Request]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`request_records(rows)` and every inter-token gap of the rows (s), request by request
    (`all_itls(rows)`), from one pass over their token times."""
    n = len(rows)
    cols: dict[str, np.ndarray] = {
        "request_id": np.array([r.request_id for r in rows], dtype=object),
        "arrival_s": np.empty(n),
        "queueing_s": np.empty(n),
        "ttft_s": np.empty(n),
        "tpot_s": np.empty(n),
        "itl_mean_s": np.empty(n),
        "itl_p99_s": np.empty(n),
        "itl_max_s": np.empty(n),
        "e2e_s": np.empty(n),
        "prompt_tokens": np.empty(n, dtype=np.int64),
        "output_tokens": np.empty(n, dtype=np.int64),
        "cached_prompt_tokens": np.empty(n, dtype=np.int64),
        "preemptions": np.empty(n, dtype=np.int64),
        "finish_reason": np.array([r.finish_reason or "unfinished" for r in rows], dtype=object),
        "replica": np.array([str(r.annotations.get("replica", "")) for r in rows], dtype=object),
        "kv_transfer_s": np.empty(n),
    }
    for i, r in enumerate(rows):
        a = r.arrival_time
        cols["arrival_s"][i] = a
        cols["queueing_s"][i] = _nan(None if r.first_scheduled_time is None else r.first_scheduled_time - a)
        cols["ttft_s"][i] = _nan(None if r.first_token_time is None else r.first_token_time - a)
        cols["prompt_tokens"][i] = r.num_prompt_tokens
        cols["output_tokens"][i] = r.num_output_tokens
        cols["cached_prompt_tokens"][i] = max(r.num_cached_tokens, 0)
        cols["preemptions"][i] = r.num_preemptions
        cols["kv_transfer_s"][i] = _nan(r.annotations.get("kv_transfer_s"))
    return cols, _itl_columns(rows, cols)


def _itl_columns(rows: list[Request], cols: dict[str, np.ndarray]) -> np.ndarray:
    """TPOT, E2E and per-request ITL mean / p99 / max, vectorised over all tokens; returns
    every gap (`all_itls(rows)`)."""
    n = len(rows)
    for key in ("tpot_s", "itl_mean_s", "itl_p99_s", "itl_max_s", "e2e_s"):
        cols[key][:] = np.nan
    times, counts, gaps = _token_gaps(rows)
    if not n or not len(times):
        return gaps
    ends = np.cumsum(counts)
    starts = ends - counts
    has = counts > 0
    cols["e2e_s"][has] = times[ends[has] - 1] - cols["arrival_s"][has]
    multi = counts > 1
    if not multi.any():
        return gaps
    ng = counts[multi] - 1
    first = times[starts[multi]]
    last = times[ends[multi] - 1]
    cols["tpot_s"][multi] = (last - first) / ng
    cols["itl_mean_s"][multi] = cols["tpot_s"][multi]
    gstart = np.concatenate(([0], np.cumsum(ng)[:-1]))
    itl_max, itl_p99 = _top_order_stats(gaps, gstart, ng)
    cols["itl_max_s"][multi] = itl_max
    cols["itl_p99_s"][multi] = itl_p99
    return gaps


def _top_order_stats(gaps: np.ndarray, starts: np.ndarray, lengths: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Max and linear-interpolated p99 (numpy's default percentile) of each segment
    `gaps[starts[i] : starts[i] + lengths[i]]` (lengths >= 1). Segments of one length are
    stacked and partitioned together: exact, and much faster than sorting every gap."""
    out_max = np.empty(len(lengths))
    out_p99 = np.empty(len(lengths))
    for length in np.unique(lengths).tolist():
        sel = np.flatnonzero(lengths == length)
        block = gaps[starts[sel, None] + np.arange(length)]
        pos = 0.99 * (length - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, length - 1)
        frac = pos - lo
        part = np.partition(block, sorted({lo, hi, length - 1}), axis=1)
        out_max[sel] = part[:, length - 1]
        out_p99[sel] = part[:, lo] * (1 - frac) + part[:, hi] * frac
    return out_max, out_p99


def _stats(values: np.ndarray) -> dict[str, float | None]:
    v = values[~np.isnan(values)]
    if v.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    p = np.percentile(v, PERCENTILES)
    return {
        "mean": float(v.mean()),
        "p50": float(p[0]),
        "p90": float(p[1]),
        "p99": float(p[2]),
        "max": float(v.max()),
    }


def all_itls(requests: Iterable[Request]) -> np.ndarray:
    """Every inter-token gap of every request (s), request by request, for exact ITL
    percentiles."""
    return _token_gaps(list(requests))[2]


def _token_gaps(rows: list[Request]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(every token time in request order (s), tokens per request, the gaps between each
    request's consecutive tokens (s), request by request)."""
    counts = np.array([len(r.token_times) for r in rows], dtype=np.int64)
    parts = [np.frombuffer(r.token_times, dtype=np.float64) for r in rows if len(r.token_times)]
    if not parts:
        return np.empty(0), counts, np.empty(0)
    times = np.concatenate(parts)
    ends = np.cumsum(counts)
    keep = np.ones(max(len(times) - 1, 0), dtype=bool)  # drop the gaps across requests
    keep[ends[(ends > 0) & (ends < len(times))] - 1] = False
    return times, counts, np.diff(times)[keep]


def summarize(
    requests: list[Request] | None,
    *,
    slo: SLO | None = None,
    kv_peak_usage: float = 0.0,
    prefix_hit_rate: float = 0.0,
    wall_s: float = 0.0,
    records: dict[str, np.ndarray] | None = None,
    extra: dict | None = None,
    itl: ExactDistribution | None = None,
    warmup: int = 0,
) -> dict:
    """The run summary; keys are a contract (see the README). From `requests`, or (requests
    None) from their `records` and `itl`, the inter-token gaps of the completed ones
    (`simulator.collector` streams both). `warmup`: the first rows (trace order) are warm-up
    requests, left out of every figure (`itl` must already leave them out); `requests.warmup`
    (only then) says how many."""
    if requests is None and (records is None or itl is None):
        raise ValueError("summarize needs the requests, or their records and ITL distribution")
    rec = records if records is not None else request_records(requests)
    if warmup:
        rec = {k: v[warmup:] for k, v in rec.items()}
        requests = None if requests is None else list(requests)[warmup:]
    reason = rec["finish_reason"]
    completed = (reason == "stop") | (reason == "length")
    rejected = reason == "rejected"
    aborted = reason == "abort"
    n = len(rec["arrival_s"])
    if itl is None:
        itl = ExactDistribution.of(all_itls(r for r, c in zip(requests, completed) if c))
    if n:
        start = float(rec["arrival_s"].min())
        ends = rec["arrival_s"] + np.nan_to_num(rec["e2e_s"], nan=0.0)
        span = max(float(ends.max()) - start, 1e-12)
    else:
        span = 0.0
    out_tokens = int(rec["output_tokens"][completed].sum()) if n else 0
    in_tokens = int(rec["prompt_tokens"][completed].sum()) if n else 0
    slo = slo or SLO()
    ok = completed.copy()
    if slo.ttft_s is not None:
        ok &= np.nan_to_num(rec["ttft_s"], nan=np.inf) <= slo.ttft_s
    if slo.tpot_s is not None:
        ok &= np.nan_to_num(rec["tpot_s"], nan=0.0) <= slo.tpot_s
    rate = (lambda x: x / span) if span > 0 else (lambda x: 0.0)
    summary = {
        "requests": {
            "total": n,
            "finished": int(completed.sum()),
            "rejected": int(rejected.sum()),
            "aborted": int(aborted.sum()),
            "preempted": int((rec["preemptions"] > 0).sum()) if n else 0,
        },
        "throughput": {
            "output_tokens_per_s": rate(out_tokens),
            "total_tokens_per_s": rate(out_tokens + in_tokens),
            "requests_per_s": rate(int(completed.sum())),
        },
        "ttft_s": _stats(rec["ttft_s"][completed]),
        "tpot_s": _stats(rec["tpot_s"][completed]),
        "itl_s": itl.stats(PERCENTILES),  # exact; the mean rounded once
        "e2e_s": _stats(rec["e2e_s"][completed]),
        "queueing_s": _stats(rec["queueing_s"][completed]),
        "slo": {
            "ttft_s": slo.ttft_s,
            "tpot_s": slo.tpot_s,
            "attainment": float(ok.sum() / n) if n else 0.0,
            "goodput_rps": rate(int(ok.sum())),
        },
        "kv": {"peak_usage": float(kv_peak_usage), "prefix_hit_rate": float(prefix_hit_rate)},
        "preemptions": int(rec["preemptions"].sum()) if n else 0,
        "tokens": {"prompt": in_tokens, "output": out_tokens},
        "span_s": span,
        "wall_s": float(wall_s),
    }
    if warmup:
        summary["requests"]["warmup"] = int(warmup)
    if extra:
        summary.update(extra)
    return summary


def write_summary(summary: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def write_records(records: dict[str, np.ndarray], path: str | Path) -> Path:
    """Write per-request records as Parquet (or CSV when `path` ends in .csv)."""
    import pyarrow as pa

    path = Path(path)
    table = pa.table({k: (v.tolist() if v.dtype == object else v) for k, v in records.items()})
    if path.suffix == ".csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, path)
    else:
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    return path
