"""`kvpd report`: sweep and capacity results as a self-contained HTML page with PNG
plots and the table, or as Markdown with the PNGs beside it."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import yaml

from kvpd.cli import main
from simulator.plan.candidates import plan_capacity, write_result
from simulator.plan.plots import pareto_front
from simulator.plan.report import write_report
from simulator.plan.slo import SLOSet, parse_slo
from simulator.plan.sweep import run_sweep
from simulator.plan.sweep_spec import load_sweep

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    f = tmp / "s.yaml"
    f.write_text(yaml.safe_dump({
        "name": "rep", "base": str(QUICKSTART), "set": {"workload.limit": 60},
        "axes": {"hardware": ["h100-sxm", "a100-80gb-sxm"],
                 "workload.target_rate": [4.0, 8.0, 16.0],
                 "cache.gpu_memory_utilization": [0.9, 0.05]}}))  # 0.05: those points fail
    run_sweep(load_sweep(f), tmp / "out", backend="process", workers=2, progress=False)
    return tmp / "out"


def embedded_pngs(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)]


def test_html_report_is_self_contained_with_plots_and_table(sweep_dir):
    path = write_report(sweep_dir)
    assert path == sweep_dir / "report.html"
    page = path.read_text()
    pngs = embedded_pngs(page)
    # Pareto front, metric-vs-axis lines for hardware and rate, their heatmap; the memory
    # axis has one value left among ok points, so it gets no plot
    assert len(pngs) == 4 and all(p.startswith(PNG_MAGIC) for p in pngs)
    assert "<img" in page and "src='http" not in page and "href=" not in page
    assert page.count("<tr>") >= 12 + 1  # the results table: a header and 12 points
    assert "Failed points (6)" in page and "weights do not fit" in page
    assert "a100-80gb-sxm" in page and "h100-sxm" in page


def test_markdown_report_writes_pngs_beside_it(sweep_dir, tmp_path):
    path = write_report(sweep_dir, "md", tmp_path / "summary.md")
    text = path.read_text()
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
    assert len(links) == 4
    for link in links:
        assert (path.parent / link).read_bytes().startswith(PNG_MAGIC)
    assert text.startswith("# Sweep rep") and "| point |" in text


def test_capacity_report(tmp_path):
    slo = SLOSet((parse_slo("ttft_p90=0.5"), parse_slo("tpot_p90=0.05")))
    res = plan_capacity(QUICKSTART, slo, overrides=["workload.window_s=[0, 30]"], repeats=1,
                        hardware=["h200-sxm"], peak_rps=30.0)
    write_result(res, tmp_path)
    page = write_report(tmp_path / "capacity.json").read_text()
    # a curve per SLO target and the per-candidate bars
    assert len(embedded_pngs(page)) == 3
    assert "ttft_p90 &lt;= 0.5 s" in page and "cost unknown" in page
    assert "other samples of the traffic" in page  # the confidence note


def test_pareto_front_keeps_the_undominated_points():
    pts = [(1.0, 5.0), (1.0, 4.0), (2.0, 5.0), (2.0, 7.0), (3.0, 6.0), (4.0, 9.0)]
    assert pareto_front(pts) == [0, 3, 5]


def test_cli_report_and_bad_input(sweep_dir, tmp_path, capsys):
    assert main(["report", str(sweep_dir / "results.parquet"), "--format", "md",
                 "--out", str(tmp_path / "r.md")]) == 0
    assert (tmp_path / "r.md").is_file()
    assert main(["report", str(tmp_path)]) == 2
    assert "not a sweep folder" in capsys.readouterr().err
    assert main(["report", str(sweep_dir), "--metric", "goodput"]) == 2
    assert "not a column" in capsys.readouterr().err


def test_damaged_result_files_are_refused_naming_file_and_key(tmp_path, capsys):
    """A capacity.json or sweep.json that is not JSON, not an object, or lacks a key the
    report reads is refused naming the file and key path (before: KeyError traceback)."""
    cap = tmp_path / "cap" / "capacity.json"
    cap.parent.mkdir()
    cases = [("not json", "not JSON"), ("[1]", "must be a JSON object, got list"),
             ("{}", "no key 'name'"),
             ('{"name": "x", "scenario": "s", "slo_text": "t", "unit": "u", '
              '"num_simulations": 1, "wall_s": 1, "best": null, "slo": {"targets": []}, '
              '"candidates": [{"name": "a", "status": "ok", "evaluations": [{"rate": 1}]}]}',
              "no key 'candidates[0].evaluations[0].variant'")]
    for text, message in cases:
        cap.write_text(text)
        assert main(["report", str(cap)]) == 2
        err = capsys.readouterr().err
        assert str(cap) in err and message in err and "kvpd capacity" in err
    sweep = tmp_path / "sw"
    sweep.mkdir()
    (sweep / "sweep.json").write_text('{"name": "x", "base": "b", "mode": "grid", '
                                      '"num_points": 2, "axes": [{"keys": ["a"]}]}')
    assert main(["report", str(sweep)]) == 2
    assert "no key 'axes[0].name'" in capsys.readouterr().err
    # a .json file outside a sweep folder is not taken for one
    other = tmp_path / "other.json"
    other.write_text("{}")
    assert main(["report", str(other)]) == 2
    assert "no sweep.json beside it" in capsys.readouterr().err
