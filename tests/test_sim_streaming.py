"""The fast paths change nothing: streamed records, exact ITL distribution, decode bursts and
runs split across processes give the figures of a step-by-step run that keeps every request."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator.distribution as dist_mod
from simulator.distribution import ExactDistribution
from simulator.multiproc import split_refusal
from simulator.progress import ProgressBar
from simulator.run import run_scenario
from simulator.scenario import scenario_from_dict
from tests.sim_helpers import BASE, merged

SMALL = merged(BASE, {"output": {"plots": False, "timeseries": True},
                      "workload": {"synthetic": {"num_requests": 120, "arrival": {
                          "process": "poisson", "rate": 6.0}}}})


def _run(d: dict, **kw):
    return run_scenario(scenario_from_dict(d), **kw)


def _comparable(summary: dict) -> dict:
    s = dict(summary, sim=dict(summary["sim"]))
    s.pop("wall_s")
    s["sim"].pop("requests_per_wall_s")
    return s


def _assert_same(a, b) -> None:
    assert _comparable(a.summary) == _comparable(b.summary)
    for key, col in a.records.items():
        other = b.records[key]
        if col.dtype == object:
            assert list(col) == list(other), key
        else:
            np.testing.assert_array_equal(col, other, err_msg=key)


CASES = {
    "colocated": {"cluster": {"replicas": 2, "router": "least_outstanding_tokens"},
                  "cache": {"num_gpu_blocks": 600}, "scheduler": {"max_model_len": 3000}},
    "pd": {"cluster": {"pd": {"prefill": {"replicas": 1}, "decode": {"replicas": 1},
                              "link": "ib-ndr"}}},
    "prefix_caching": {"model": "qwen2.5-7b", "hardware": "h200-sxm",
                       "cache": {"enable_prefix_caching": True, "num_gpu_blocks": 40_000},
                       "scheduler": {"max_model_len": 131072},
                       "workload": {"synthetic": None, "limit": 60, "target_rate": 1.0}},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_streamed_bursts_equal_step_by_step_with_every_request_kept(case, traces_dir):
    patch = CASES[case]
    if case == "prefix_caching":
        patch = merged(patch, {"workload": {
            "trace": str(traces_dir / "mooncake_synthetic_trace.jsonl")}})
    fast = _run(merged(SMALL, patch))
    slow = _run(merged(SMALL, merged(patch, {"sim": {"max_decode_burst": 1}})), keep_requests=True)
    _assert_same(fast, slow)
    assert fast.summary["sim"]["num_steps"] > 0
    if case == "prefix_caching":
        assert fast.summary["kv"]["prefix_hit_rate"] > 0
    if case == "pd":
        assert fast.summary["kv_transfer_s"]["count"] == 120


def test_released_requests_are_refused_with_the_flag_to_keep_them():
    res = _run(SMALL)
    with pytest.raises(RuntimeError, match="sim.keep_requests"):
        res.requests  # noqa: B018
    kept = _run(SMALL, keep_requests=True)
    assert [r.request_id for r in kept.requests] == [str(i) for i in range(120)]
    assert all(len(r.token_times) == r.num_output_tokens for r in kept.requests)


def test_round_robin_replicas_in_two_processes_equal_one_process():
    d = merged(SMALL, {"cluster": {"replicas": 3, "router": "round_robin"},
                       "cache": {"num_gpu_blocks": 500}, "scheduler": {"max_model_len": 3000}})
    one = _run(d)
    two = _run(merged(d, {"sim": {"processes": 2}}))
    _assert_same(one, two)
    a, b = one.timeline.columns(), two.timeline.columns()
    for key in a:
        assert list(a[key]) == list(b[key]), key
    assert set(two.summary["replica_busy_fraction"]) == {"r0", "r1", "r2"}


def test_scenarios_whose_replicas_interact_are_not_split(capsys):
    base = merged(SMALL, {"sim": {"processes": 2}})
    assert "round_robin" in split_refusal(scenario_from_dict(merged(base, {"cluster": {
        "replicas": 2, "router": "least_outstanding_tokens"}})))
    assert "PD" in split_refusal(scenario_from_dict(merged(base, {"cluster": {"pd": {
        "prefill": {"replicas": 1}, "decode": {"replicas": 1}}}})))
    assert "max_concurrency" in split_refusal(scenario_from_dict(merged(base, {
        "cluster": {"replicas": 2, "router": "round_robin"}, "workload": {"max_concurrency": 4}})))
    res = _run(merged(base, {"cluster": {"replicas": 2, "router": "least_kv_usage"}}))
    assert res.summary["requests"]["finished"] == 120
    assert "sim.processes = 2 ignored" in capsys.readouterr().err


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 0.5, allow_nan=False), min_size=1, max_size=300),
       st.integers(1, 4), st.integers(1, 50))
def test_exact_distribution_equals_numpy_bit_for_bit(values, repeat, compact_at):
    v = np.array(values * repeat)  # duplicates, as gaps shared by a batch are
    old = dist_mod._COMPACT_AT
    dist_mod._COMPACT_AT = compact_at
    try:
        d, other = ExactDistribution(), ExactDistribution()
        for i, part in enumerate(np.array_split(v, 5)):
            (d if i % 2 else other).add(part)
        d.merge(other)
    finally:
        dist_mod._COMPACT_AT = old
    assert d.percentiles((50, 90, 99)) == list(np.percentile(v, (50, 90, 99)))
    assert d.mean() == float(sum(Fraction(x) for x in v.tolist()) / len(v))
    assert d.max() == v.max() and len(d) == len(v)


def test_progress_line_is_rate_limited():
    out = io.StringIO()
    bar = ProgressBar(1_000_000, stream=out, log_interval_s=3600)
    for _ in range(100_000):
        bar.update(10)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "1000000/1000000" in lines[0]
