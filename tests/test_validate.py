"""`kvpd validate` bookkeeping on a tiny model and very short traces: rates from the simulated
capacity, real and simulated runs of the same requests on the same KV pool, errors computed
from what was measured, every file written, failures reported per rate."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import realexec.fidelity.validate.validation as validate_mod
import workloads
from kvpd.cli import main as kvpd_main
from realexec.engine.configs import TINY
from realexec.fidelity.validate.plan import (
    SUSTAINED_STEPS,
    RunKnobs,
    base_trace,
    capacity,
    queue_growing,
    run_trace,
    scenario_dict,
    simulate,
    sustained_capacity,
)
from realexec.fidelity.validate.report import format_table, write_report
from realexec.fidelity.validate.validation import ValidateConfig, Validation, compare
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
                          "hardware": {"calibration": str(path)},
                          "fresh_shapes": {"points": [{"kind": "decode", "batch": 1, "tokens": 40,
                                                       "repeated_s": 0.01, "fresh_s": 0.0102,
                                                       "ratio": 1.02}], "ratio": 1.02, "warn": False},
                          "serving_loop": {"loop_overhead_s": 2e-4, "num_steps": {"loop": 30},
                                           "errors": {"kv_handoff_s": "0 prefill step(s)"}}})
    p.save(str(path))
    return path


def config(tmp_path: Path, **kw) -> ValidateConfig:
    base = dict(calibration=tiny_calibration(tmp_path / "cal.yaml"), out=tmp_path / "out",
                model="tiny-llama", traces=("gamma",), modes=("colocated",), fractions=(0.2, 0.6),
                duration_s=1.0, min_requests=4, max_requests=6, repeats=2, context=96,
                knobs=KNOBS, capacity_requests=24, threads=1, serving_probe_requests=3,
                trace_probe_s=1.0, colocated_engine="inproc")
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
    cfg, v, summary = done
    assert not summary["failures"]
    res = summary["results"]
    assert [r["trace"] for r in res] == ["gamma", "gamma"]
    cap = res[0]["capacity"]
    assert 0 < cap <= res[0]["burst_capacity"]
    search = v.traces["gamma"]["capacity"]["colocated"]
    assert search["sustained"] == cap and search["burst"] == res[0]["burst_capacity"]
    assert search["search"] and all(grew == (rate > cap) for rate, grew in search["search"])
    assert [r["rate"] for r in res] == pytest.approx([0.2 * cap, 0.6 * cap])
    assert [r["load"] for r in res] == pytest.approx([0.2, 0.6])
    for r in res:
        assert 4 <= r["num_requests"] <= 6 and r["repeats"] == 2
        assert r["label"] in ("under-loaded", "over-loaded")
        # the cost model was also checked against the real run's own steps
        assert r["step_error"]["num_steps"] >= r["num_requests"]
        by_kind = r["step_error"]["by_kind"]
        assert sum(e["num_steps"] for e in by_kind.values()) == r["step_error"]["num_steps"]
        assert len(r["cpu_available"]) == 2
        # the diagnostic re-run scales the device by the machine's speed at this rate: the
        # speed probe (calibrated / measured probe steps) x the CPU share the real runs got
        probe = r["probe"]  # one probe before each repeat; the speed is their mean
        assert len(probe["runs"]) == 2
        for run in probe["runs"]:
            assert {p["kind"] for p in run["points"]} == {"prefill", "decode"}
            assert run["speed"] == pytest.approx(sum(p["predicted_s"] for p in run["points"])
                                                 / sum(p["measured_s"] for p in run["points"]))
        assert probe["speed"] == pytest.approx(np.mean([run["speed"] for run in probe["runs"]]))
        got = [a for a in r["cpu_available"] if a is not None]
        cpu = np.mean(got) / 0.9 if got else 1.0
        assert r["adjusted"]["speed_factor"] == pytest.approx(cpu * probe["speed"])
        # the second diagnostic runs the device at the speed the engine's own steps ran
        step = r["step_adjusted"]
        assert step["factors"] == {"engine": pytest.approx(1 + r["step_error"]["total"])}
        assert set(step["metrics"]) == set(r["metrics"])
        # a serving probe through the real engine before each run measured its speed, and the
        # refreshed re-run scales the device by their mean
        serving = [run["serving"] for run in probe["runs"]]
        assert all(sv["num_steps"] >= 3 and sv["factors"]["engine"] > 0 for sv in serving)
        refreshed = r["refreshed"]
        assert refreshed["num_probes"] == 2
        assert refreshed["factors"] == {"engine": pytest.approx(
            np.mean([sv["factors"]["engine"] for sv in serving]))}
        assert set(refreshed["metrics"]) == set(r["metrics"])
        assert refreshed["metrics"]["ttft_p50"]["real"] == r["metrics"]["ttft_p50"]["real"]
        # the bracketed re-run: per run, the mean of the serving probes just before and
        # just after it (the next run's, or the closing probe after the last run)
        assert all(sv["window"][0] < sv["window"][1] for sv in serving)
        # (3 probe requests: too few prompt steps to fit compute and memory apart), and the
        # simulator runs once per real run at its own bracket
        assert not any("speeds" in sv for sv in serving)
        after = [run["serving_after"]["factors"]["engine"] for run in probe["runs"]]
        brk = r["refreshed_bracketed"]
        assert brk["runs"] == [{"engine": pytest.approx((sv["factors"]["engine"] + a) / 2)}
                               for sv, a in zip(serving, after)]
        assert brk["factors"]["engine"] == pytest.approx(
            np.mean([f["engine"] for f in brk["runs"]]))
        assert brk["metrics"]["ttft_p50"]["real"] == r["metrics"]["ttft_p50"]["real"]
        # so did a trace probe (the same trace at the same rate, after the validated requests)
        by_trace = [run["trace"] for run in probe["runs"]]
        assert all(tp["num_steps"] >= 4 and tp["factors"]["engine"] > 0 for tp in by_trace)
        assert r["refreshed_trace"]["factors"] == {"engine": pytest.approx(
            np.mean([tp["factors"]["engine"] for tp in by_trace]))}
        assert r["refreshed_trace"]["metrics"]["e2e_p50"]["real"] == r["metrics"]["e2e_p50"]["real"]
        # each run's own step speed is kept, to show how well the probe before it foretold it
        assert len(r["run_speeds"]) == 2 and all(sp["engine"] > 0 for sp in r["run_speeds"])
        # and when each ran (wall clock), to find its steps in the step logs later
        (a0, a1), (b0, b1) = r["real_windows"]
        assert a0 < a1 <= b0 < b1
        assert r["real_wall_s"] == pytest.approx((a1 - a0) + (b1 - b0), rel=0.05, abs=0.05)
    # runs go round the rates: each run's after-probe is the next run's before-probe, and
    # the last run's is the closing probe taken after it
    runs = [res[i % 2]["probe"]["runs"][i // 2] for i in range(4)]
    for this, nxt in zip(runs, runs[1:]):
        assert this["serving_after"] is nxt["serving"]
    closing = v.traces["gamma"]["closing_probes"]["colocated"]
    assert runs[-1]["serving_after"] is closing and closing["factors"]["engine"] > 0
    # the trace probes take requests after every validated one (recorded for reproduction)
    probes = summary["traces"]["gamma"]["trace_probes"]
    assert set(probes) == {"colocated/rate0", "colocated/rate1"}
    most = max(r["num_requests"] for r in res)
    assert all(p["first_request"] == most and not p["overlaps_runs"] for p in probes.values())
    # and those steps are kept beside the results (warm-up run included)
    from realexec.serving.step_log import read_step_log

    logged = read_step_log(cfg.out / "runs" / "colocated-steps" / "engine.steps.jsonl")[0]
    assert len(logged) >= sum(r["step_error"]["num_steps"] for r in res)


def test_real_and_simulated_runs_share_requests_and_kv_pool(done):
    cfg, v, summary = done
    folder = cfg.out / "runs" / "gamma-colocated"
    trace_rows = (folder / "rate0-trace.csv").read_text().strip().splitlines()
    n = summary["results"][0]["num_requests"]
    assert len(trace_rows) == n + 1
    sim_summary = json.loads((folder / "rate0-sim" / "summary.json").read_text())
    assert sim_summary["cluster"][0]["num_gpu_blocks"] == KNOBS.num_gpu_blocks
    rec = v.records[("gamma", "colocated", 0)]
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
    assert m["spread"] == pytest.approx((max(m["real"]) - min(m["real"])) / 2 / mean)
    assert summary["results"][0]["metrics"]["preemptions"]["error"] == pytest.approx(
        summary["results"][0]["metrics"]["preemptions"]["sim"]
        - np.mean(summary["results"][0]["metrics"]["preemptions"]["real"]))
    got = compare([{"ttft_s": {"p50": 2.0}}, {"ttft_s": {"p50": 4.0}}], {"ttft_s": {"p50": 3.3}})
    assert got["ttft_p50"]["error"] == pytest.approx(0.1) and got["ttft_p50"]["spread"] == pytest.approx(1 / 3)


def test_queueing_is_compared_in_seconds_and_split_out_of_ttft():
    """Queueing percentiles are reported beside the targets, not among them, as sim - real
    in seconds (a relative error of a near-zero wait says nothing), and the queueing table
    splits the p50 TTFT into the wait and the rest."""
    from realexec.fidelity.validate.report import format_queueing
    from realexec.fidelity.validate.validation import check_targets

    real = [{"ttft_s": {"p50": 0.30}, "queueing_s": {"p50": 0.010, "p90": 0.10, "p99": 0.2}},
            {"ttft_s": {"p50": 0.34}, "queueing_s": {"p50": 0.030, "p90": 0.14, "p99": 0.4}}]
    sim = {"ttft_s": {"p50": 0.29}, "queueing_s": {"p50": 0.0, "p90": 0.08, "p99": 0.5}}
    m = compare(real, sim)
    assert m["queueing_p50"]["error"] == pytest.approx(-0.020)
    assert m["queueing_p90"]["error"] == pytest.approx(-0.040)
    assert m["queueing_p99"]["error"] == pytest.approx(0.2)
    assert not any(k.startswith("queueing") for k in check_targets(m))
    summary = {"results": [{"trace": "gamma", "mode": "pd", "rate": 2.5, "metrics": m},
                           {"trace": "gamma", "mode": "pd", "rate": 5.0,
                            "metrics": compare([{"ttft_s": {"p50": 0.3}}], sim)}]}
    table = format_queueing(summary)
    rows = [line for line in table.splitlines() if line.startswith("gamma")]
    assert len(rows) == 1  # the rate without real queueing has no row
    assert rows[0].split()[3:] == ["20/120/300", "0/80/500", "300/290"]
    assert format_queueing({"results": summary["results"][1:]}) == ""


def test_one_real_run_measures_no_spread(done):
    """A rate with one real run reports no run-to-run spread (not a spread of 0), and says so."""
    _, _, summary = done
    assert "no ±" not in format_table(summary)  # two runs per rate: spreads measured
    one = copy.deepcopy(summary)
    for r in one["results"]:
        r["metrics"] = compare([{"ttft_s": {"p50": 2.0}}], {"ttft_s": {"p50": 2.2}})
    m = one["results"][0]["metrics"]["ttft_p50"]
    assert m["error"] == pytest.approx(0.1) and m["spread"] is None
    table = format_table(one)
    assert "+10.0%*" in table and "+10.0%*±" not in table
    assert "no ±: one real run" in table


def test_report_files(done):
    cfg, _, summary = done
    out = cfg.out
    for name in ("validation.json", "validation.txt", "repro.json", "gamma-colocated-cdf.png",
                 "gamma-colocated-scatter.png", "cal.yaml"):
        assert (out / name).is_file(), name
    repro = json.loads((out / "repro.json").read_text())
    assert repro["seed"] == 0 and repro["model"] == "tiny-llama"
    assert repro["model_config"]["hidden_size"] == TINY["tiny-llama"]["hidden_size"]
    assert repro["knobs"]["num_gpu_blocks"] == KNOBS.num_gpu_blocks
    assert repro["traces"]["gamma"]["spec"]["arrival"]["cv"] == 4.0
    assert "torch" in repro["device_facts"]["versions"]
    table = (out / "validation.txt").read_text()
    # main, 5 re-runs, queueing, by kind
    assert table.count("gamma  colocated") == 16 and "cpu:" in table
    assert "queueing (ms)" in table
    assert "speed-adjusted" in table and "probe:" in table
    assert "never-run shapes / repeated shapes 1.02 (decode 1x40 1.02) (the calibration's profile)" in table
    assert "step-speed diagnostic" in table and "own steps by kind" in table
    assert "serving loop (host time between steps): 0.200 ms per step (30 steps)" in table
    saved = json.loads((out / "validation.json").read_text())
    assert set(saved["targets_step_adjusted"]) == set(saved["targets"])
    assert "refreshed by serving probes" in table and "refreshed by trace probes" in table
    assert set(saved["targets_refreshed_trace"]) == set(saved["targets"])
    assert set(saved["targets_refreshed"]) == set(saved["targets"])
    assert "refreshed by serving probes around each run" in table
    assert set(saved["targets_refreshed_bracketed"]) == set(saved["targets"])


def test_scaled_hardware_scales_every_step_time(done, tmp_path):
    """The diagnostics' device at factor f takes 1/f of the calibrated time on any step."""
    import copy
    import dataclasses

    from simulator.cluster.cluster import resolve_hardware
    from simulator.core.batch_shape import BatchShape
    from simulator.cost.costmodel import CostModel
    from simulator.cost.models import ModelSpec
    from simulator.scenario import scenario_from_dict

    v = copy.copy(done[1])  # every overhead non-zero, so that each is checked
    v.params = dataclasses.replace(v.params, step_overhead_s=2e-3, layer_overhead_s=3e-5,
                                   token_overhead_s=1e-6, decode_attn_overhead_s=2e-4)
    sc = scenario_from_dict({"model": v.model_config, "hardware": "a100-80gb-sxm",
                             "workload": {"synthetic": {"num_requests": 1}}})
    model = ModelSpec.from_hf_config(v.model_config, name="tiny-llama")
    base = v._cost_model()
    from realexec.fidelity.validate.plan import scaled_hardware

    spec = scaled_hardware(v.params, 0.8, tmp_path / "slow.yaml")
    acc, params = resolve_hardware(spec, sc)
    slow = CostModel(model, acc, "fp32", params=params)
    for shape in (BatchShape.from_lists([37], [0]), BatchShape.from_lists([1] * 5, [60] * 5),
                  BatchShape.from_lists([16, 1, 1], [32, 40, 50])):
        assert slow.step_time(shape) == pytest.approx(base.step_time(shape) / 0.8, rel=1e-9)
    # compute and memory at their own factors: the device `step_speeds` prices with
    from simulator.calibrate.step_speeds import cost_model_at

    spec = scaled_hardware(v.params, {"compute": 0.7, "memory": 1.3}, tmp_path / "two.yaml")
    acc, params = resolve_hardware(spec, sc)
    two, want = CostModel(model, acc, "fp32", params=params), cost_model_at(base, 0.7, 1.3)
    for shape in (BatchShape.from_lists([37], [0]), BatchShape.from_lists([1] * 5, [60] * 5)):
        assert two.step_time(shape) == pytest.approx(want.step_time(shape), rel=1e-9)


def test_bracketed_factors_average_the_probes_around_a_run():
    from realexec.fidelity.validate.validation import (
        bracket_probes,
        bracketed_factors,
        mean_factors,
    )

    def serving(f, speeds=None):
        return {"factors": {"engine": f}, **({"speeds": {"engine": speeds}} if speeds else {})}

    seq = [{"serving": serving(0.9)}, {"serving": serving(1.1)}, {"serving": {"error": "x"}}]
    bracket_probes(seq, serving(1.0))
    assert bracketed_factors(seq[0]) == {"engine": pytest.approx(1.0)}
    assert bracketed_factors(seq[1]) is None  # the probe after it failed
    assert bracketed_factors(seq[2]) is None  # and so did its own
    # two speeds where both probes fitted them, else one factor
    a = {"serving": serving(0.9, {"compute": 0.8, "memory": 1.0}),
         "serving_after": serving(1.1, {"compute": 1.0, "memory": 1.2})}
    assert bracketed_factors(a, two_speeds=True) == {"engine": {"compute": pytest.approx(0.9),
                                                                "memory": pytest.approx(1.1)}}
    assert bracketed_factors(a) == {"engine": pytest.approx(1.0)}  # one factor by default
    a["serving_after"] = serving(1.1)
    assert bracketed_factors(a, two_speeds=True) == {"engine": pytest.approx(1.0)}
    pd = {"serving": {"factors": {"prefill": 0.8, "decode": 1.0}},
          "serving_after": {"factors": {"prefill": 1.0, "decode": 1.2}}}
    assert bracketed_factors(pd) == {"prefill": pytest.approx(0.9), "decode": pytest.approx(1.1)}
    assert mean_factors([{"engine": {"compute": 1.0, "memory": 2.0}},
                         {"engine": {"compute": 2.0, "memory": 3.0}}]) == {
        "engine": {"compute": 1.5, "memory": 2.5}}


def test_compare_takes_the_mean_of_one_simulated_run_per_real_run():
    reals = [{"ttft_s": {"p50": 1.0}}, {"ttft_s": {"p50": 3.0}}]
    sims = [{"ttft_s": {"p50": 2.0}}, {"ttft_s": {"p50": 2.4}}]
    m = compare(reals, sims)["ttft_p50"]
    assert m["sim"] == pytest.approx(2.2) and m["error"] == pytest.approx(0.1)
    assert compare(reals, [sims[0], {}])["ttft_p50"]["error"] is None


def test_a_failing_real_engine_reports_the_rate_and_keeps_the_others(tmp_path, monkeypatch):
    calls = {"n": 0}
    real_replay = validate_mod.ColocatedBackend.replay

    def flaky(self, trace, seed):
        if trace is not v.serving_probe_trace and not trace.name.endswith("-probe"):
            calls["n"] += 1
        if calls["n"] == 3:  # warm-up, rate 0, then rate 1 fails (and rate 2's probes)
            raise RuntimeError("engine crashed (injected)")
        return real_replay(self, trace, seed)

    monkeypatch.setattr(validate_mod.ColocatedBackend, "replay", flaky)
    cfg = config(tmp_path, repeats=1, fractions=(0.2, 0.4, 0.6))
    v = Validation(cfg)
    summary = v.run()
    assert [f["rate"] for f in summary["failures"]] == pytest.approx([0.4 * summary["results"][0]["capacity"]])
    assert "engine crashed (injected)" in summary["failures"][0]["error"]
    assert [r["load"] for r in summary["results"]] == pytest.approx([0.2, 0.6])
    assert "FAILED gamma colocated at" in format_table(summary)


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
    rc = kvpd_main(["validate", "--calibration", str(cal), "--model", "tiny-llama",
                    "--traces", "gamma", "--fractions", "0.2,0.4,0.6", "--duration-s", "1",
                    "--min-requests", "5", "--max-requests", "6", "--repeats", "2",
                    "--context", "96", "--max-num-seqs", "8", "--max-num-batched-tokens", "128",
                    "--num-gpu-blocks", "48", "--threads", "1", "--serving-probe-requests", "0",
                    "--trace-probe-s", "0", "--device", "cpu", "--colocated-engine", "inproc",
                    "--out", str(out)])
    assert rc == 1
    assert signal.getsignal(signal.SIGTERM) is handler  # restored after the run
    assert len(closed) == 1
    saved = json.loads((out / "validation.json").read_text())
    (r,) = saved["results"]
    assert r["load"] == pytest.approx(0.2) and r["repeats"] == 1
    errors = [(f.get("rate") is None, f["error"]) for f in saved["failures"]]
    assert errors[-1] == (True, "interrupted (SIGTERM)")
    assert [e for is_mode, e in errors if not is_mode] == [
        "interrupted (SIGTERM) before a real run of it completed"] * 2
    table = (out / "validation.txt").read_text()
    assert "FAILED * colocated at -: interrupted (SIGTERM)" in table


def test_the_colocated_engine_runs_in_a_worker_process_by_default(tmp_path):
    """As `kvpd serve` runs it: its steps come from the worker's step log, and the run is
    compared like an in-process one."""
    import multiprocessing

    from realexec.serving.step_log import read_step_log

    assert ValidateConfig.__dataclass_fields__["colocated_engine"].default == "process"
    cfg = config(tmp_path, repeats=1, fractions=(0.3,), serving_probe_requests=0, trace_probe_s=0,
                 colocated_engine="process")
    v = Validation(cfg)
    summary = v.run()
    assert not summary["failures"]
    (r,) = summary["results"]
    assert r["repeats"] == 1 and r["metrics"]["ttft_p50"]["error"] is not None
    assert r["step_error"]["num_steps"] > 0
    logged = read_step_log(cfg.out / "runs" / "colocated-steps" / "engine-0.steps.jsonl")[0]
    assert len(logged) >= r["step_error"]["num_steps"]
    assert v.engine is None  # closed
    assert not [c for c in multiprocessing.active_children() if c.name.startswith("kvpd-")]
    with pytest.raises(ValueError, match="colocated_engine must be 'process' or 'inproc', got 'gpu'"):
        Validation(config(tmp_path, colocated_engine="gpu"))


def test_the_serving_speed_is_applied_only_when_asked(tmp_path):
    """A calibration's serving speed is reported either way; the simulated engines run at it
    only with `serving_speed=True` (`kvpd validate --serving-speed`)."""
    cal = tiny_calibration(tmp_path / "cal.yaml")
    params = CostParams.load(str(cal))
    params.extra["serving_speed"] = {"colocated": 0.8, "num_steps": {"colocated": 40}}
    params.save(str(cal))
    runs = {}
    for applied in (False, True):
        (tmp_path / str(applied)).mkdir()
        cfg = config(tmp_path / str(applied), calibration=cal, repeats=1, fractions=(0.3,),
                     serving_probe_requests=0, trace_probe_s=0, serving_speed=applied)
        v = Validation(cfg)
        summary = v.run()
        write_report(cfg, v, summary)
        (r,) = summary["results"]
        sc = json.loads((cfg.out / "runs" / "gamma-colocated" / "rate0-sim" / "scenario.json")
                        .read_text())
        assert ("serving_speed" in sc["hardware"]) is applied
        saved = json.loads((cfg.out / "validation.json").read_text())
        assert saved["serving_speed_measured"]["colocated"] == 0.8
        assert (saved["serving_speed"] is not None) is applied
        text = (cfg.out / "validation.txt").read_text()
        assert ("Not applied" in text) is not applied
        runs[applied] = r["capacity"]
    assert runs[True] == pytest.approx(runs[False] * 0.8, rel=0.15)  # a slower device


def test_bad_input_is_refused(tmp_path, capsys):
    cal = tiny_calibration(tmp_path / "other.yaml", model="llama-50m")
    with pytest.raises(ValueError, match="profile is for model 'llama-50m', not 'tiny-llama'"):
        Validation(config(tmp_path, calibration=cal))
    gpu = tiny_calibration(tmp_path / "gpu.yaml")
    p = CostParams.load(str(gpu))
    p.device = "h100-sxm"
    p.save(str(gpu))
    with pytest.raises(ValueError, match="calibration is for device 'h100-sxm', but the real runs "
                                         "would be on 'cpu'"):
        Validation(config(tmp_path, calibration=gpu))
    assert kvpd_main(["validate", "--calibration", str(tmp_path / "none.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert kvpd_main(["validate", "--calibration", str(cal), "--min-requests", "9",
                      "--max-requests", "3"]) == 2
    assert "--min-requests must not exceed" in capsys.readouterr().err
    assert kvpd_main(["validate", "--calibration", str(cal), "--serving-probe-requests", "-1"]) == 2
    assert "--serving-probe-requests must be >= 0, got -1" in capsys.readouterr().err
    assert kvpd_main(["validate", "--calibration", str(cal), "--trace-probe-s", "-5"]) == 2
    assert "--trace-probe-s must be >= 0 (0: no trace probe), got -5.0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kvpd_main(["validate", "--calibration", str(cal), "--modes", "colocated,xyz"])
    with pytest.raises(ValueError, match="trace kind 'zipf'"):
        base_trace("zipf", 128)


def test_run_trace_takes_the_first_requests_at_the_rate():
    base, info = base_trace("gamma", 256, num_requests=200, seed=3)
    t = run_trace(base, 2.0, 50)
    assert len(t) == 50 and t.arrival_s[0] == 0.0
    assert workloads.mean_rate(t) == pytest.approx(2.0, rel=1e-6)
    assert (t.prompt_len == base.prompt_len[:50]).all()
    assert info["spec"]["arrival"]["cv"] == 4.0


def test_azure_slice_lengths_fit_the_context(traces_dir):
    base, info = base_trace("azure", 1024, path=traces_dir / "azure2023_AzureLLMInferenceTrace_conv.csv")
    assert info["window_s"] == [0.0, 180.0] and 0 < info["length_scale"] < 1
    assert (base.prompt_len + base.output_len <= 1024).all() and (base.output_len >= 1).all()
    assert base.arrival_s.max() <= 180.0


class _StubProbe:
    device_type = "cpu"

    def measure(self):
        return {"speed": 0.9, "points": []}


def test_pd_probe_also_measures_the_memory_share_two_processes_get(tmp_path, monkeypatch):
    """Before a PD run on a CPU the probe adds the memory-bandwidth share of 2 processes (the
    workers' mutual slowdown follows it), beside the profile's; not before a colocated run,
    and a failing measurement is recorded, not raised."""
    import realexec.fidelity.profile.facts as facts

    v = Validation(config(tmp_path))
    v.probe = _StubProbe()
    monkeypatch.setattr(facts, "memory_bandwidth_share", lambda: {"mem_bw_share": 0.72})
    pd = v._probe("pd")
    assert pd["speed"] == 0.9 and pd["mem_bw_share"] == 0.72
    assert "mem_bw_share" not in v._probe("colocated")
    assert v._probe_text(pd) == ("speed probe 0.90 x the calibrated speed; memory share of 2 "
                                 "processes 0.72 (profile 0.60)")

    def broken():
        raise OSError("no spawn here")

    monkeypatch.setattr(facts, "memory_bandwidth_share", broken)
    got = v._probe("pd")
    assert got["speed"] == 0.9 and "no spawn here" in got["mem_bw_share_error"]
    assert "memory share" not in v._probe_text(got)


def test_a_failing_serving_probe_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    real_replay = validate_mod.ColocatedBackend.replay

    def probe_fails(self, trace, seed):
        if trace is v.serving_probe_trace:
            raise RuntimeError("probe broke (injected)")
        if trace.name.endswith("-probe"):
            raise RuntimeError("trace probe broke (injected)")
        return real_replay(self, trace, seed)

    monkeypatch.setattr(validate_mod.ColocatedBackend, "replay", probe_fails)
    v = Validation(config(tmp_path, repeats=1, fractions=(0.3,)))
    summary = v.run()
    assert not summary["failures"]
    (r,) = summary["results"]
    assert "probe broke (injected)" in r["probe"]["runs"][0]["serving"]["error"]
    assert r["refreshed"] is None and r["metrics"]["ttft_p50"]["error"] is not None
    assert "serving probe failed (RuntimeError: probe broke" in v._probe_text(r["probe"]["runs"][0])
    assert "trace probe broke (injected)" in r["probe"]["runs"][0]["trace"]["error"]
    assert r["refreshed_trace"] is None
    assert "trace probe failed (RuntimeError: trace probe broke" in v._probe_text(r["probe"]["runs"][0])
    # and none is run when disabled
    (tmp_path / "off").mkdir()
    off = Validation(config(tmp_path / "off", repeats=1, fractions=(0.3,), serving_probe_requests=0,
                            trace_probe_s=0))
    (r,) = off.run()["results"]
    assert "serving" not in r["probe"]["runs"][0] and r["refreshed"] is None
    assert "trace" not in r["probe"]["runs"][0] and r["refreshed_trace"] is None


def test_trace_probe_takes_the_trace_after_the_validated_requests_at_the_rate():
    from realexec.fidelity.validate.plan import TRACE_PROBE_MIN_REQUESTS, trace_probe

    base, _ = base_trace("gamma", 256, num_requests=400, seed=3)
    scaled = workloads.rescale_rate(base, 2.0)
    t, info = trace_probe(base, 2.0, 100, 30.0)
    assert info == {"first_request": 100, "num_requests": len(t), "duration_s": 30.0,
                    "overlaps_runs": False}
    # the requests arriving within 30 s of request 100 once the trace runs at 2 req/s
    want = (scaled.arrival_s >= scaled.arrival_s[100]) & (scaled.arrival_s < scaled.arrival_s[100] + 30)
    want[100:100 + TRACE_PROBE_MIN_REQUESTS] = True
    assert len(t) == want.sum() and t.arrival_s[0] == 0.0 and t.name.endswith("-probe")
    assert (t.prompt_len == base.prompt_len[want]).all()
    assert (t.output_len == base.output_len[want]).all()
    assert t.arrival_s == pytest.approx(scaled.arrival_s[want] - scaled.arrival_s[100])
    # a short window still holds the minimum, and a trace with too few requests left takes
    # its last ones and says they overlap the runs'
    short, _ = trace_probe(base, 2.0, 100, 1e-6)
    assert len(short) == TRACE_PROBE_MIN_REQUESTS
    end, info = trace_probe(base, 2.0, 399, 1e-6)
    assert info["first_request"] == 400 - TRACE_PROBE_MIN_REQUESTS and info["overlaps_runs"]
    with pytest.raises(ValueError, match="duration_s must be > 0, got 0"):
        trace_probe(base, 2.0, 100, 0)
    with pytest.raises(ValueError, match=r"the trace has 1 request\(s\), needs >= 2"):
        trace_probe(workloads.first_n(base, 1), 2.0, 0, 10.0)
    # a trace shorter than the minimum is taken whole
    whole, info = trace_probe(workloads.first_n(base, 5), 2.0, 3, 1e-6)
    assert len(whole) == 5 and info["first_request"] == 0 and info["overlaps_runs"]


def test_serving_probe_load_is_fixed_and_fits_the_context():
    from realexec.fidelity.validate.speed_probe import serving_probe_trace

    for context in (40, 96, 2048):
        t = serving_probe_trace(16, context, seed=7)
        assert len(t) == 16
        assert (t.prompt_len >= 1).all() and (t.prompt_len <= max(2, context // 4)).all()
        assert (t.prompt_len + t.output_len <= context).all() and (t.output_len >= 1).all()
        again = serving_probe_trace(16, context, seed=7)
        assert (again.prompt_len == t.prompt_len).all() and (again.arrival_s == t.arrival_s).all()


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


@pytest.mark.slow
def test_pd_validation_end_to_end(tmp_path):
    cfg = config(tmp_path, modes=("pd",), fractions=(0.3,), repeats=1)
    v = Validation(cfg)
    summary = v.run()
    write_report(cfg, v, summary)
    assert not summary["failures"], summary["failures"]
    (r,) = summary["results"]
    assert r["mode"] == "pd" and r["metrics"]["ttft_p50"]["error"] is not None
    assert 0 < r["probe"]["mem_bw_share"] <= 2  # measured before the run (CPU)
    folder = cfg.out / "runs" / "gamma-pd"
    sim = json.loads((folder / "rate0-sim" / "summary.json").read_text())
    assert [c["role"] for c in sim["cluster"]] == ["prefill", "decode"]
    # the real PD run knows each request's wait in the prefill worker's queue, so a growing
    # real queue can mark a rate over-loaded
    real = json.loads((folder / "rate0-real0" / "summary.json").read_text())
    assert real["queueing_s"]["p50"] is not None and real["queueing_s"]["p50"] >= 0
    # the cost model was checked on both workers' own steps, with host sharing
    roles = r["step_error_by_role"]
    assert set(roles) == {"prefill", "decode"}
    assert roles["prefill"]["plain"]["num_steps"] >= 1 and "shared" in roles["prefill"]
    assert roles["decode"]["plain"]["num_steps"] >= 1
    assert r["step_error"]["num_steps"] == sum(e["plain"]["num_steps"] for e in roles.values())
    assert list((cfg.out / "runs" / "pd-steps").glob("*.steps.jsonl"))
    assert "PD workers' own steps" in (cfg.out / "validation.txt").read_text()
    # the step-speed diagnostic runs each worker's pool at the speed its own steps ran
    factors = r["step_adjusted"]["factors"]
    assert factors == {role: pytest.approx(1 + roles[role]["shared"]["total"])
                       if "shared" in roles[role] else pytest.approx(1 + roles[role]["plain"]["total"])
                       for role in ("prefill", "decode")}
    for role in ("prefill", "decode"):
        assert (folder / f"rate0-{role}-step-speed.yaml").is_file()
    # the serving probe ran through both workers before the run: one speed per worker
    assert set(r["refreshed"]["factors"]) == {"prefill", "decode"}
    assert set(r["refreshed_trace"]["factors"]) == {"prefill", "decode"}
    assert (folder / "rate0-prefill-refreshed.yaml").is_file()
