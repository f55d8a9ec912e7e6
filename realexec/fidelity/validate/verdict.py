"""Comparing real and simulated runs: signed errors, the real repeats' own spread, and a
verdict per metric. Pure (no torch, no simulator run).

Error = (simulated - real mean) / real mean (`ABSOLUTE` metrics: simulated - real mean, in
their unit). Spread = the largest relative deviation of one real repeat from the repeats'
mean, max_i |x_i - mean| / mean (for two repeats: half their range over their mean); one
repeat measures no spread (None).

Verdicts, per metric with a tolerance (`TARGETS`):
- `met`: |error| <= tolerance;
- `within noise`: |error| <= tolerance + spread (the simulator misses by no more than the
  real engine misses itself from one run to the next at that rate);
- `missed`: otherwise (also when one repeat measured no spread and |error| > tolerance).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

# (name, path in summary.json)
METRICS = (
    ("throughput_tok_s", ("throughput", "output_tokens_per_s")),
    ("throughput_req_s", ("throughput", "requests_per_s")),
    ("ttft_p50", ("ttft_s", "p50")), ("ttft_p90", ("ttft_s", "p90")), ("ttft_p99", ("ttft_s", "p99")),
    ("tpot_p50", ("tpot_s", "p50")), ("tpot_p90", ("tpot_s", "p90")), ("tpot_p99", ("tpot_s", "p99")),
    ("e2e_p50", ("e2e_s", "p50")), ("e2e_p90", ("e2e_s", "p90")), ("e2e_p99", ("e2e_s", "p99")),
    ("preemptions", ("preemptions",)),
    # reported, not judged: where a TTFT error comes from (waiting vs being served)
    ("queueing_p50", ("queueing_s", "p50")), ("queueing_p90", ("queueing_s", "p90")),
    ("queueing_p99", ("queueing_s", "p99")),
)
# Compared as sim - real in their own unit (a relative error of a near-zero wait says nothing).
ABSOLUTE = ("preemptions", "queueing_p50", "queueing_p90", "queueing_p99")
# Tolerances (|relative error|) of issue 8, kept by issue 31: 5% throughput and p50, 10% p90
# and p99. Output-token throughput stands for throughput (requests/s of the same finite run
# is the same span over a count; it is reported, not judged twice).
TARGETS = {"throughput_tok_s": 0.05, "ttft_p50": 0.05, "tpot_p50": 0.05, "e2e_p50": 0.05,
           "ttft_p90": 0.10, "ttft_p99": 0.10, "tpot_p90": 0.10, "tpot_p99": 0.10,
           "e2e_p90": 0.10, "e2e_p99": 0.10}
MET, NOISE, MISSED = "met", "within noise", "missed"
VERDICTS = (MET, NOISE, MISSED)


def get_path(d: dict[str, Any], path: Sequence[str]) -> float | None:
    for k in path:
        d = d.get(k) if isinstance(d, dict) else None
    return None if d is None else float(d)


def spread(values: Sequence[float]) -> float | None:
    """max_i |x_i - mean| / mean over the repeats; None from fewer than two (no spread
    measured); 0 when the mean is 0."""
    if len(values) < 2:
        return None
    mean = float(np.mean(values))
    return float(max(abs(v - mean) for v in values) / abs(mean)) if mean else 0.0


def classify(error: float | None, tolerance: float, spread_: float | None) -> str | None:
    """The verdict of one metric (module docstring); None without an error."""
    if error is None:
        return None
    if abs(error) <= tolerance:
        return MET
    if spread_ is not None and abs(error) <= tolerance + spread_:
        return NOISE
    return MISSED


def compare(real: list[dict[str, Any]], sim: dict[str, Any] | list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: real values per repeat, their mean and spread, the simulated value (the mean
    over `sim` when it is a list of summaries, one per real run), the signed error and, for
    `TARGETS` metrics, the tolerance and verdict."""
    sims = sim if isinstance(sim, list) else [sim]
    out = {}
    for name, path in METRICS:
        vals = [v for v in (get_path(s, path) for s in real) if v is not None]
        got = [get_path(s, path) for s in sims]
        sv = None if not got or any(v is None for v in got) else float(np.mean(got))
        entry: dict[str, Any] = {"real": vals, "sim": sv, "error": None, "spread": None}
        if vals and sv is not None:
            mean = float(np.mean(vals))
            err = sv - mean if name in ABSOLUTE else ((sv - mean) / mean if mean else None)
            entry.update(real_mean=mean, spread=spread(vals), error=err)
        if name in TARGETS:
            entry["tolerance"] = TARGETS[name]
            entry["verdict"] = classify(entry["error"], TARGETS[name], entry["spread"])
        out[name] = entry
    return out


def judged(result: dict[str, Any]) -> bool:
    """Whether a rate's verdicts count: an under-loaded rate (an over-loaded one's queue,
    real and simulated, grows with the run's length, so its latencies measure the run)."""
    return result.get("label") != "over-loaded"


def count_verdicts(results: Iterable[dict[str, Any]]) -> dict[str, int]:
    """{met, within noise, missed} over the judged rates' `TARGETS` metrics."""
    counts = dict.fromkeys(VERDICTS, 0)
    for r in results:
        if not judged(r):
            continue
        for m in TARGETS:
            v = (r["metrics"].get(m) or {}).get("verdict")
            if v:
                counts[v] += 1
    return counts


def spread_summary(results: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The real repeats' run-to-run spread over every rate's `TARGETS` metrics: median and
    max (fractions) and how many (rate, metric) pairs measured one."""
    got = [r["metrics"][m]["spread"] for r in results for m in TARGETS
           if (r["metrics"].get(m) or {}).get("spread") is not None]
    if not got:
        return {"median": None, "max": None, "count": 0}
    return {"median": float(np.median(got)), "max": float(max(got)), "count": len(got)}


def any_missed(results: Iterable[dict[str, Any]]) -> bool:
    return count_verdicts(results)[MISSED] > 0
