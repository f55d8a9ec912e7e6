"""Capacity search: SLO parsing, the answer re-simulated meets the SLO while 10% more
does not, tighter SLOs never give more, hardware candidates with costs, bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvpd.cli import main
from simulator.plan.candidates import candidates, parse_pd_ratios, plan_capacity
from simulator.plan.capacity import replay_variants
from simulator.plan.keys import BaseScenario, build_scenario
from simulator.plan.slo import SLOSet, SLOTarget, parse_slo, slo_set
from simulator.run import run_scenario
from simulator.scenario import load_scenario

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
# 30 s of the Azure conversation trace (59 requests): a simulation takes ~0.05 s, and even
# all at once they take TTFT p90 to 0.86 s, so limits below that bind.
WINDOW = ["workload.window_s=[0, 30]"]


def slos(*texts: str, attainment: float | None = None) -> SLOSet:
    return SLOSet(tuple(parse_slo(t) for t in texts), attainment)


def plan(slo: SLOSet, **kw) -> dict:
    kw.setdefault("repeats", 0)
    return plan_capacity(QUICKSTART, slo, overrides=WINDOW, **kw)


def simulate_at(rate: float, slo: SLOSet) -> dict:
    """The scenario at `rate`, simulated through the ordinary path (not the search's)."""
    sets = WINDOW + ["cluster.replicas=1", f"workload.target_rate={rate!r}"]
    sets += [f"{k}={v}" for k, v in slo.per_request().items()]
    return run_scenario(load_scenario(QUICKSTART, sets)).summary


def holds(summary: dict, slo: SLOSet) -> bool:
    ok = all(summary[f"{t.metric}_s"][t.stat] is not None
             and summary[f"{t.metric}_s"][t.stat] <= t.limit_s for t in slo.targets)
    if slo.attainment is not None:
        ok &= summary["slo"]["attainment"] >= slo.attainment
    return ok


# --- SLOs -------------------------------------------------------------------------------

def test_parse_slo():
    assert parse_slo("ttft_p90=0.5") == SLOTarget("ttft", "p90", 0.5)
    assert parse_slo("tpot_s_p99 = 0.05").column == "tpot_s.p99"
    assert parse_slo("e2e_mean=4").name == "e2e_mean"


@pytest.mark.parametrize("text, match", [
    ("ttf_p90=0.5", r"unknown metric 'ttf_p90'; did you mean ttft_p90"),
    ("goodput_p90=3", "unknown metric 'goodput_p90'.*metrics: ttft, tpot"),
    ("ttft_p95=0.5", "statistics: mean, p50, p90, p99, max"),
    ("ttft_p90=fast", "must be a number of seconds"),
    ("ttft_p90=-1", "must be > 0 seconds"),
    ("ttft_p90", "expects METRIC_STAT=SECONDS"),
])
def test_bad_slo_is_refused_with_a_clear_message(text, match):
    with pytest.raises(ValueError, match=match):
        parse_slo(text)


def test_slo_set_rules():
    s = slos("ttft_p90=0.5", "ttft_p99=0.3", "tpot_p90=0.05", attainment=0.9)
    assert s.per_request() == {"slo.ttft_s": 0.3, "slo.tpot_s": 0.05}
    assert s.check({"ttft_s.p90": 0.4, "ttft_s.p99": 0.2, "tpot_s.p90": 0.04,
                    "slo.attainment": 0.95}) == (True, [])
    ok, why = s.check({"ttft_s.p90": 0.6, "ttft_s.p99": None, "tpot_s.p90": 0.04,
                       "slo.attainment": 0.5})
    assert not ok and why == ["ttft_p90 0.6 s > 0.5 s", "ttft_p99: no finished requests",
                              "attainment 0.500 < 0.9"]
    with pytest.raises(ValueError, match="--attainment needs a ttft_\\* or tpot_\\* SLO"):
        slos("e2e_p90=3", attainment=0.9)
    with pytest.raises(ValueError, match="no SLO"):
        slo_set([], None, None)
    sc = load_scenario(QUICKSTART)  # slo: ttft_s 0.5, tpot_s 0.05
    default = slo_set([], None, sc.slo)
    assert default.attainment == 0.9 and default.per_request() == {"slo.ttft_s": 0.5,
                                                                   "slo.tpot_s": 0.05}


# --- the search --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ttft_ladder():
    """Searches for ever tighter TTFT p90 limits (serial: each is one candidate)."""
    limits = (0.6, 0.3, 0.15)
    return {lim: plan(slos(f"ttft_p90={lim}"))["candidates"][0] for lim in limits}


def test_answer_meets_the_slo_and_ten_percent_more_does_not(ttft_ladder):
    for limit, c in ttft_ladder.items():
        s = slos(f"ttft_p90={limit}")
        rate = c["max_rate_rps"]
        assert c["status"] == "ok" and rate > 0
        assert holds(simulate_at(rate, s), s), (limit, rate)
        assert not holds(simulate_at(float(f"{rate * 1.1:.6g}"), s), s), (limit, rate)
        assert c["fail_rate_rps"] <= rate * 1.1 and c["fail_rate_rps"] > rate


def test_tighter_slo_never_gives_a_higher_rate(ttft_ladder):
    rates = [ttft_ladder[lim]["max_rate_rps"] for lim in sorted(ttft_ladder, reverse=True)]
    assert rates == sorted(rates, reverse=True)
    assert rates[0] > rates[-1]  # the SLO binds: looser limits allow more
    both = plan(slos("ttft_p90=0.3", "tpot_p90=0.01"))["candidates"][0]
    assert both["max_rate_rps"] < ttft_ladder[0.3]["max_rate_rps"]


def test_attainment_floor_is_at_least_as_strict(ttft_ladder):
    c = plan(slos("ttft_p90=0.3", attainment=0.95))["candidates"][0]
    assert c["max_rate_rps"] <= ttft_ladder[0.3]["max_rate_rps"]
    assert c["metrics_at_max"]["slo.attainment"] >= 0.95


def test_unattainable_slo_is_reported_not_raised():
    res = plan(slos("ttft_p90=0.0001"))
    c = res["candidates"][0]
    assert c["status"] == "unattainable" and c["max_rate_rps"] is None
    assert "fail even at" in c["note"] and "ttft_p90" in c["note"]
    assert res["best"] is None


def test_confidence_replays_other_windows_near_the_boundary():
    res = plan(slos("ttft_p90=0.5"), repeats=2)
    conf = res["candidates"][0]["confidence"]
    assert conf["replays"] == 2 and "windows of the trace starting at 30, 60 s" in conf["what"]
    assert 0 <= conf["held_at_max"] <= 2 and "met the SLOs on" in conf["note"]
    evals = res["candidates"][0]["evaluations"]
    assert {e["variant"] for e in evals} == {0, 1, 2}
    # each replay's own highest passing rate, checked against its evaluations
    for v, rate in enumerate(conf["max_rates"], start=1):
        mine = {e["rate"]: e["ok"] for e in evals if e["variant"] == v}
        assert mine[rate] is True
        assert any(r > rate and not ok for r, ok in mine.items())
    assert conf["min_rate_rps"] == min(conf["max_rates"])
    assert (conf["held_at_max"] == 2) == (conf["min_rate_rps"] >= res["candidates"][0]["max_rate_rps"])


def test_replay_variants_by_workload_kind():
    base = {"model": "llama-3-8b", "workload": {"synthetic": {
        "num_requests": 10, "arrival": {"process": "poisson", "rate": 2.0},
        "prompt_len": {"dist": "fixed", "value": 100},
        "output_len": {"dist": "fixed", "value": 10}}}}
    over, what = replay_variants(BaseScenario(base, "x", "."), {}, 3)
    assert over == [{"workload.seed": 1}, {"workload.seed": 2}, {"workload.seed": 3}]
    assert "seeds 1..3" in what
    trace = load_scenario(QUICKSTART)
    data = {"workload": {"trace": trace.workload.trace}}
    over, what = replay_variants(BaseScenario(data, "x", str(QUICKSTART.parent)), {}, 3)
    assert over == [] and "deterministic" in what


# --- candidates, cost and peak -----------------------------------------------------------

def test_hardware_candidates_with_costs_and_peak():
    res = plan(slos("ttft_p90=0.5"), hardware=["h100-sxm", "a100-80gb-sxm", "h200-sxm"],
               peak_rps=50.0, cost_table={"a100-80gb-sxm": 1.5}, workers=2)
    by = {c["name"]: c for c in res["candidates"]}
    assert set(by) == {"h100-sxm", "a100-80gb-sxm", "h200-sxm"}
    for c in by.values():
        assert c["status"] == "ok" and c["gpus_per_replica"] == 1
        assert c["replicas_for_peak"] == math.ceil(50.0 / c["max_rate_rps"])
        assert c["max_rate_per_gpu"] == c["max_rate_rps"]
    h100, a100, h200 = by["h100-sxm"], by["a100-80gb-sxm"], by["h200-sxm"]
    assert h100["usd_per_hour_per_replica"] == 2.99  # catalog price
    assert a100["usd_per_hour_per_replica"] == 1.5  # the cost table wins
    assert h100["usd_per_hour_for_peak"] == pytest.approx(2.99 * h100["replicas_for_peak"])
    out_tps = h100["metrics_at_max"]["throughput.output_tokens_per_s"]
    assert h100["usd_per_m_output_tokens"] == pytest.approx(2.99 / (out_tps * 3600) * 1e6)
    assert h200["usd_per_m_output_tokens"] is None and "cost unknown" in h200["cost_note"]
    assert h100["max_rate_rps"] > a100["max_rate_rps"]  # more FLOP/s and bandwidth
    priced = [c for c in res["candidates"] if c["usd_per_m_output_tokens"] is not None]
    assert res["best"] == min(priced, key=lambda c: c["usd_per_m_output_tokens"])["name"]


def test_colocated_search_runs_one_replica():
    sc = load_scenario(QUICKSTART, ["cluster.replicas=4"])
    [(name, over)] = candidates(sc, None, None)
    assert name == "h100-sxm" and over == {"cluster.replicas": 1}
    # and says so, rather than dropping the scenario's replicas silently
    from simulator.plan.candidates import _unit_note
    assert "cluster.replicas = 4 is searched as one replica" in _unit_note(sc, None)
    assert _unit_note(load_scenario(QUICKSTART), None) is None


def test_pd_candidates_per_ratio():
    sc = load_scenario(QUICKSTART, ["cluster.pd.link=ib-ndr"])
    got = candidates(sc, ["h100-sxm"], parse_pd_ratios("1:1,1:3"))
    assert [n for n, _ in got] == ["h100-sxm 1P:1D", "h100-sxm 1P:3D"]
    assert got[1][1]["cluster.pd.decode.replicas"] == 3
    assert got[1][1]["cluster.pd.prefill.hardware"] == "h100-sxm"
    built = build_scenario({"workload": {}}, got[1][1], "x", ".")
    assert built.cluster.pd.prefill.replicas == 1 and built.cluster.pd.decode.replicas == 3


def test_pd_capacity_search_per_ratio():
    res = plan_capacity(QUICKSTART, slos("ttft_p90=0.5"), repeats=0, sim_timeout_s=3,
                        overrides=WINDOW + ["cluster.pd.link=ib-ndr"], pd_ratios=[(1, 1), (1, 2)])
    assert [c["status"] for c in res["candidates"]] == ["ok", "ok"], \
        [c.get("error") for c in res["candidates"]]
    assert [c["gpus_per_replica"] for c in res["candidates"]] == [2, 3]


# --- bad input ---------------------------------------------------------------------------

def test_bad_candidates_fail_before_any_simulation():
    with pytest.raises(ValueError, match="candidate h1000: hardware: unknown hardware 'h1000'"):
        plan(slos("ttft_p90=0.5"), hardware=["h100-sxm", "h1000"])
    with pytest.raises(ValueError, match="--pd-ratios needs a PD scenario"):
        plan(slos("ttft_p90=0.5"), pd_ratios=[(1, 1)])
    with pytest.raises(ValueError, match="P:D pairs of integers"):
        parse_pd_ratios("1:0")


def test_cli_capacity(tmp_path, capsys):
    out = tmp_path / "cap"
    rc = main(["capacity", str(QUICKSTART), "--set", "workload.window_s=[0, 30]",
               "--slo", "ttft_p90=0.5", "--slo", "tpot_p90=0.05", "--repeats", "0",
               "--peak-rate", "40", "--out", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "ttft_p90 <= 0.5 s, tpot_p90 <= 0.05 s" in text and "units@40" in text
    res = json.loads((out / "capacity.json").read_text())
    assert res["candidates"][0]["max_rate_rps"] > 0 and res["num_simulations"] >= 4
    # progress: one stderr line per simulation, then one per finished candidate
    sims = [line for line in captured.err.splitlines() if ": simulation " in line]
    assert len(sims) == res["num_simulations"] and "[1/1 candidates] h100-sxm" in captured.err
    # the price behind $/M tokens is printed with the table, with where it came from
    price = res["candidates"][0]["usd_per_hour_per_replica"]
    assert "$/GPU-h" in text and f"h100-sxm ${price:g}/GPU-h (catalog on-demand list price)" in text
    assert main(["capacity", str(QUICKSTART), "--set", "workload.window_s=[0, 30]",
                 "--slo", "ttft_p90=0.5", "--repeats", "0", "--quiet",
                 "--out", str(tmp_path / "q")]) == 0
    assert ": simulation " not in capsys.readouterr().err
    rc = main(["capacity", str(QUICKSTART), "--slo", "ttft_p95=0.5", "--out", str(tmp_path / "x")])
    assert rc == 2 and "statistics: mean, p50, p90, p99, max" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--tol", "0"], "--tol must be a finite number > 0"),
    (["--tol", "nan"], "--tol must be a finite number > 0"),
    (["--verify-step", "0.01"], "--verify-step must be a finite number above --tol (0.02)"),
    (["--verify-step", "inf"], "--verify-step must be a finite number above --tol"),
    (["--sim-timeout", "nan"], "--sim-timeout must be a finite number > 0 s"),
    (["--peak-rate", "inf"], "--peak-rate must be a finite number > 0 requests/s"),
    (["--workers", "0"], "--workers must be >= 1"),
    (["--max-sims", "2"], "--max-sims must be >= 4"),
    (["--repeats", "-1"], "--repeats must be >= 0"),
])
def test_cli_bad_search_options_exit_2_before_any_simulation(tmp_path, capsys, flags, message):
    """(before: a bad --tol or --verify-step failed every candidate after its set-up, with
    exit code 1 and a capacity.json of failures; inf --peak-rate was an OverflowError)"""
    out = tmp_path / "never"
    assert main(["capacity", str(QUICKSTART), "--slo", "ttft_p90=0.5", *flags,
                 "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(("table", "message"), [
    ("h100-sxm: .nan\n", "h100-sxm: expected a price >= 0 in USD per hour, got nan"),
    ("h100-sxmm: 2.0\n", "--cost-table: 'h100-sxmm' is neither a catalog accelerator nor one a "
                         "candidate runs on (h100-sxm); did you mean h100-sxm"),
    ("[1, 2]\n", "must be a YAML mapping, got list"),
    (": : :\n", "not valid YAML"),
])
def test_a_bad_cost_table_is_refused_before_any_simulation(tmp_path, capsys, table, message):
    """(before: a nan price and a misspelt part were taken, leaving the price unknown or nan,
    and YAML that did not parse was a traceback)"""
    f = tmp_path / "prices.yaml"
    f.write_text(table)
    out = tmp_path / "never"
    assert main(["capacity", str(QUICKSTART), "--slo", "ttft_p90=0.5", "--cost-table", str(f),
                 "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
