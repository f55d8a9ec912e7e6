"""`kvpd simulate` as a new user meets it: output folders never overwritten silently, column
labels that show overrides, --compare differences, errors naming file, key and value."""

import json

import pytest
import yaml

from kvpd.cli import main
from kvpd.commands.simulate import default_out, label
from tests.sim_helpers import BASE, merged

SMALL = merged(BASE, {"workload": {"synthetic": {"num_requests": 20}}})


def _write(tmp_path, data, name="s.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_runs_without_out_get_a_new_folder_each(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    p = _write(tmp_path, SMALL)
    assert main(["simulate", str(p)]) == 0
    assert main(["simulate", str(p)]) == 0
    assert main(["simulate", str(p), "--set", "hardware=h200-sxm"]) == 0
    runs = sorted(d.name for d in (tmp_path / "runs").iterdir())
    assert runs == ["t", "t+hardware=h200-sxm", "t-2"]
    out = capsys.readouterr().out
    assert "t [hardware=h200-sxm]" in out  # the column title shows the override


def test_out_that_holds_a_run_is_refused_without_force(tmp_path, capsys):
    p = _write(tmp_path, SMALL)
    out = tmp_path / "o"
    assert main(["simulate", str(p), "--out", str(out)]) == 0
    before = (out / "summary.json").read_text()
    assert main(["simulate", str(p), "--out", str(out), "--set", "scheduler.max_num_seqs=2"]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "--force" in err
    assert (out / "summary.json").read_text() == before  # nothing already written is lost
    assert main(["simulate", str(p), "--out", str(out), "--force",
                 "--set", "scheduler.max_num_seqs=2"]) == 0


def test_output_dir_of_the_scenario_is_numbered_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = _write(tmp_path, merged(SMALL, {"output": {"dir": "mine"}}))
    assert main(["simulate", str(p)]) == 0 and main(["simulate", str(p)]) == 0
    assert (tmp_path / "mine" / "summary.json").is_file()
    assert (tmp_path / "mine-2" / "summary.json").is_file()


def test_compare_prints_the_difference_and_unnamed_scenarios_use_their_file(tmp_path, capsys):
    a = dict(SMALL)
    a.pop("name")
    pa = _write(tmp_path, a, "baseline.yaml")
    pb = _write(tmp_path, merged(a, {"hardware": "h200-sxm"}), "faster.yaml")
    assert main(["simulate", str(pa), "--out", str(tmp_path / "o"), "--compare", str(pb)]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header[:3] == ["metric", "baseline", "faster"] and header[-2:] == ["diff", "%"]
    s_a = json.loads((tmp_path / "o" / "summary.json").read_text())
    s_b = json.loads((tmp_path / "o" / "compare-faster" / "summary.json").read_text())
    row = next(line for line in out.splitlines() if line.startswith("throughput (output tok/s)"))
    da = s_b["throughput"]["output_tokens_per_s"] - s_a["throughput"]["output_tokens_per_s"]
    rel = da / s_a["throughput"]["output_tokens_per_s"] * 100
    assert f"{da:+.1f}" in row and f"{rel:+.1f}%" in row


def test_lists_every_file_it_wrote(tmp_path, capsys):
    p = _write(tmp_path, merged(SMALL, {"output": {"plots": True}}))
    out = tmp_path / "o"
    assert main(["simulate", str(p), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    written = sorted(f.name for f in out.iterdir())
    assert f"wrote {len(written)} files" in text
    for name in written:
        assert name in text


def test_label_and_default_out(tmp_path):
    assert label("q", []) == "q" and label("q", ["a.b=1", "c=x"]) == "q [a.b=1] [c=x]"
    assert default_out("q", ["hardware=h200 sxm"], None).name == "q+hardware=h200_sxm"
    (tmp_path / "x").mkdir()
    assert default_out("q", [], tmp_path / "x") == tmp_path / "x"  # empty: used as is
    (tmp_path / "x" / "f").write_text("")
    assert default_out("q", [], tmp_path / "x") == tmp_path / "x-2"


@pytest.mark.parametrize(
    ("patch", "files", "expected"),
    [
        ({"workload": {"trace": "nope.csv"}}, {}, ["workload.trace", "nope.csv", "no such file"]),
        ({"hardware": "h100-sxmm"}, {}, ["hardware", "h100-sxmm", "h100-sxm"]),
        ({"model": "./nothere/config.json"}, {}, ["model", "config.json", "no such file"]),
        ({"workload": {"trace": "bad.csv"}},
         {"bad.csv": "arrival_s,prompt_len,output_len\n0.0,10,10\n0.5,abc,3\n"},
         ["workload.trace", "bad.csv:3", "abc", "--set workload.options.skip_invalid=true"]),
        ({"workload": {"synthetic": {"num_requests": 5, "arrival": {"process": "poisson", "rate": 1},
                                     "prompt_len": {"dist": "constant", "value": 9},
                                     "output_len": {"dist": "fixed", "value": 9}}}},
         {}, ["workload.synthetic.prompt_len.dist", "constant", "fixed"]),
        # planned before the run: a precision the part cannot run, weights that do not fit
        ({"hardware": "a100-80gb-sxm", "dtype": "fp8"}, {},
         ["colocated pool", "dtype/quantization", "a100-80gb-sxm cannot run fp8", "supports"]),
        ({"cache": {"gpu_memory_utilization": 0.05}}, {},
         ["weights do not fit", "gpu_memory_utilization=0.05"]),
        # a non-finite number (a fuzz found inf SLOs and API-server times accepted, and
        # written to summary.json as Infinity)
        ({"slo": {"ttft_s": float("inf")}}, {}, ["slo.ttft_s", "finite number", "inf"]),
        ({"api_server": {"preprocess_s": float("nan")}}, {}, ["api_server.preprocess_s", "finite"]),
        # swap preemption without a host pool: the scenario's key, not the core's
        ({"scheduler": {"preemption_mode": "swap"}}, {},
         ["preemption_mode: swap needs a host pool", "cache.swap_space_gb = 0.0"]),
        ({"scheduler": {"preemption_mode": "swap"}, "cache": {"swap_space_gb": 0.0001}}, {},
         ["cache.swap_space_gb = 0.0001 holds no colocated KV block"]),
    ],
)
def test_errors_name_scenario_file_key_and_value(tmp_path, capsys, patch, files, expected):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    data = merged(SMALL, patch)
    if "trace" in patch.get("workload", {}):
        data["workload"].pop("synthetic")
    p = _write(tmp_path, data, "mine.yaml")
    assert main(["simulate", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "mine.yaml" in err, err
    for word in expected:
        assert word in err, (word, err)
    assert "--skip-invalid" not in err  # a flag kvpd simulate does not have
    assert not (tmp_path / "o").exists()  # refused before anything ran


def test_the_engine_key_says_what_it_filled_in(tmp_path, capsys):
    p = _write(tmp_path, SMALL)
    assert main(["simulate", str(p), "--out", str(tmp_path / "o"), "--no-plots",
                 "--set", "engine.name=tensorrt-llm"]) == 0
    out = capsys.readouterr().out
    assert "engine tensorrt-llm: capacity_policy guaranteed_no_evict" in out
    assert "engine tensorrt-llm: scheduler limits: TensorRT-LLM server defaults" in out
    saved = json.loads((tmp_path / "o" / "scenario.json").read_text())
    assert saved["scheduler"]["capacity_policy"] == "guaranteed_no_evict"
    assert saved["scheduler"]["max_num_seqs"] == 2048  # trtllm-serve's max_batch_size


def test_a_precision_the_released_checkpoint_chose_is_said(tmp_path, capsys):
    """gpt-oss at `dtype: fp4` runs its release (MXFP4 experts, the rest BF16), and the run says
    so; a scenario that names its quantization hears nothing."""
    data = merged(SMALL, {"model": "gpt-oss-20b", "dtype": "fp4"})
    assert main(["simulate", str(_write(tmp_path, data)), "--out", str(tmp_path / "a")]) == 0
    assert "quantization as released: mxfp4 on the routed experts" in capsys.readouterr().out
    data["quantization"] = {"method": "mxfp4", "scope": "all"}
    assert main(["simulate", str(_write(tmp_path, data, "b.yaml")), "--out", str(tmp_path / "b")]) == 0
    assert "as released" not in capsys.readouterr().out


def test_rejected_requests_are_said_after_the_table(tmp_path, capsys):
    """An open-loop trace whose requests the scheduler can never serve: they are counted as
    rejected, and the run now says so with the keys that change it (before: only a number in
    the table)."""
    p = _write(tmp_path, SMALL)
    assert main(["simulate", str(p), "--out", str(tmp_path / "o"), "--no-plots",
                 "--set", "scheduler.max_model_len=600"]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    n = summary["requests"]["rejected"]
    assert 0 < n < 20
    assert f"WARNING: {n} of 20 requests were rejected" in out
    assert "max_model_len = 600 tokens" in out and "workload.over_max_len: clip" in out
    assert main(["simulate", str(p), "--out", str(tmp_path / "o2"), "--no-plots"]) == 0
    assert "rejected, not served" not in capsys.readouterr().out
