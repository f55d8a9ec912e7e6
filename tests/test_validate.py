"""`kvpd validate` on a tiny model and very short runs of a scenario: rates from the simulated
capacity, real and simulated runs of the same requests on the same KV pool, each real run
simulated at the speed of the serving probes around it, verdicts per metric, every file
written, failures reported per rate, `--check`."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import realexec.fidelity.validate.validation as validate_mod
import workloads
from kvpd.cli import main as kvpd_main
from realexec.fidelity.validate.plan import (
    SUSTAINED_STEPS,
    RunKnobs,
    capacity,
    queue_growing,
    run_trace,
    scenario_dict,
    simulate,
    sustained_capacity,
)
from realexec.fidelity.validate.report import format_report, format_table, write_report
from realexec.fidelity.validate.validation import ValidateConfig, Validation, bracketed
from realexec.fidelity.validate.verdict import MET, MISSED, NOISE, compare
from simulator.cost.params import CostParams

KNOBS = RunKnobs(max_num_seqs=8, max_num_batched_tokens=128, num_gpu_blocks=48)


def tiny_calibration(path: Path, model: str = "tiny-llama") -> Path:
    """A calibration file as `kvpd calibrate` writes it (fitted numbers made up)."""
    p = CostParams(gemm_compute_efficiency=0.05, gemm_memory_efficiency=0.5,
                   attn_compute_efficiency=0.05, attn_memory_efficiency=0.2,
                   step_overhead_s=2e-3, token_overhead_s=1e-5, loop_overhead_s=2e-4,
                   device="cpu", model=model,
                   extra={"dtype": "fp32", "device_facts": {"torch_threads": 1, "cpu_available": 0.9,
                                                  "mem_bw_share": 0.6},
                          "links": {"kv_transfer": {"name": "cpu-kv-transfer", "bandwidth_gb_s": 1.0,
                                                    "latency_us": 200.0}},
                          "hardware": {"calibration": str(path)}})
    p.save(str(path))
    return path


# A bursty synthetic load that fits tiny-llama's 512-token context (the shipped gamma
# scenario's shape, shorter).
TINY_SCENARIO = {
    "name": "tiny", "seed": 0,
    "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 128},
    "cache": {"num_gpu_blocks": 48, "enable_prefix_caching": False},
    "workload": {"synthetic": {
        "num_requests": 60, "arrival": {"process": "gamma", "rate": 1.0, "cv": 4.0},
        "prompt_len": {"dist": "lognormal", "median": 24, "sigma": 0.8, "min": 4, "max": 64},
        "output_len": {"dist": "lognormal", "median": 12, "sigma": 0.6, "min": 2, "max": 32}}},
}


def write_scenario(path: Path, **changes) -> Path:
    data = copy.deepcopy(TINY_SCENARIO)
    data.update(changes)
    path.write_text(yaml.safe_dump(data))
    return path


def config(tmp_path: Path, **kw) -> ValidateConfig:
    base = dict(calibration=tiny_calibration(tmp_path / "cal.yaml"), out=tmp_path / "out",
                scenarios=(write_scenario(tmp_path / "tiny.yaml"),), fractions=(0.2, 0.6),
                duration_s=1.0, min_requests=4, max_requests=6, repeats=2,
                capacity_requests=24, threads=1, serving_probe_requests=3,
                colocated_engine="inproc")
    base.update(kw)
    return ValidateConfig(**base)


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    torch.set_num_threads(1)
    cfg = config(tmp_path_factory.mktemp("val"))
    v = Validation(cfg)
    summary = v.run()
    write_report(cfg, v, summary)
    return cfg, v, summary


def test_rates_come_from_the_simulated_capacity(done):
    _, v, summary = done
    assert not summary["failures"]
    res = summary["results"]
    assert [r["case"] for r in res] == ["tiny-colocated", "tiny-colocated"]
    cap = res[0]["capacity"]
    search = summary["cases"]["tiny-colocated"]["capacity"]
    assert search["sustained"] == cap and 0 < cap <= search["burst"]
    assert search["search"] and all(grew == (rate > cap) for rate, grew in search["search"])
    assert [r["rate"] for r in res] == pytest.approx([0.2 * cap, 0.6 * cap])
    assert [r["load"] for r in res] == pytest.approx([0.2, 0.6])
    for r in res:
        assert 4 <= r["num_requests"] <= 6 and r["repeats"] == 2
        assert r["label"] in ("under-loaded", "over-loaded")
        for name in ("throughput_tok_s", "ttft_p50", "e2e_p99"):
            assert r["metrics"][name]["verdict"] in (MET, NOISE, MISSED)


def test_each_real_run_is_simulated_at_the_speed_of_the_probes_around_it(done):
    """Serving probes before every run and after the last: a run's 'after' probe is the next
    run's 'before' (the repeats go round the rates), and its simulated device runs at the
    mean of the two; the rate's simulated value is the mean over its runs."""
    cfg, _, summary = done
    res = summary["results"]
    runs = [res[i % 2]["speed"]["probes"][i // 2] for i in range(4)]  # in the order they ran
    for this, nxt in zip(runs, runs[1:]):
        assert this["after"] is nxt["before"]
        assert this["window"][1] <= nxt["window"][0]
    assert runs[-1]["after"]["factors"]["engine"] > 0  # the closing probe
    for r in res:
        assert r["speed"]["refreshed"]
        for probes, f in zip(r["speed"]["probes"], r["speed"]["runs"]):
            want = (probes["before"]["factors"]["engine"] + probes["after"]["factors"]["engine"]) / 2
            assert f == {"engine": pytest.approx(want)}
    folder = cfg.out / "runs" / "tiny-colocated"
    sims = [json.loads((folder / f"rate0-sim{j}" / "summary.json").read_text()) for j in (0, 1)]
    m = res[0]["metrics"]["e2e_p50"]
    assert m["sim"] == pytest.approx(np.mean([s["e2e_s"]["p50"] for s in sims]))
    assert (folder / "rate0-speed0.yaml").is_file()


def test_real_and_simulated_runs_share_requests_and_kv_pool(done):
    cfg, v, summary = done
    folder = cfg.out / "runs" / "tiny-colocated"
    n = summary["results"][0]["num_requests"]
    assert len((folder / "rate0-trace.csv").read_text().strip().splitlines()) == n + 1
    sim_summary = json.loads((folder / "rate0-sim0" / "summary.json").read_text())
    assert sim_summary["cluster"][0]["num_gpu_blocks"] == KNOBS.num_gpu_blocks
    rec = v.records[("tiny-colocated", 0)]
    real, sim = rec["real"], rec["sim"]
    assert list(real["request_id"]) == list(sim["request_id"])
    assert (real["prompt_tokens"] == sim["prompt_tokens"]).all()
    assert (real["output_tokens"] == sim["output_tokens"]).all()
    for rep in range(2):
        real_summary = json.loads((folder / f"rate0-real{rep}" / "summary.json").read_text())
        assert real_summary["requests"]["finished"] == n


def test_errors_are_signed_relative_to_the_real_mean(done):
    _, _, summary = done
    m = summary["results"][0]["metrics"]["tpot_p50"]
    mean = np.mean(m["real"])
    assert m["real_mean"] == pytest.approx(mean)
    assert m["error"] == pytest.approx((m["sim"] - mean) / mean)
    assert m["spread"] == pytest.approx(max(abs(x - mean) for x in m["real"]) / mean)
    p = summary["results"][0]["metrics"]["preemptions"]
    assert p["error"] == pytest.approx(p["sim"] - np.mean(p["real"])) and "verdict" not in p
    got = compare([{"ttft_s": {"p50": 2.0}}, {"ttft_s": {"p50": 4.0}}], {"ttft_s": {"p50": 3.3}})
    assert got["ttft_p50"]["error"] == pytest.approx(0.1) and got["ttft_p50"]["spread"] == pytest.approx(1 / 3)


def test_report_files_and_the_printout_leads_with_the_verdicts(done):
    cfg, _, summary = done
    out = cfg.out
    for name in ("validation.json", "validation.txt", "repro.json", "tiny-colocated-cdf.png",
                 "tiny-colocated-scatter.png", "cal.yaml"):
        assert (out / name).is_file(), name
    repro = json.loads((out / "repro.json").read_text())
    assert repro["model"] == "tiny-llama" and repro["scenarios"] == [str(cfg.scenarios[0])]
    assert repro["cases"]["tiny-colocated"]["knobs"]["num_gpu_blocks"] == 48
    assert "torch" in repro["device_facts"]["versions"]
    saved = json.loads((out / "validation.json").read_text())
    assert sum(saved["verdicts"].values()) == sum(
        1 for r in saved["results"] if r["label"] == "under-loaded" for m in saved["tolerances"])
    text = (out / "validation.txt").read_text()
    lines = text.splitlines()
    assert lines[0].startswith("verdicts over ") and " met, " in lines[0] and " missed" in lines[0]
    assert lines[1].startswith("run-to-run spread of the real repeats")
    assert text.count("tiny-colocated") == 2
    for gone in ("refreshed", "speed-adjusted", "step-speed", "trace probe"):
        assert gone not in text


def test_one_real_run_measures_no_spread(done):
    """A rate with one real run reports no spread (not a spread of 0), so nothing is 'within
    noise', and the printout says so."""
    _, _, summary = done
    assert "no ±" not in format_table(summary)
    one = copy.deepcopy(summary)
    for r in one["results"]:
        r["metrics"] = compare([{"ttft_s": {"p50": 2.0}}], {"ttft_s": {"p50": 2.2}})
        r["label"] = "under-loaded"
    m = one["results"][0]["metrics"]["ttft_p50"]
    assert m["error"] == pytest.approx(0.1) and m["spread"] is None and m["verdict"] == MISSED
    text = format_report(one)
    assert "+10.0%!" in text and "+10.0%!±" not in text
    assert "no ±: one real run" in text and "not measured (one repeat per rate)" in text


def test_bracketed_speed_is_the_mean_of_the_probes_around_a_run():
    assert bracketed({"factors": {"engine": 0.9}}, {"factors": {"engine": 1.1}}) == {
        "engine": pytest.approx(1.0)}
    # one probe failed: the other; both failed (or none ran): the calibrated speed
    assert bracketed({"error": "x"}, {"factors": {"engine": 1.1}}) == {"engine": 1.1}
    assert bracketed({"factors": {"engine": 0.9}}, None) == {"engine": 0.9}
    assert bracketed({"error": "x"}, {"error": "y"}) is None and bracketed(None, None) is None
    pd = bracketed({"factors": {"prefill": 0.8, "decode": 1.0}},
                   {"factors": {"prefill": 1.0, "decode": 1.2}})
    assert pd == {"prefill": pytest.approx(0.9), "decode": pytest.approx(1.1)}


def test_a_failing_real_engine_reports_the_rate_and_keeps_the_others(tmp_path, monkeypatch):
    calls = {"n": 0}
    real_replay = validate_mod.ColocatedBackend.replay

    def flaky(self, trace, seed):
        if trace is not v.serving_probe_trace:
            calls["n"] += 1
        if calls["n"] == 3:  # warm-up, rate 0, then rate 1 fails
            raise RuntimeError("engine crashed (injected)")
        return real_replay(self, trace, seed)

    monkeypatch.setattr(validate_mod.ColocatedBackend, "replay", flaky)
    v = Validation(config(tmp_path, repeats=1, fractions=(0.2, 0.4, 0.6)))
    summary = v.run()
    assert [f["rate"] for f in summary["failures"]] == pytest.approx([0.4 * summary["results"][0]["capacity"]])
    assert "engine crashed (injected)" in summary["failures"][0]["error"]
    assert [r["load"] for r in summary["results"]] == pytest.approx([0.2, 0.6])
    assert "FAILED tiny-colocated at" in format_table(summary)


def test_a_failing_serving_probe_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    real_replay = validate_mod.ColocatedBackend.replay

    def probe_fails(self, trace, seed):
        if trace is v.serving_probe_trace:
            raise RuntimeError("probe broke (injected)")
        return real_replay(self, trace, seed)

    monkeypatch.setattr(validate_mod.ColocatedBackend, "replay", probe_fails)
    v = Validation(config(tmp_path, repeats=1, fractions=(0.3,)))
    (r,) = v.run()["results"]
    probes = r["speed"]["probes"][0]
    assert "probe broke (injected)" in probes["before"]["error"]
    assert r["speed"]["runs"] == [None] and not r["speed"]["refreshed"]  # the calibrated speed
    assert r["metrics"]["ttft_p50"]["error"] is not None
    assert "calib" in format_table({"results": [r], "failures": []})


def test_a_first_probe_far_from_the_calibration_warns_once(tmp_path, capsys):
    v = Validation(config(tmp_path), progress=print)
    v._check_speed({"error": "x"})  # a failed probe says nothing about the speed: next one
    v._check_speed({"factors": {"engine": 0.95}})
    assert v.warnings == []
    w = Validation(config(tmp_path), progress=print)
    w._check_speed({"factors": {"prefill": 0.85, "decode": 1.02}})
    w._check_speed({"factors": {"engine": 0.5}})  # only the probe before the first run
    assert len(w.warnings) == 1 and "prefill 0.85 x the calibrated speed" in w.warnings[0]
    assert "more than 10% off" in capsys.readouterr().out
    assert w.warnings[0] in format_report({"results": [], "failures": [], "warnings": w.warnings})


def _canned(v: Validation, verdict_error: float) -> dict:
    """A one-rate summary whose tpot p50 is off by `verdict_error` (the rest exact)."""
    real = [{"throughput": {"output_tokens_per_s": 100.0}, "tpot_s": {"p50": 1.0}}] * 2
    sim = {"throughput": {"output_tokens_per_s": 100.0}, "tpot_s": {"p50": 1.0 + verdict_error}}
    r = {"case": "tiny-colocated", "scenario": "tiny", "mode": "colocated", "rate": 1.0,
         "capacity": 2.0, "load": 0.5, "label": "under-loaded", "num_requests": 4, "repeats": 2,
         "speed": {"runs": [None, None], "probes": [], "refreshed": False},
         "metrics": compare(real, sim)}
    return {"results": [r], "failures": [], "warnings": [], "cases": {}}


def test_check_exits_1_when_a_verdict_is_missed(tmp_path, monkeypatch, capsys):
    cal = tiny_calibration(tmp_path / "cal.yaml")
    sc = write_scenario(tmp_path / "tiny.yaml")
    argv = ["validate", str(sc), "--calibration", str(cal), "--device", "cpu",
            "--out", str(tmp_path / "out")]
    for error, check, rc in ((0.2, True, 1), (0.2, False, 0), (0.03, True, 0)):
        monkeypatch.setattr(Validation, "run", lambda self, e=error: _canned(self, e))
        assert kvpd_main(argv + (["--check"] if check else [])) == rc, (error, check)
        out = capsys.readouterr().out
        assert ("1 missed" in out) == (error > 0.1)


def test_an_interrupted_validation_reports_the_rates_that_completed(tmp_path, monkeypatch):
    """SIGTERM (an outer `timeout`) during rate 1's real run: `kvpd validate` still compares
    and reports rate 0, names the rates it did not finish, closes the engine, exits 1."""
    import os
    import signal

    seen = {"runs": 0}
    closed = []
    real_replay = validate_mod.ColocatedBackend.replay
    real_close = validate_mod.ColocatedBackend.close

    def interrupted(self, trace, seed):
        res = real_replay(self, trace, seed)
        if len(trace) >= 5:  # a validated run (the warm-up has 4 requests; no probes)
            seen["runs"] += 1
            if seen["runs"] == 2:  # at the end of rate 1's first run, before it returns
                os.kill(os.getpid(), signal.SIGTERM)
        return res

    monkeypatch.setattr(validate_mod.ColocatedBackend, "replay", interrupted)
    monkeypatch.setattr(validate_mod.ColocatedBackend, "close",
                        lambda self: (closed.append(self), real_close(self)))
    handler = signal.getsignal(signal.SIGTERM)
    cal = tiny_calibration(tmp_path / "cal.yaml")
    out = tmp_path / "out"
    rc = kvpd_main(["validate", str(write_scenario(tmp_path / "tiny.yaml")), "--calibration",
                    str(cal), "--fractions", "0.2,0.4,0.6", "--duration-s", "1",
                    "--min-requests", "5", "--max-requests", "6", "--repeats", "2",
                    "--threads", "1", "--serving-probe-requests", "0", "--device", "cpu",
                    "--colocated-engine", "inproc", "--out", str(out)])
    assert rc == 1
    assert signal.getsignal(signal.SIGTERM) is handler  # restored after the run
    assert len(closed) == 1
    saved = json.loads((out / "validation.json").read_text())
    (r,) = saved["results"]
    assert r["load"] == pytest.approx(0.2) and r["repeats"] == 1
    errors = [(f.get("rate") is None, f["error"]) for f in saved["failures"]]
    assert errors[-1] == (True, "interrupted (SIGTERM)")
    assert [e for is_case, e in errors if not is_case] == [
        "interrupted (SIGTERM) before a real run of it completed"] * 2
    assert "FAILED tiny-colocated at -: interrupted (SIGTERM)" in (out / "validation.txt").read_text()


def test_the_colocated_engine_runs_in_a_worker_process_by_default(tmp_path):
    """As `kvpd serve` runs it: the run is compared like an in-process one, its steps are
    logged beside the results, and the worker is gone afterwards."""
    import multiprocessing

    from realexec.serving.step_log import read_step_log

    assert ValidateConfig.__dataclass_fields__["colocated_engine"].default == "process"
    cfg = config(tmp_path, repeats=1, fractions=(0.3,), serving_probe_requests=0,
                 colocated_engine="process")
    v = Validation(cfg)
    summary = v.run()
    assert not summary["failures"]
    (r,) = summary["results"]
    assert r["repeats"] == 1 and r["metrics"]["ttft_p50"]["error"] is not None
    logged = read_step_log(cfg.out / "runs" / "tiny-colocated-steps" / "engine-0.steps.jsonl")[0]
    assert len(logged) >= r["num_requests"]
    assert v.engine is None  # closed
    assert not [c for c in multiprocessing.active_children() if c.name.startswith("kvpd-")]
    with pytest.raises(ValueError, match="colocated_engine must be 'process' or 'inproc', got 'gpu'"):
        Validation(config(tmp_path, colocated_engine="gpu"))


def test_run_trace_takes_the_first_requests_at_the_rate():
    base = workloads.synthesize(TINY_SCENARIO["workload"]["synthetic"], 3)
    t = run_trace(base, 2.0, 50)
    assert len(t) == 50 and t.arrival_s[0] == 0.0
    assert workloads.mean_rate(t) == pytest.approx(2.0, rel=1e-6)
    assert (t.prompt_len == base.prompt_len[:50]).all()


def test_the_capacity_is_the_highest_rate_the_simulated_run_keeps_up_with(tmp_path):
    """A trace whose later requests are longer: the burst capacity, measured on its first
    requests, over-states the rate a longer run keeps up with; the sustained capacity is the
    bisection's boundary between rates whose simulated queue stayed flat and those whose
    grew, and the runs `kvpd validate` would replay at 0.9 of it keep up."""
    cal = tiny_calibration(tmp_path / "cal.yaml")
    params = CostParams.load(str(cal))
    from realexec.fidelity.profile.facts import model_identity

    sc = scenario_dict(model_identity("tiny-llama")[0], "fp32", cal, params, KNOBS, "colocated", tmp_path / "t.csv")
    n = 300
    base = workloads.Trace(np.arange(n, dtype=float), np.linspace(8, 80, n).astype(int),
                           np.linspace(2, 40, n).astype(int))
    burst = capacity(sc, base, 24, tmp_path / "burst.csv")

    def num_requests(rate: float) -> int:
        return int(np.clip(round(rate * 4), 12, n))

    cap, points = sustained_capacity(sc, base, burst, num_requests, tmp_path / "s.csv")
    assert 0 < cap < burst
    assert points[0] == [burst, True] and len(points) == 1 + SUSTAINED_STEPS
    assert all(grew == (rate > cap) for rate, grew in points)
    assert min(r for r, grew in points if grew) - cap <= burst / 2 ** SUSTAINED_STEPS + 1e-12
    below = run_trace(base, 0.9 * cap, num_requests(0.9 * cap))
    workloads.write_trace(below, tmp_path / "below.csv")
    res = simulate(dict(sc, workload={"trace": str(tmp_path / "below.csv"), "format": "generic_csv"}))
    assert not queue_growing(res.records)
    # a trace the burst rate already keeps up with: nothing to search
    flat = workloads.Trace(np.arange(n, dtype=float), np.full(n, 8), np.full(n, 4))
    tiny = capacity(sc, flat, 24, tmp_path / "flat.csv")
    got, points = sustained_capacity(sc, flat, tiny, lambda r: 12, tmp_path / "f.csv")
    assert (got, points) == (tiny, [[tiny, False]])


def test_a_real_queue_that_keeps_growing_marks_the_rate_over_loaded():
    """`queue_growing`: the last third of arrivals waited (median) over twice as long as the
    first third and over half a second; records without queueing (NaN) say nothing."""
    arrival = np.arange(30.0)
    growing = {"arrival_s": arrival, "queueing_s": arrival * 0.1}
    assert queue_growing(growing)
    flat = {"arrival_s": arrival, "queueing_s": np.full(30, 0.8)}
    assert not queue_growing(flat)
    slow_but_short = {"arrival_s": arrival, "queueing_s": arrival * 0.01}  # 0.25 s at most
    assert not queue_growing(slow_but_short)
    unknown = {"arrival_s": arrival, "queueing_s": np.full(30, np.nan)}
    assert not queue_growing(unknown)
    shuffled = np.random.default_rng(0).permutation(30)  # read in arrival order
    assert queue_growing({k: v[shuffled] for k, v in growing.items()})


def test_speed_factors_price_each_engine_by_its_own_steps(done):
    """Colocated: one factor (cost model total / measured total); PD: one per worker, with
    the cluster's host sharing; None when a worker ran no step."""
    from realexec.serving.step_log import LoggedStep
    from simulator.calibrate.step_pricing import speed_factors
    from simulator.core.batch_shape import BatchShape
    from simulator.cost.host_share import HostSharing

    cm = done[1].cost_model
    a, b = BatchShape.from_lists([40], [0]), BatchShape.from_lists([1] * 4, [50] * 4)
    steps = [LoggedStep(0.0, 2 * cm.step_time(a), a), LoggedStep(1.0, cm.step_time(b), b)]
    got = speed_factors({"colocated": steps}, cm)
    assert got == {"engine": pytest.approx((cm.step_time(a) + cm.step_time(b))
                                           / (2 * cm.step_time(a) + cm.step_time(b)))}
    # PD: the decode step starts half-way through the prefill step: both are priced beside
    # each other for as long as both run, alone otherwise
    ta, tb = cm.step_time(a), cm.step_time(b)
    pre = [LoggedStep(0.0, ta, a)]
    dec = [LoggedStep(ta / 2, 2 * tb, b)]
    cluster = {"host_memory_share": 0.5, "host_compute_share": 1.0}
    got = speed_factors({"prefill": pre, "decode": dec}, cm, cluster)
    hs = HostSharing(cm, 0.5, 1.0)
    ma, mb = hs.memory_seconds(a, ta), hs.memory_seconds(b, tb)
    want_a = hs.finish_s(ta, ma, 0.0, [(ta / 2, ta / 2 + 2 * tb, mb / tb)])
    want_b = hs.finish_s(tb, mb, ta / 2, [(0.0, ta, ma / ta)])
    assert ta < want_a < hs.price(ta, ma, mb / tb)
    assert tb < want_b <= hs.price(tb, mb, ma / ta)
    assert got["prefill"] == pytest.approx(want_a / ta)
    assert got["decode"] == pytest.approx(want_b / (2 * tb))
    assert speed_factors({"prefill": pre, "decode": []}, cm) is None


def test_serving_probe_load_is_fixed_and_fits_the_context():
    from realexec.fidelity.validate.speed_probe import serving_probe_trace

    for context in (40, 96, 2048):
        t = serving_probe_trace(16, context, seed=7)
        assert len(t) == 16
        assert (t.prompt_len >= 1).all() and (t.prompt_len <= max(2, context // 4)).all()
        assert (t.prompt_len + t.output_len <= context).all() and (t.output_len >= 1).all()
        again = serving_probe_trace(16, context, seed=7)
        assert (again.prompt_len == t.prompt_len).all() and (again.arrival_s == t.arrival_s).all()

@pytest.mark.slow
def test_pd_validation_end_to_end(tmp_path):
    cfg = config(tmp_path, modes=("pd",), fractions=(0.3,), repeats=1)
    v = Validation(cfg)
    summary = v.run()
    write_report(cfg, v, summary)
    assert not summary["failures"], summary["failures"]
    (r,) = summary["results"]
    assert r["case"] == "tiny-pd" and r["metrics"]["ttft_p50"]["error"] is not None
    folder = cfg.out / "runs" / "tiny-pd"
    sim = json.loads((folder / "rate0-sim0" / "summary.json").read_text())
    assert [c["role"] for c in sim["cluster"]] == ["prefill", "decode"]
    real = json.loads((folder / "rate0-real0" / "summary.json").read_text())
    assert real["queueing_s"]["p50"] is not None and real["queueing_s"]["p50"] >= 0
    # the serving probes ran through both workers: one speed per worker, and each worker's
    # pool is simulated at its own
    assert set(r["speed"]["runs"][0]) == {"prefill", "decode"}
    for role in ("prefill", "decode"):
        assert (folder / f"rate0-{role}-speed0.yaml").is_file()
    assert list((cfg.out / "runs" / "tiny-pd-steps").glob("*.steps.jsonl"))


def test_every_replay_has_token_contents_of_its_own(tmp_path, monkeypatch):
    """With prefix caching on, a repeat (or a probe) must not find the blocks an earlier one
    left cached: each replay of a load gets its own seed (same lengths and hashes)."""
    seeds: dict[str, list[int]] = {"run": [], "probe": []}
    real_replay = validate_mod.ColocatedBackend.replay

    def record(self, trace, seed):
        seeds["probe" if trace is v.serving_probe_trace else "run"].append(seed)
        return real_replay(self, trace, seed)

    monkeypatch.setattr(validate_mod.ColocatedBackend, "replay", record)
    path = write_scenario(tmp_path / "p.yaml", cache={"num_gpu_blocks": 48,
                                                      "enable_prefix_caching": True})
    v = Validation(config(tmp_path, scenarios=(path,), fractions=(0.3,), repeats=2))
    assert not v.run()["failures"]
    warmup, *runs = seeds["run"]
    assert len(runs) == 2 and len(set(seeds["run"])) == 3
    assert len(seeds["probe"]) == 3 and len(set(seeds["probe"])) == 3


@pytest.mark.parametrize(("flag", "value"), [("--fractions", "0.5,nan"), ("--rates", "inf"),
                                             ("--fractions", "0"), ("--rates", "x")])
def test_cli_rates_and_fractions_are_finite_positive_numbers(tmp_path, capsys, flag, value):
    """(before: nan and inf passed argparse and reached the plan)"""
    from kvpd.cli import main

    with pytest.raises(SystemExit) as info:
        main(["validate", "--calibration", str(tmp_path / "c.yaml"), flag, value])
    assert info.value.code == 2 and f"argument {flag}: expected" in capsys.readouterr().err
