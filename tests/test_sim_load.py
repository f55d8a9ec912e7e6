"""Benchmark-style load in the simulator: every request at t = 0 (`arrival: {process: burst}`),
a closed loop (`workload.max_concurrency`), and `scheduler.capacity_policy` end to end."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.run import run_scenario
from simulator.scenario import load_scenario, scenario_from_dict
from tests.sim_helpers import BASE, merged, sim

BURST = {"workload": {"arrival": {"process": "burst"}}}


def in_flight_max(requests) -> int:
    """The most requests sent and not finished at once (a finish frees its slot before a send
    at the same instant)."""
    events = sorted([(r.arrival_time, 1) for r in requests]
                    + [(r.finish_time, -1) for r in requests])  # -1 sorts first
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def closed(n: int | None, patch: dict | None = None):
    w = {"arrival": {"process": "burst"}}
    if n is not None:
        w["max_concurrency"] = n
    return sim(merged({"workload": w}, patch or {}))


def test_burst_sends_every_request_at_zero_and_keeps_lengths():
    open_loop, burst = sim(), sim(BURST)
    assert np.all(burst.records["arrival_s"] == 0.0)
    np.testing.assert_array_equal(burst.records["prompt_tokens"], open_loop.records["prompt_tokens"])
    np.testing.assert_array_equal(burst.records["output_tokens"], open_loop.records["output_tokens"])
    syn = merged(BASE, {"workload": {"synthetic": {"arrival": {"process": "burst"}}}})
    direct = run_scenario(scenario_from_dict(syn))
    np.testing.assert_array_equal(direct.records["ttft_s"], burst.records["ttft_s"])
    assert "load" not in burst.summary


@pytest.mark.parametrize("n", [1, 3, 16])
def test_closed_loop_never_has_more_than_n_in_flight(n):
    res = closed(n)
    assert in_flight_max(res.requests) == n
    assert res.summary["load"] == {"max_concurrency": n, "max_in_flight": n}
    assert np.all(res.records["finish_reason"] == "length")


def test_one_at_a_time_sends_each_request_when_the_previous_ends():
    res = closed(1, {"workload": {"synthetic": {"num_requests": 30}}})
    rec = res.records
    finish = [r.finish_time for r in res.requests]
    np.testing.assert_array_equal(rec["arrival_s"][1:], finish[:-1])
    assert res.summary["span_s"] == pytest.approx(rec["e2e_s"].sum(), rel=1e-12)
    assert np.all(rec["queueing_s"] == 0.0)  # alone in the engine: scheduled when sent


def test_more_slots_than_the_engine_runs_gives_the_bursts_schedule():
    # a 2,000-block pool holds ~47 of these requests; 64 slots keep its queue full, so the
    # engine runs exactly the burst's steps; only TTFT (counted from the send) differs
    patch = {"cache": {"num_gpu_blocks": 2000}}
    burst, loop = closed(None, patch), closed(64, patch)
    assert loop.summary["span_s"] == burst.summary["span_s"]
    assert loop.summary["throughput"] == burst.summary["throughput"]
    assert loop.summary["ttft_s"]["p50"] < burst.summary["ttft_s"]["p50"]
    # as many slots as requests: identical to the burst, request for request
    every = closed(200, patch)
    for key in ("arrival_s", "ttft_s", "e2e_s", "preemptions"):
        np.testing.assert_array_equal(every.records[key], burst.records[key])


def test_throughput_grows_with_concurrency_and_ttft_with_it():
    runs = {n: closed(n, {"workload": {"synthetic": {"num_requests": 64}}}) for n in (1, 4, 16)}
    tput = [runs[n].summary["throughput"]["output_tokens_per_s"] for n in (1, 4, 16)]
    tpot = [runs[n].summary["tpot_s"]["p50"] for n in (1, 4, 16)]
    assert tput[0] < tput[1] < tput[2]
    assert tpot[0] < tpot[1] < tpot[2]  # bigger decode batches cost more per step


def test_closed_loop_with_pd_keeps_the_limit():
    patch = {"cluster": {"pd": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}},
             "workload": {"synthetic": {"num_requests": 60}}}
    res = closed(5, patch)
    assert in_flight_max(res.requests) == 5
    assert np.all(res.records["finish_reason"] == "length")


def test_guaranteed_no_evict_never_preempts_where_max_utilization_does():
    small = {"cache": {"num_gpu_blocks": 400}}
    greedy = closed(None, small)
    safe = closed(None, merged(small, {"scheduler": {"capacity_policy": "guaranteed_no_evict"}}))
    assert greedy.records["preemptions"].sum() > 0
    assert safe.records["preemptions"].sum() == 0
    assert np.all(safe.records["finish_reason"] == "length")
    assert safe.summary["requests"]["finished"] == 200


def test_workload_ignore_eos_reaches_sglangs_admission():
    """SGLang without its radix cache admits a request its client told to ignore EOS only when
    every running one can still finish: the burst that makes its budget test preempt runs
    without a preemption, with the same tokens; with prefix caching on the flag changes nothing."""
    base = merged({"cache": {"num_gpu_blocks": 400, "enable_prefix_caching": False}},
                  {"scheduler": {"capacity_policy": "reserve_ratio"}})
    told = merged(base, {"workload": {"ignore_eos": True}})
    budget, finish_order = closed(None, base), closed(None, told)
    assert budget.records["preemptions"].sum() > 0
    assert finish_order.records["preemptions"].sum() == 0
    assert finish_order.summary["requests"]["finished"] == 200
    np.testing.assert_array_equal(finish_order.records["output_tokens"],
                                  budget.records["output_tokens"])
    cached = merged(base, {"cache": {"enable_prefix_caching": True}})
    a, b = closed(None, cached), closed(None, merged(cached, {"workload": {"ignore_eos": True}}))
    np.testing.assert_array_equal(a.records["ttft_s"], b.records["ttft_s"])


def test_closed_loop_decode_bursts_equal_step_by_step():
    # (a burst's end times are summed once, a step's one by one: equal to rounding)
    bursts, steps = closed(6), closed(6, {"sim": {"max_decode_burst": 1}})
    assert bursts.summary["sim"]["num_steps"] == steps.summary["sim"]["num_steps"]
    for key in ("arrival_s", "ttft_s", "e2e_s", "tpot_s"):
        np.testing.assert_allclose(bursts.records[key], steps.records[key], rtol=1e-12, atol=1e-12)


def test_the_same_closed_loop_scenario_gives_identical_results():
    a, b = closed(7), closed(7)
    for key in a.records:
        np.testing.assert_array_equal(a.records[key], b.records[key])


# ------------------------------------------------------------------ bad input
def _write(tmp_path, text: str):
    path = tmp_path / "bench.yaml"
    path.write_text(text)
    return path


BENCH_YAML = """
name: bench
model: llama-3-8b
hardware: h100-sxm
output: {plots: false}
cache: {num_gpu_blocks: 100}
workload:
  synthetic:
    num_requests: 20
    arrival: {process: burst}
    prompt_len: {dist: fixed, value: 1000}
    output_len: {dist: fixed, value: 200}
"""


@pytest.mark.parametrize(("override", "message"), [
    ("workload.max_concurrency=0", "workload.max_concurrency: Input should be greater than or equal to 1"),
    ("workload.max_concurrency=2.5", "workload.max_concurrency: Input should be a valid integer"),
    ("workload.max_concurrency='4'", "workload.max_concurrency: Input should be a valid integer"),
    ("workload.arrival={process: burst, rate: 2}", "workload.arrival.rate: unknown key for process burst"),
    ("workload.arrival={process: sometimes}", "workload.arrival.process: expected one of"),
    ("workload.ignore_eos='yes'", "workload.ignore_eos: Input should be a valid boolean"),
    ("scheduler.capacity_policy=never", "scheduler.capacity_policy: Input should be 'max_utilization', 'guaranteed_no_evict' or 'reserve_ratio'"),
])
def test_bad_load_keys_name_the_file_and_key(tmp_path, override, message):
    path = _write(tmp_path, BENCH_YAML)
    with pytest.raises(ValueError, match=str(path)) as err:
        load_scenario(path, [override])
    assert message in str(err.value)


def test_arrival_conflicts_with_rate_keys(tmp_path):
    path = _write(tmp_path, BENCH_YAML)
    with pytest.raises(ValueError, match="workload.arrival replaces the trace's arrival times; "
                       "drop workload.target_rate"):
        load_scenario(path, ["workload.arrival={process: burst}", "workload.target_rate=3"])
    sc = load_scenario(path, ["workload.target_rate=3"])  # a synthetic burst has no rate
    with pytest.raises(ValueError, match="workload.target_rate: every request .* arrives at t = 0"):
        run_scenario(sc)
    with pytest.raises(ValueError, match="synthesize.duration_s: arrival process burst"):
        run_scenario(load_scenario(path, ["workload.synthetic.duration_s=10",
                                          "workload.synthetic.num_requests=null"]))


def test_a_burst_that_can_never_be_served_is_refused_before_simulating(tmp_path):
    path = _write(tmp_path, BENCH_YAML)
    # 1,200 tokens = 75 blocks fit the pool of 100; 2,000 + 200 = 138 blocks never do
    assert run_scenario(load_scenario(path)).summary["requests"]["finished"] == 20
    sc = load_scenario(path, ["workload.synthetic.prompt_len.value=2000"])
    with pytest.raises(ValueError) as err:
        run_scenario(sc)
    assert str(err.value).startswith(
        f"{path}: workload.synthetic.arrival.process = burst: 20 of 20 requests can never be "
        "served by the colocated pool, e.g. request 0: needs 138 KV blocks for 2200 tokens but "
        "the whole pool has 100")
    sc = load_scenario(path, ["workload.synthetic.prompt_len.value=8100", "cache.num_gpu_blocks=10000",
                              "workload.max_concurrency=4"])
    with pytest.raises(ValueError, match=r"workload.max_concurrency = 4 and workload.synthetic.arrival."
                       r"process = burst: 20 of 20 .* prompt \(8100 tokens\) \+ max_tokens \(200\) = "
                       r"8300 exceeds max_model_len \(8192\)"):
        run_scenario(sc)
    # the same requests in an open loop are rejected one by one, as an engine would
    sc = load_scenario(path, ["workload.synthetic.prompt_len.value=2000",
                              "workload.synthetic.arrival={process: constant, rate: 10}"])
    assert run_scenario(sc).summary["requests"]["rejected"] == 20


def test_pd_pools_are_checked_by_their_own_rule(tmp_path):
    # a prefill pool holds the prompt only; the decode pool the whole length
    pd = ["cluster.pd={prefill: {num_gpu_blocks: 100}, decode: {num_gpu_blocks: 60}}"]
    path = _write(tmp_path, BENCH_YAML)
    with pytest.raises(ValueError, match="can never be served by the decode pool, e.g. request 0: "
                       "needs 75 KV blocks for 1200 tokens but the whole pool has 60"):
        run_scenario(load_scenario(path, pd))
