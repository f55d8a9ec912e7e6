"""`workload.warmup_requests` (and `kvpd replay --warmup-requests`): the first N requests run
but stay out of every summary figure, across one or several processes; bad values are
refused before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.distribution import ExactDistribution
from simulator.metrics import all_itls, summarize
from simulator.run import run_scenario
from simulator.scenario import scenario_from_dict


def _scenario(warmup: int, **extra) -> dict:
    return {
        "name": "w", "model": "llama-3-8b", "hardware": "h100-sxm", "seed": 3,
        "workload": {"synthetic": {"num_requests": 80, "arrival": {"process": "burst"},
                                   "prompt_len": {"dist": "uniform", "min": 200, "max": 3000},
                                   "output_len": {"dist": "uniform", "min": 20, "max": 200}},
                     "max_concurrency": 16, "warmup_requests": warmup},
        "output": {"plots": False, "timeseries": False},
        **extra,
    }


def test_warmup_requests_run_but_stay_out_of_the_summary():
    res = run_scenario(scenario_from_dict(_scenario(16)), keep_requests=True)
    s, rec, reqs = res.summary, res.records, res.requests
    assert len(rec["arrival_s"]) == 80  # every request keeps its record
    assert s["requests"]["warmup"] == 16 and s["requests"]["total"] == 64
    measured = rec["ttft_s"][16:]
    assert s["ttft_s"]["mean"] == pytest.approx(float(np.mean(measured)), rel=1e-12)
    assert s["ttft_s"]["max"] == pytest.approx(float(np.max(measured)), rel=1e-12)
    assert s["tokens"]["output"] == int(rec["output_tokens"][16:].sum())
    span = float((rec["arrival_s"] + rec["e2e_s"])[16:].max() - rec["arrival_s"][16:].min())
    assert s["span_s"] == pytest.approx(span, rel=1e-12)
    itl = ExactDistribution.of(all_itls(reqs[16:])).stats((50, 90, 99))
    assert s["itl_s"] == itl
    # the first wave (16 prompts sent at once) is what the warm-up leaves out
    full = run_scenario(scenario_from_dict(_scenario(0))).summary
    assert "warmup" not in full["requests"] and full["requests"]["total"] == 80
    assert full["ttft_s"]["max"] > s["ttft_s"]["max"]


def test_several_processes_give_the_same_summary():
    def run(processes: int) -> dict:
        sc = _scenario(10, cluster={"replicas": 2, "router": "round_robin"},
                       sim={"processes": processes})
        sc["workload"].pop("max_concurrency")  # an open loop splits
        sc["workload"]["synthetic"]["arrival"] = {"process": "poisson", "rate": 20}
        out = run_scenario(scenario_from_dict(sc)).summary
        return {k: v for k, v in out.items() if k not in ("wall_s", "sim")}

    assert run(1) == run(2)


def test_summarize_leaves_out_the_first_rows_as_replay_does():
    res = run_scenario(scenario_from_dict(_scenario(0)), keep_requests=True)
    reqs = res.requests
    a = summarize(reqs, warmup=5)
    b = summarize(reqs[5:])
    assert a["requests"].pop("warmup") == 5 and "warmup" not in b["requests"]
    assert a == b


def test_a_warmup_that_leaves_nothing_to_measure_is_refused():
    with pytest.raises(ValueError, match=r"workload.warmup_requests = 80 leaves none of the "
                       r"workload's 80 requests to measure; allowed: 0 to 79"):
        run_scenario(scenario_from_dict(_scenario(80)))
    with pytest.raises(ValueError, match="warmup_requests"):
        scenario_from_dict(_scenario(-1))


def test_replay_refuses_a_warmup_before_replaying():
    import workloads
    from realexec.serving.replay.runner import replay

    trace = workloads.synthesize({"num_requests": 4, "arrival": {"process": "burst"}, "prompt_len": {"dist": "fixed", "value": 8},
                                  "output_len": {"dist": "fixed", "value": 2}}, seed=0)
    with pytest.raises(ValueError, match=r"warmup_requests must be an integer from 0 to 3"):
        replay(trace, "inproc", llm=object(), warmup_requests=4)


def _drain_scenario(closed: bool, **extra) -> dict:
    sc = _scenario(16, **extra)
    sc["workload"]["warmup_drain"] = True
    if not closed:
        sc["workload"].pop("max_concurrency")
        sc["workload"]["synthetic"]["arrival"] = {"process": "poisson", "rate": 40}
    return sc


@pytest.mark.parametrize("closed", [True, False])
def test_a_drained_warmup_finishes_before_the_first_measured_request_is_sent(closed):
    res = run_scenario(scenario_from_dict(_drain_scenario(closed)), keep_requests=True)
    rec, s = res.records, res.summary
    warm_end = float((rec["arrival_s"] + rec["e2e_s"])[:16].max())
    first = float(rec["arrival_s"][16:].min())
    assert s["load"]["warmup_drained_s"] == pytest.approx(warm_end, rel=1e-12)
    assert first == pytest.approx(warm_end, rel=1e-12)  # sent the moment the last one ended
    assert s["requests"]["warmup"] == 16 and s["requests"]["total"] == 64
    if closed:  # a fresh wave: the measured run starts with max_concurrency requests at once
        assert int((rec["arrival_s"][16:] == first).sum()) == 16
    else:  # the trace's gaps are kept, every measured arrival moved by the same wait
        undrained = _drain_scenario(False)
        undrained["workload"]["warmup_drain"] = False
        plain = run_scenario(scenario_from_dict(undrained), keep_requests=True).records
        shift = rec["arrival_s"][16:] - plain["arrival_s"][16:]
        assert shift.min() == pytest.approx(shift.max(), abs=1e-9) and shift.min() > 0


def test_without_the_drain_the_measured_requests_overlap_the_warmup():
    sc = _drain_scenario(True)
    sc["workload"]["warmup_drain"] = False
    rec = run_scenario(scenario_from_dict(sc), keep_requests=True).records
    assert float(rec["arrival_s"][16:].min()) < float((rec["arrival_s"] + rec["e2e_s"])[:16].max())


def test_a_drain_is_deterministic_and_runs_in_one_process(capsys):
    sc = _drain_scenario(False, cluster={"replicas": 2, "router": "round_robin"},
                         sim={"processes": 2})
    a = run_scenario(scenario_from_dict(sc)).summary
    assert "warmup_drain holds the measured requests" in capsys.readouterr().err
    b = run_scenario(scenario_from_dict(sc)).summary
    assert {k: v for k, v in a.items() if k not in ("wall_s", "sim")} == \
        {k: v for k, v in b.items() if k not in ("wall_s", "sim")}


def test_a_drain_without_warmup_requests_is_refused():
    sc = _scenario(0)
    sc["workload"]["warmup_drain"] = True
    with pytest.raises(ValueError, match="workload.warmup_drain = true waits for the warm-up "
                                         "requests; set workload.warmup_requests >= 1"):
        scenario_from_dict(sc)
    sc["workload"]["warmup_drain"] = "yes"
    with pytest.raises(ValueError, match="warmup_drain"):
        scenario_from_dict(sc)
