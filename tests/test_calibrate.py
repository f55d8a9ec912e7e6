"""Calibration: a synthetic profile made from known CostParams is recovered; too few points,
mismatched models/devices and malformed profiles are refused with what was expected."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from kvpd.cli import main as kvpd_main
from realexec.engine.configs import LLAMA_50M
from simulator.calibrate.calibration import write_calibration
from simulator.calibrate.fit import FREE_FIELDS, calibrate
from simulator.calibrate.profile_io import ProfileRow, read_profile, write_profile
from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.models import ModelSpec
from simulator.cost.params import CostParams

CFG = {**LLAMA_50M, "_name_or_path": "llama-50m"}
TRUE = CostParams(gemm_compute_efficiency=0.3, gemm_memory_efficiency=0.4,
                  gemv_memory_efficiency=0.4, attn_compute_efficiency=0.2, attn_memory_efficiency=0.1,
                  step_overhead_s=4e-3)
# the CPU executor's behaviour (issue 8): padded decode attention, partial overlap, MKL's
# faster GEMV and small-M GEMMs as GEMV passes
TRUE_CPU = dataclasses.replace(TRUE, decode_padding=0.7, overlap=0.5, gemm_row_passes_below=4,
                               gemv_memory_efficiency=0.7, decode_attn_overhead_s=2e-4,
                               request_overhead_s=1e-4)


def _shapes() -> list[tuple[str, BatchShape]]:
    out = [("prefill", BatchShape.from_lists([n], [0])) for n in (8, 32, 64, 128, 256, 512, 1024)]
    out += [("chunk", BatchShape.from_lists([q], [c])) for c, q in ((256, 64), (512, 256), (1024, 512))]
    for b in (1, 2, 3, 4, 8, 16, 32, 48):
        for c in (64, 512, 1536):
            out.append(("decode", BatchShape.from_lists([1] * b, [c] * b)))
    for b in (2, 4, 8, 16, 32):  # ragged contexts: a padded decode kernel reads b x the longest
        out.append(("decode", BatchShape.from_lists([1] * b, [32 + 1500 * i // b for i in range(b)])))
    for b, p in ((4, 32), (8, 128), (24, 384), (16, 64)):
        out.append(("mixed", BatchShape.from_lists([1] * b + [p], [300] * b + [0])))
    return out


def contention(params, memory_share: float, compute_share: float, shapes=None) -> dict:
    """Contended points as `kvpd profile` records them, made from the host-sharing model
    with these shares (step times alone from the cost model under `params`)."""
    from simulator.cost.host_share import HostSharing

    cm = CostModel(ModelSpec.from_hf_config(CFG, name="llama-50m"), "cpu", "fp32", params=params)
    hs = HostSharing(cm, memory_share, compute_share)
    shapes = shapes or [BatchShape.from_lists([n], [0]) for n in (16, 128, 512)] + [
        BatchShape.from_lists([1] * b, [384] * b) for b in (1, 16)]
    points = []
    for shape in shapes:
        a = cm.step_time(shape)
        m = hs.memory_seconds(shape, a)
        points.append({"kind": "decode" if shape.num_decode_reqs else "prefill",
                       "shape": dataclasses.asdict(shape), "none_s": a,
                       "stream_s": hs.price(a, m, 1.0), "spin_s": hs.price(a, m, 0.0)})
    return {"neighbour_modes": ["none", "stream", "spin"], "repeats": 3, "points": points}


def synthetic_profile(tmp_path, params=TRUE, noise=0.01, seed=0, shapes=None, model="llama-50m",
                      device="cpu", swap=True, cpu_share=0.5, host_contention=None,
                      extra_meta=None, linear_sizes=0):
    """A profile whose medians are the cost model's step times under `params` (+ noise)."""
    rng = np.random.default_rng(seed)
    cm = CostModel(ModelSpec.from_hf_config(CFG, name="llama-50m"), "cpu", "fp32", params=params)
    rows = []
    for kind, shape in shapes if shapes is not None else _shapes():
        t = cm.step_time(shape)
        wall = t * (1 + noise * rng.standard_normal(3))
        rows.append(ProfileRow(kind, shape, times_s=list(wall), cpu_times_s=list(wall * cpu_share)))
    if linear_sizes:  # the executor's linears / LM head alone at 1 .. linear_sizes rows
        from simulator.calibrate.linears import linear_seconds, lm_head_seconds

        for n in range(1, linear_sizes + 1):
            for kind, t in (("linear", linear_seconds(cm, n)), ("lm_head", lm_head_seconds(cm, n))):
                shape = BatchShape(num_reqs=n if kind == "lm_head" else 0, num_tokens=n)
                rows.append(ProfileRow(kind, shape, times_s=[t] * 3, cpu_times_s=[t * cpu_share] * 3))
    if swap:  # 2 GB/s, 50 us latency
        for kind in ("swap_out", "swap_in", "kv_transfer"):
            for n in (1, 16, 256):
                nbytes = n * 196608
                rows.append(ProfileRow(kind, num_blocks=n, num_bytes=nbytes,
                                       times_s=[50e-6 + nbytes / 2e9] * 3))
    meta = {"device": device, "model": model, "model_config": CFG, "dtype": "fp32",
            "device_facts": {"type": "cpu", "torch_threads": 1, "cpu_available": cpu_share}}
    if host_contention is not None:
        meta["device_facts"]["host_contention"] = host_contention
    meta.update(extra_meta or {})
    return write_profile(rows, meta, tmp_path / "profile.csv")


def test_fit_recovers_a_synthetic_profile(tmp_path):
    cal = calibrate(synthetic_profile(tmp_path), seed=0)
    s = cal.summary()
    assert s["held_median_abs_err"] < 0.02 and s["held_mape"] < 0.03
    # the fitted model predicts unseen shapes as the true one does
    model = ModelSpec.from_hf_config(CFG, name="llama-50m")
    true_cm = CostModel(model, "cpu", "fp32", params=TRUE)
    fit_cm = CostModel(model, "cpu", "fp32", params=dataclasses.replace(cal.params, device=None, model=None))
    for shape in (BatchShape.from_lists([1] * 12, [700] * 12), BatchShape.from_lists([200], [100]),
                  BatchShape.from_lists([1] * 6 + [96], [50] * 6 + [0])):
        assert fit_cm.step_time(shape) == pytest.approx(true_cm.step_time(shape), rel=0.04)
    # a roofline profile needs none of the executor terms
    assert cal.params.gemm_row_passes_below == 0
    assert cal.params.decode_padding < 0.15 and cal.params.overlap > 0.85
    assert cal.params.decode_attn_overhead_s < 1e-5
    assert cal.params.gemv_memory_efficiency == pytest.approx(0.4, rel=0.1)
    # physics bounds hold
    for f in FREE_FIELDS:
        assert getattr(cal.params, f) >= 0
    assert cal.params.model == "llama-50m" and cal.params.device == "cpu"
    # links: latency + bytes / bandwidth
    assert cal.links["swap"]["bandwidth_gb_s"] == pytest.approx(2.0, rel=0.01)
    assert cal.links["kv_transfer"]["latency_us"] == pytest.approx(50, rel=0.05)


def test_fit_recovers_the_executor_terms(tmp_path):
    cal = calibrate(synthetic_profile(tmp_path, params=TRUE_CPU, noise=0.005), seed=0)
    p = cal.params
    assert p.gemm_row_passes_below == 4
    assert p.decode_padding == pytest.approx(0.7, abs=0.1)
    assert p.overlap == pytest.approx(0.5, abs=0.1)
    assert p.gemv_memory_efficiency == pytest.approx(0.7, rel=0.1)
    assert p.decode_attn_overhead_s == pytest.approx(2e-4, rel=0.25)
    assert p.request_overhead_s == pytest.approx(1e-4, rel=0.25)
    assert cal.summary()["held_median_abs_err"] < 0.02
    # without them the same fit is clearly worse, and the report says so
    assert cal.roofline_only["mape_held"] > 2 * cal.summary()["held_mape"]
    assert "roofline only" in cal.format_table() and "decode_padding 0.7" in cal.format_table()
    assert f"request_overhead_s {p.request_overhead_s * 1e6:.0f} us" in cal.format_table()
    # the saved file carries them to the simulator
    out = tmp_path / "cpu.yaml"
    write_calibration(cal, out, plot=False)
    loaded = CostParams.load(str(out))
    assert (loaded.decode_padding, loaded.overlap, loaded.gemm_row_passes_below) == (
        p.decode_padding, p.overlap, 4)
    assert loaded.extra["fit"]["roofline_only"]["mape_held"] == cal.roofline_only["mape_held"]


def test_a_slow_blas_size_at_a_step_point_does_not_bend_the_fit(tmp_path):
    # BLAS jumps: 7-8 rows run as slowly as 15 (x1.3), 9-15 x1.2; the decode step points at 8
    # requests sit on the bump. Measured against the roofline and refitted with them, the
    # factors carry the bump and every size, between step points too (5, 12), is priced right.
    bump = tuple(1.3 if n in (7, 8) else 1.2 if 9 <= n <= 15 else 1.0 for n in range(1, 49))
    true = dataclasses.replace(TRUE_CPU, linear_token_factors=bump)
    cal = calibrate(synthetic_profile(tmp_path, params=true, noise=0.0, linear_sizes=48), seed=0)
    got = cal.params.linear_token_factors
    assert got[7] > 1.15 * got[4] and got[11] > 1.1 * got[4] and got[11] > 1.1 * got[16]
    model = ModelSpec.from_hf_config(CFG, name="llama-50m")
    true_cm = CostModel(model, "cpu", "fp32", params=true)
    fit_cm = CostModel(model, "cpu", "fp32", params=dataclasses.replace(cal.params, device=None,
                                                                         model=None))
    for b in (5, 8, 12, 20):
        shape = BatchShape.from_lists([1] * b, [400] * b)
        assert fit_cm.step_time(shape) == pytest.approx(true_cm.step_time(shape), rel=0.01)
    assert cal.summary()["held_median_abs_err"] < 0.01
    assert "relative to their median; the step fit ran with them" in cal.format_table()


def test_the_idle_wake_cost_is_fitted_and_saved(tmp_path):
    gaps = [0.0, 0.01, 0.03, 0.1, 0.3, 1.0]
    wake = {"prompt_tokens": 64, "repeats": 5, "gaps_s": gaps,
            "median_s": [0.04 + 0.02 * -np.expm1(-g / 0.25) for g in gaps]}
    path = synthetic_profile(tmp_path, extra_meta={"device_facts": {
        "type": "cpu", "torch_threads": 1, "cpu_available": 0.5, "idle_wake": wake}})
    cal = calibrate(path, seed=0)
    assert cal.params.idle_wake_s == pytest.approx(0.02, rel=0.05)
    assert cal.params.idle_wake_tau_s == pytest.approx(0.25, rel=0.1)
    assert "idle wake: +20.0 ms x (1 - exp(-idle / 0.2" in cal.format_table()
    out = tmp_path / "cpu.yaml"
    write_calibration(cal, out, plot=False)
    loaded = CostParams.load(str(out))
    assert (loaded.idle_wake_s, loaded.idle_wake_tau_s) == (cal.params.idle_wake_s,
                                                            cal.params.idle_wake_tau_s)
    assert loaded.wake_extra_s(1.0) == pytest.approx(0.02 * -np.expm1(-4.0), rel=0.05)
    assert loaded.wake_extra_s(0.0) == 0.0


def test_cpu_time_fit_is_scaled_back_to_wall_time_by_the_cpu_share(tmp_path):
    cal = calibrate(synthetic_profile(tmp_path, cpu_share=0.5), statistic="cpu")
    fit = cal.params.extra["fit"]
    assert fit["statistic"] == "cpu" and fit["cpu_available"] == 0.5
    assert fit["wall_check"]["median_abs_err_held"] < 0.03
    model = ModelSpec.from_hf_config(CFG, name="llama-50m")
    true_cm = CostModel(model, "cpu", "fp32", params=TRUE)
    fit_cm = CostModel(model, "cpu", "fp32", params=dataclasses.replace(cal.params, device=None, model=None))
    shape = BatchShape.from_lists([1] * 12, [700] * 12)
    assert fit_cm.step_time(shape) == pytest.approx(true_cm.step_time(shape), rel=0.04)
    assert cal.params.step_overhead_s == pytest.approx(fit["cpu_params"]["step_overhead_s"] / 0.5)
    no_cpu = synthetic_profile(tmp_path / "w", cpu_share=0.0)
    with pytest.raises(ValueError, match="statistic 'cpu' needs a one-thread CPU profile"):
        calibrate(no_cpu, statistic="cpu")


def test_fit_is_deterministic_and_held_back_points_are_per_kind(tmp_path):
    path = synthetic_profile(tmp_path)
    a, b = calibrate(path, seed=3), calibrate(path, seed=3)
    assert a.params.to_vector() == b.params.to_vector()
    assert (a.held == b.held).all()
    for kind in ("prefill", "chunk", "decode", "mixed"):
        m = a.kinds == kind
        assert a.held[m].any() and (~a.held[m]).any()


def test_calibration_file_is_what_scenarios_load(tmp_path):
    from simulator.run import run_scenario
    from simulator.scenario import scenario_from_dict

    cal = calibrate(synthetic_profile(tmp_path))
    out = tmp_path / "cal" / "cpu.yaml"
    written = write_calibration(cal, out)
    assert out.is_file() and out.with_suffix(".fit.png").is_file() and len(written) == 2
    loaded = CostParams.load(str(out), device="cpu", model="llama-50m")
    assert loaded.to_vector() == pytest.approx(cal.params.to_vector())
    assert loaded.extra["fit"]["per_kind"]["decode"]["n_held"] > 0
    assert "fit_only" not in loaded.extra
    sc = {"model": CFG, "dtype": "fp32", "hardware": {"calibration": str(out)},
          "cache": {"num_gpu_blocks": 64}, "output": {"plots": False, "timeseries": False},
          "workload": {"synthetic": {"num_requests": 5, "arrival": {"process": "poisson", "rate": 5},
                                     "prompt_len": {"dist": "fixed", "value": 32},
                                     "output_len": {"dist": "fixed", "value": 4}}}}
    res = run_scenario(scenario_from_dict(sc), keep_requests=True)
    assert res.summary["requests"]["finished"] == 5
    # the step of a lone 32-token prompt is what the calibration predicts
    cm = CostModel(ModelSpec.from_hf_config(CFG, name="llama-50m"), "cpu", "fp32", params=loaded)
    assert res.requests[0].first_token_time == pytest.approx(cm.step_time(BatchShape.from_lists([32], [0])))


def test_too_few_points_says_how_many_more(tmp_path):
    few = _shapes()[:7]  # 7 prefill points: 5 left to fit 5 roofline parameters
    path = synthetic_profile(tmp_path, shapes=few, swap=False)
    with pytest.raises(ValueError, match=r"too few profile points: 7 step points .*needs at least "
                                         r"10 fitting points .*profile at least 7 more"):
        calibrate(path)


def test_a_small_profile_keeps_the_executor_terms_at_the_roofline(tmp_path):
    path = synthetic_profile(tmp_path, params=TRUE_CPU, shapes=_shapes()[:18], swap=False)
    cal = calibrate(path)  # 13 fitting points: enough for 6 parameters, not for 9
    p = cal.params
    assert (p.decode_padding, p.overlap, p.gemm_row_passes_below) == (0.0, 1.0, 0)
    assert p.decode_attn_overhead_s == 0.0
    assert "decode_padding" not in cal.params.extra["fit"]["free"]
    assert "held: too few points" in cal.format_table() and not cal.roofline_only


def test_mismatched_model_or_device_is_refused(tmp_path):
    path = synthetic_profile(tmp_path, model="llama-50m", device="cpu")
    with pytest.raises(ValueError, match="profile is for model 'llama-50m', not 'tiny-llama'"):
        calibrate(path, model="tiny-llama")
    with pytest.raises(ValueError, match="profile is for device 'cpu', not 'h100-sxm'"):
        calibrate(path, device="h100-sxm")
    out = tmp_path / "cpu.yaml"
    write_calibration(calibrate(path), out, plot=False)
    # a scenario naming another model than the calibration's
    from simulator.run import run_scenario
    from simulator.scenario import scenario_from_dict

    sc = {"model": "llama-3-8b", "hardware": {"calibration": str(out)}, "output": {"plots": False},
          "workload": {"synthetic": {"num_requests": 1, "arrival": {"process": "poisson", "rate": 1},
                                     "prompt_len": {"dist": "fixed", "value": 8},
                                     "output_len": {"dist": "fixed", "value": 2}}}}
    with pytest.raises(ValueError, match="profile is for model 'llama-50m', not 'llama-3-8b'"):
        run_scenario(scenario_from_dict(sc))
    # ... and another device
    sc2 = {**sc, "model": CFG, "hardware": {"calibration": str(out), "base": "h100-sxm"}}
    with pytest.raises(ValueError, match="profile is for device 'cpu', not 'h100-sxm'"):
        run_scenario(scenario_from_dict(sc2))


def test_bad_profile_files_name_the_problem(tmp_path):
    path = synthetic_profile(tmp_path)
    text = path.read_text().splitlines()
    text[3] = text[3].replace("prefill", "prefil", 1)
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(text) + "\n")
    (tmp_path / "bad.json").write_text(path.with_suffix(".json").read_text())
    with pytest.raises(ValueError, match=r"bad.csv:4: kind 'prefil' is not one of"):
        read_profile(bad)
    meta = json.loads(path.with_suffix(".json").read_text())
    del meta["model_config"]
    (tmp_path / "bad.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"bad.json: missing field\(s\) \['model_config'\]"):
        read_profile(bad)
    with pytest.raises(FileNotFoundError, match="profile file not found"):
        read_profile(tmp_path / "nothing.csv")


PROBE = {"shape_fields": ["num_reqs", "num_prefill_tokens"], "steps": {}, "loop": {}, "errors": {}}


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m["device_facts"].update(host_contention={"points": [{"shape": {}, "none_s": "x"}]}),
     r"device_facts.host_contention.points.0.none_s: Input should be a valid number \(got 'x'\)"),
    (lambda m: m["device_facts"].update(host_contention={"points": [{"shape": {"tokens": 3}}]}),
     r"unknown step-shape key\(s\) \['tokens'\]"),
    (lambda m: m.update(fresh_shapes={"points": [0], "ratio": 1.0}),
     r"fresh_shapes.points.0: Input should be a valid dictionary"),
    (lambda m: m.update(fresh_shapes={"points": [{"kind": "decode", "batch": 1, "tokens": 8,
                                                  "ratio": []}]}),
     r"fresh_shapes.points.0.ratio: Input should be a valid number"),
    (lambda m: m["device_facts"].update(idle_wake={"gaps_s": [0, "1"], "median_s": [1, 1]}),
     r"device_facts.idle_wake.gaps_s.1: Input should be a valid number"),
    (lambda m: m["device_facts"].update(cpu_available=-1), r"cpu_available: Input should be "
                                                           r"greater than or equal to 0"),
    # the serving probe (before: a TypeError from inside its fits, or a fit error kept
    # silently in the calibration)
    (lambda m: m.update(serving_probe={**PROBE, "steps": {"colocated": [[None, 0.01, 1, 1]]}}),
     r"serving_probe.steps.colocated.0.0: Input should be a valid number \(got None\)"),
    (lambda m: m.update(serving_probe={**PROBE, "steps": {"colocated": [[0.0, 0.01, 1]]}}),
     r"serving_probe: steps.colocated.0: a step is \[t_start, duration_s, num_reqs, "
     r"num_prefill_tokens\] \(4 numbers\), got 3"),
    (lambda m: m.update(serving_probe={**PROBE, "steps": {"colocated": [[0.0, 0.01, 1.5, 1]]}}),
     r"steps.colocated.0: the duration and the shape's counts must be >= 0 \(counts whole\)"),
    (lambda m: m.update(serving_probe={**PROBE, "steps": {"engine": []}}),
     r"serving_probe.steps: unknown role\(s\) \['engine'\]"),
    (lambda m: m.update(serving_probe={**PROBE, "shape_fields": ["batch"]}),
     r"serving_probe.shape_fields: unknown step-shape field\(s\) \['batch'\]"),
    (lambda m: m.update(serving_probe={**PROBE, "errors": ["pd failed"]}),
     r"serving_probe.errors: Input should be a valid dictionary"),
    (lambda m: m.update(serving_probe={**PROBE, "loop": {"decode": [[0.001, 0]]}}),
     r"loop.decode.0: a loop row is \[loop_s, .*\(3 or 5 numbers\), got 2"),
    (lambda m: m.update(serving_probe={**PROBE, "loop": {"decode": [[float("nan"), 0, 0]]}}),
     r"serving_probe.loop.decode.0.0: Input should be a finite number"),
    (lambda m: m.update(serving_probe={"steps": {"colocated": [[0.0, 0.01, 1, 1]]}}),
     r"serving_probe: shape_fields is missing"),
])
def test_damaged_profile_facts_are_refused_naming_the_key(tmp_path, edit, message):
    """Sections a fit reads (before: a TypeError traceback from inside the fit)."""
    path = synthetic_profile(tmp_path)
    meta = json.loads(path.with_suffix(".json").read_text())
    edit(meta)
    path.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=message) as info:
        read_profile(path)
    assert "profile.json: not a profile's facts" in str(info.value)


def test_a_well_formed_serving_probe_passes_the_schema_and_is_fitted(tmp_path):
    """The schema takes what `kvpd profile` writes: steps of every BatchShape field, loop
    rows of 5 (and of 3, from profiles before landings were logged), -1 for an unmeasured
    loop time, and a failed mode's error."""
    from simulator.calibrate.serving_speed import STEP_SHAPE_FIELDS

    cm = CostModel(ModelSpec.from_hf_config(CFG, name="llama-50m"), "cpu", "fp32", params=TRUE)
    shapes = [BatchShape.from_lists([1] * (1 + i % 4), [30 + i] * (1 + i % 4)) for i in range(24)]
    steps = [[float(i), cm.step_time(sh) * 1.25, *(getattr(sh, f) for f in STEP_SHAPE_FIELDS)]
             for i, sh in enumerate(shapes)]
    loop = [[-1.0, 0, 0, 0, 0]] + [[4e-4, 0, 0, 0, 0]] * 23
    probe = {"num_requests": 6, "rate": 4.0, "shape_fields": list(STEP_SHAPE_FIELDS),
             "steps": {"colocated": steps}, "loop": {"colocated": loop, "decode": [[4e-4, 0, 0]]},
             "wall_s": {"colocated": 3.0}, "errors": {"pd": "RuntimeError: worker died"}}
    path = synthetic_profile(tmp_path, extra_meta={"serving_probe": probe})
    cal = calibrate(path, seed=0)
    assert cal.params.extra["serving_speed"]["colocated"] == pytest.approx(0.8, rel=0.05)
    assert cal.params.extra["serving_speed"]["errors"] == {"pd": "RuntimeError: worker died"}
    assert cal.params.loop_overhead_s == pytest.approx(4e-4)


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_a_profile_file_that_is_not_text_is_named(tmp_path, suffix):
    """(before: a bare UnicodeDecodeError naming no file)"""
    path = synthetic_profile(tmp_path)
    path.with_suffix(suffix).write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match=rf"profile{suffix}: not a UTF-8 text file"):
        read_profile(path)


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_profile_cell_is_refused(tmp_path, value):
    path = synthetic_profile(tmp_path)
    lines = path.read_text().splitlines()
    head = lines[0].split(",")
    row = lines[1].split(",")
    row[head.index("p90_s")] = value
    path.write_text("\n".join([lines[0], ",".join(row), *lines[2:]]) + "\n")
    with pytest.raises(ValueError, match=rf"profile.csv:2: column p90_s = {value} must be a finite"):
        read_profile(path)


def test_cli_calibrate_writes_yaml_and_reports_per_kind(tmp_path, capsys):
    path = synthetic_profile(tmp_path)
    out = tmp_path / "c.yaml"
    assert kvpd_main(["calibrate", str(path), "--out", str(out), "--no-plot"]) == 0
    text = capsys.readouterr().out
    for kind in ("prefill", "chunk", "decode", "mixed", "all"):
        assert f"\n{kind}" in text
    assert "hardware: {calibration:" in text and out.is_file()
    assert kvpd_main(["calibrate", str(path), "--model", "other"]) == 2
    assert "profile is for model 'llama-50m', not 'other'" in capsys.readouterr().err


def test_host_sharing_is_fitted_from_the_contended_points(tmp_path):
    from simulator.calibrate.host_share import fit_host_sharing

    cm = CostModel(ModelSpec.from_hf_config(CFG, name="llama-50m"), "cpu", "fp32", params=TRUE)
    fit = fit_host_sharing(contention(TRUE, 0.45, 0.9), cm)
    assert fit["memory_share"] == pytest.approx(0.45, rel=1e-3)
    assert fit["compute_share"] == pytest.approx(0.9, rel=1e-3)
    assert fit["num_points"] == 5 and fit["mape"] < 1e-3
    # through calibrate: the fitted parameters reproduce the shares; the table says so
    cal = calibrate(synthetic_profile(tmp_path, noise=0.0, cpu_share=1.0,
                                      host_contention=contention(TRUE, 0.45, 0.9)))
    hs = cal.params.extra["host_sharing"]
    assert hs["memory_share"] == pytest.approx(0.45, abs=0.03)
    assert hs["compute_share"] == pytest.approx(0.9, abs=0.03)
    assert "host sharing: memory share 0.4" in cal.format_table()


def test_too_few_contended_points_say_how_many_more(tmp_path):
    one = contention(TRUE, 0.5, 1.0, shapes=[BatchShape.from_lists([64], [0])])
    cal = calibrate(synthetic_profile(tmp_path, host_contention=one))
    assert "needs 2 (1 more)" in cal.params.extra["host_sharing"]["error"]
    assert "host sharing: not fitted" in cal.format_table()


@pytest.mark.parametrize(("ratio", "warned"), [(1.02, False), (3.0, True)])
def test_the_fresh_shape_check_travels_into_the_calibration_and_its_report(tmp_path, ratio, warned):
    check = {"points": [{"kind": "decode", "batch": 1, "tokens": 384, "repeated_s": 0.02,
                         "fresh_s": 0.02 * ratio, "ratio": ratio}], "ratio": ratio, "warn": warned}
    cal = calibrate(synthetic_profile(tmp_path, extra_meta={"fresh_shapes": check}))
    assert cal.params.extra["fresh_shapes"] == check
    table = cal.format_table()
    assert f"never-run shapes / repeated shapes {ratio:.2f} (decode 1x384 {ratio:.2f})" in table
    assert ("WARNING" in table) == warned
    assert "fresh-shape" not in calibrate(synthetic_profile(tmp_path)).format_table()


def test_calibrate_refuses_a_noisy_fit_unless_told(tmp_path, capsys):
    """A held-back median error over 10% is refused (nothing written), with the profile's own
    repeat spread as the reason and what to do; --accept-noisy writes it anyway."""
    from simulator.calibrate.gate import profile_spread, refusal

    noisy = synthetic_profile(tmp_path, noise=0.3, seed=3)
    out = tmp_path / "cal.yaml"
    assert kvpd_main(["calibrate", str(noisy), "--out", str(out), "--no-plot"]) == 2
    captured = capsys.readouterr()
    assert "profile repeat spread (IQR / median of each step point's repeats): median" in captured.out
    err = captured.err
    assert "held-back median error is" in err and "over 10%" in err
    assert "the profile's own repeats spread" in err and "Re-profile on a quiet machine" in err
    assert "--accept-noisy" in err and "(nothing written)" in err
    assert not out.exists()
    assert kvpd_main(["calibrate", str(noisy), "--out", str(out), "--no-plot",
                      "--accept-noisy"]) == 0
    assert out.is_file()
    # a quiet profile passes, and its spread is what its repeats measured
    quiet = calibrate(synthetic_profile(tmp_path / "q", noise=0.01) if (tmp_path / "q").mkdir()
                      is None else None)
    assert refusal(quiet, accept_noisy=False) is None
    assert profile_spread(quiet)["median"] < 0.05
    loud = calibrate(noisy)
    assert loud.summary()["held_median_abs_err"] > 0.10
    assert profile_spread(loud)["median"] > 0.05 and refusal(loud, accept_noisy=True) is None


def test_calibrate_refuses_a_bad_out_before_fitting(tmp_path, capsys, monkeypatch):
    import simulator.calibrate.fit as fit

    path = synthetic_profile(tmp_path)
    (tmp_path / "file").write_text("in the way")
    monkeypatch.setattr(fit, "calibrate", lambda *a, **k: pytest.fail("fitted before the check"))
    assert kvpd_main(["calibrate", str(path), "--out", str(tmp_path / "file" / "c.yaml")]) == 2
    assert "is a file, so no folder can be made there" in capsys.readouterr().err
    assert kvpd_main(["calibrate", str(path), "--out", str(tmp_path / "c.txt")]) == 2
    assert "a calibration is a .yaml file" in capsys.readouterr().err
