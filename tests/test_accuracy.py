"""A run from catalog defaults says how far such runs were from published results
(`summary.json` `accuracy`, `simulator/accuracy.py`), from a table the published suite writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from simulator.accuracy import (
    ACCURACY_FILE,
    accuracy_line,
    accuracy_table,
    load_accuracy,
    run_accuracy,
)
from simulator.cost.models import get_model
from tests.sim_helpers import sim

ROOT = Path(__file__).resolve().parents[1]


def test_the_table_counts_rows_by_class_and_metric_family():
    rows = [(False, "output_throughput", 0.10), (False, "total_throughput", -0.30),
            (False, "request_throughput", 0.05), (False, "ttft", -0.2), (True, "tpot", 0.4),
            (True, "itl", 0.0), (True, "batch_latency", -0.1)]
    t = accuracy_table(rows)["classes"]
    assert t["dense"]["throughput"] == {"rows": 3, "median_abs_error": 0.1,
                                        "p90_abs_error": 0.26, "median_error": 0.05}
    assert t["dense"]["all"]["rows"] == 4 and t["dense"]["ttft"]["median_error"] == -0.2
    assert t["moe"]["tpot"]["rows"] == 2 and t["moe"]["tpot"]["median_abs_error"] == 0.2
    assert t["moe"]["latency"]["rows"] == 1 and "throughput" not in t["moe"]


def test_a_run_from_defaults_carries_its_model_class_figures():
    table = load_accuracy()
    dense = sim({"workload": {"synthetic": {"num_requests": 20}}})
    acc = dense.summary["accuracy"]
    assert acc["model_class"] == "dense"
    assert acc["published_suite"] == table["classes"]["dense"]
    line = accuracy_line(acc)
    assert f"on {table['classes']['dense']['all']['rows']} published dense-model results" in line
    assert "TTFT" in line and "throughput" in line
    moe = run_accuracy(SimpleNamespace(hardware="h200-sxm", cluster=SimpleNamespace(pd=None)),
                       get_model("qwen3-30b-a3b"))
    assert moe["model_class"] == "moe" and moe["published_suite"] == table["classes"]["moe"]


def test_no_figures_for_a_calibrated_part_or_one_without_published_rows():
    llama = get_model("llama-3-8b")
    calibrated = SimpleNamespace(hardware={"calibration": "c.yaml"}, cluster=SimpleNamespace(pd=None))
    assert run_accuracy(calibrated, llama) is None
    pool = SimpleNamespace(hardware={"calibration": "c.yaml"})
    pd = SimpleNamespace(hardware="h100-sxm", cluster=SimpleNamespace(
        pd=SimpleNamespace(prefill=SimpleNamespace(hardware=None), decode=pool)))
    assert run_accuracy(pd, llama) is None
    for part in ("cpu", "m2-ultra"):
        assert run_accuracy(SimpleNamespace(hardware=part, cluster=SimpleNamespace(pd=None)),
                            llama) is None


@pytest.mark.slow
def test_the_committed_table_is_what_the_suite_gives_now(tmp_path):
    """The table cannot fall behind the model: rerunning the published suite writes it again,
    equal figure for figure."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import published
    finally:
        sys.path.pop(0)
    out = tmp_path / "acc.json"
    assert published.main(["--out", str(tmp_path / "rows"), "--write-accuracy", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(ACCURACY_FILE.read_text())
