"""Loaders on the real traces (../shared/data/traces or $KVPD_TRACES_DIR), checked against values computed
here independently (csv/json modules, plain Python) and against the figures in each
trace's README."""

from __future__ import annotations

import csv
import json
from datetime import datetime

import numpy as np
import pytest

from workloads import load_trace, trace_stats
from workloads.shared_traces import traces_dir

TRACES = traces_dir()
AZURE = TRACES / "azure2023_AzureLLMInferenceTrace_conv.csv"
MOONCAKE = TRACES / "mooncake_synthetic_trace.jsonl"
SHAREGPT = TRACES / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"

pytestmark = pytest.mark.skipif(
    not TRACES.is_dir(), reason=f"real traces not found at {TRACES} (../shared/data/traces)"
)


def _percentiles(values: list[int]) -> dict[str, float]:
    """Linear-interpolation percentiles computed by hand (not numpy)."""
    s = sorted(values)

    def pct(p: float) -> float:
        pos = (len(s) - 1) * p / 100
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    return {"mean": sum(s) / len(s), "p50": pct(50), "p90": pct(90), "p99": pct(99), "max": s[-1]}


def _check_lengths(stats: dict[str, float], expected: dict[str, float]) -> None:
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, rel=1e-12), key


def test_azure_conv_matches_independent_parse():
    with open(AZURE, newline="") as fh:
        rows = list(csv.DictReader(fh))
    # datetime keeps microseconds; the file has 7 digits, so allow 1 us.
    stamps = [datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in rows]
    t0 = min(stamps)
    arrival = [(s - t0).total_seconds() for s in stamps]
    prompt = [int(r["ContextTokens"]) for r in rows]
    output = [int(r["GeneratedTokens"]) for r in rows]

    trace = load_trace(AZURE)
    assert len(trace) == len(rows) == 19366
    assert trace.load_report.rows_read == 19366 and trace.load_report.rows_dropped == 0
    np.testing.assert_allclose(trace.arrival_s, arrival, rtol=0, atol=1e-6)
    assert trace.prompt_len.tolist() == prompt and trace.output_len.tolist() == output

    st = trace_stats(trace)
    span = max(arrival) - min(arrival)
    assert st["duration_s"] == pytest.approx(span, abs=1e-6)
    assert st["rate_rps_mean"] == pytest.approx(len(rows) / span, rel=1e-9)
    gaps = [b - a for a, b in zip(arrival, arrival[1:])]
    mean_gap = sum(gaps) / len(gaps)
    cv = (sum((g - mean_gap) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean_gap
    assert st["interarrival_cv"] == pytest.approx(cv, rel=1e-5)
    per_minute: dict[int, int] = {}
    for a in arrival:
        per_minute[int(a // 60)] = per_minute.get(int(a // 60), 0) + 1
    assert st["rate_per_min_peak"] == max(per_minute.values())
    _check_lengths(st["prompt_len"], _percentiles(prompt))
    _check_lengths(st["output_len"], _percentiles(output))
    # Figures from the trace's README.
    assert round(st["rate_rps_mean"], 2) == 5.53 and round(st["interarrival_cv"], 2) == 1.09
    assert st["rate_per_min_peak"] == 507
    assert st["prompt_len"]["p90"] == 2734.5 and st["output_len"]["p99"] == 601


def _reuse_by_hand(rows: list[dict], block: int) -> tuple[float, float, float, int, int]:
    """Infinite prefix cache in file order: longest previously-seen leading run of hash ids."""
    seen: set[int] = set()
    hit_blocks = total_blocks = hit_tokens = total_tokens = with_hit = 0
    for r in rows:
        run = 0
        for h in r["hash_ids"]:
            if h not in seen:
                break
            run += 1
        seen.update(r["hash_ids"])
        hit_blocks += run
        total_blocks += len(r["hash_ids"])
        hit_tokens += min(run * block, r["input_length"])
        total_tokens += r["input_length"]
        with_hit += run > 0
    return (
        hit_blocks / total_blocks,
        hit_tokens / total_tokens,
        with_hit / len(rows),
        len(seen),
        total_blocks,
    )


def test_mooncake_matches_independent_parse():
    with open(MOONCAKE) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    trace = load_trace(MOONCAKE)
    assert len(trace) == len(rows) == 3993
    np.testing.assert_array_equal(trace.arrival_s, [r["timestamp"] / 1000 for r in rows])
    assert trace.prompt_len.tolist() == [r["input_length"] for r in rows]
    assert trace.output_len.tolist() == [r["output_length"] for r in rows]
    assert all(trace.hash_ids_of(i) == r["hash_ids"] for i, r in enumerate(rows))
    assert trace.load_report.warnings == []  # every row has ceil(input_length / 512) hashes

    st = trace_stats(trace)
    block_hit, token_hit, req_hit, unique, total = _reuse_by_hand(rows, 512)
    px = st["prefix"]
    assert px["block_hit_ratio"] == pytest.approx(block_hit, rel=1e-12)
    assert px["token_hit_ratio"] == pytest.approx(token_hit, rel=1e-12)
    assert px["requests_with_hit"] == pytest.approx(req_hit, rel=1e-12)
    assert (px["unique_blocks"], px["total_blocks"]) == (unique, total)
    # Figures from the trace's README.
    assert (unique, total) == (43924, 121877)
    assert round(block_hit, 4) == 0.6396 and round(token_hit, 4) == 0.6512
    assert round(st["rate_rps_mean"], 3) == 3.907 and st["rate_per_min_peak"] == 273
    _check_lengths(st["prompt_len"], _percentiles([r["input_length"] for r in rows]))


def test_sharegpt_lengths_with_synthetic_arrivals():
    with open(SHAREGPT, newline="") as fh:
        rows = list(csv.DictReader(fh))
    prompt = [int(r["num_prefill_tokens"]) for r in rows]
    output = [int(r["num_decode_tokens"]) for r in rows]
    trace = load_trace(SHAREGPT, arrival={"process": "poisson", "rate": 4.0}, seed=7)
    assert len(trace) == len(rows) == 30731
    assert trace.prompt_len.tolist() == prompt and trace.output_len.tolist() == output
    st = trace_stats(trace)
    _check_lengths(st["prompt_len"], _percentiles(prompt))
    _check_lengths(st["output_len"], _percentiles(output))
    assert round(st["prompt_len"]["mean"]) == 2340 and st["output_len"]["p90"] == 834
    # 30,731 Poisson arrivals at 4 req/s: the sample rate is within 3 % (> 5 sd).
    assert st["rate_rps_mean"] == pytest.approx(4.0, rel=0.03)
