"""Summary statistics of a trace (what `kvpd trace info` prints).

Conventions: rates use the span from the first to the last arrival
(mean rate = rows / duration_s); per-minute counts use 60-s buckets starting at
the first arrival (the last, partial bucket included); percentiles use linear
interpolation (numpy's default); the inter-arrival CV is std / mean of the gaps
(population std).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workloads.ragged import Ragged
from workloads.trace import Trace

PERCENTILES = (50, 90, 99)


def length_stats(values: np.ndarray) -> dict[str, float]:
    """mean, p50, p90, p99, max and min of a length column (tokens)."""
    if not len(values):
        return {k: float("nan") for k in ("mean", "p50", "p90", "p99", "max", "min")}
    out = {"mean": float(values.mean())}
    for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES)):
        out[f"p{p}"] = float(v)
    out["max"] = float(values.max())
    out["min"] = float(values.min())
    return out


def per_minute_counts(arrival_s: np.ndarray) -> np.ndarray:
    """Requests in each 60-s bucket from the first arrival."""
    if not len(arrival_s):
        return np.zeros(0, dtype=np.int64)
    return np.bincount(((arrival_s - arrival_s[0]) // 60.0).astype(np.int64))


def prefix_reuse(hash_ids: Ragged, prompt_len: np.ndarray, block_size: int) -> dict[str, float]:
    """Prefix-cache reuse with an infinite cache, replaying requests in trace order.

    A request hits the longest leading run of its hash ids that all appeared in
    earlier requests. Block hit ratio = hit blocks / all blocks; token hit ratio =
    hit tokens (min(hit blocks * block_size, prompt_len)) / prompt tokens.
    """
    values, lengths = hash_ids.values, hash_ids.lengths()
    n, total = len(lengths), len(values)
    if not total:
        return {
            "block_hit_ratio": 0.0,
            "token_hit_ratio": 0.0,
            "requests_with_hit": 0.0,
            "unique_blocks": 0,
            "total_blocks": 0,
        }
    row = np.repeat(np.arange(n), lengths)
    uniq, first_pos, inverse = np.unique(values, return_index=True, return_inverse=True)
    seen_before = row[first_pos][inverse] < row
    # A block hits iff it and every block before it in the same row were seen before.
    misses = np.cumsum(~seen_before)
    row_start = hash_ids.offsets[:-1]
    misses_before_row = np.where(row_start > 0, misses[np.maximum(row_start - 1, 0)], 0)
    hit = (misses - np.repeat(misses_before_row, lengths)) == 0
    hits_per_row = np.bincount(row[hit], minlength=n)
    hit_tokens = np.minimum(hits_per_row * block_size, prompt_len)
    return {
        "block_hit_ratio": float(hits_per_row.sum() / total),
        "token_hit_ratio": float(hit_tokens.sum() / max(int(prompt_len.sum()), 1)),
        "requests_with_hit": float((hits_per_row > 0).mean()),
        "unique_blocks": int(len(uniq)),
        "total_blocks": int(total),
    }


def trace_stats(trace: Trace) -> dict[str, Any]:
    """Rows, span, rates, inter-arrival CV, length percentiles and (with hashes) prefix reuse."""
    n, span = len(trace), trace.duration_s
    gaps = np.diff(trace.arrival_s)
    minutes = per_minute_counts(trace.arrival_s)
    out: dict[str, Any] = {
        "name": trace.name,
        "rows": n,
        "duration_s": span,
        "rate_rps_mean": n / span if span > 0 else float("nan"),
        "rate_per_min_mean": 60.0 * n / span if span > 0 else float("nan"),
        "rate_per_min_peak": int(minutes.max()) if len(minutes) else 0,
        "interarrival_cv": float(gaps.std() / gaps.mean())
        if len(gaps) and gaps.mean() > 0
        else float("nan"),
        "prompt_len": length_stats(trace.prompt_len),
        "output_len": length_stats(trace.output_len),
        "prefix": None,
    }
    if trace.hash_ids is not None:
        out["prefix"] = {
            "block_size": trace.hash_block_size,
            **prefix_reuse(trace.hash_ids, trace.prompt_len, trace.hash_block_size),
        }
    return out
