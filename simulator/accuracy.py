"""How sure a prediction from catalog defaults is: kvpd's error on the published suite.

`python bench/published.py --write-accuracy` simulates every published result in
`bench/published/` from uncalibrated defaults and writes, per model class (dense, MoE) and
metric family (throughput, TTFT, TPOT, latency), the number of rows and the median and 90th
percentile of |predicted / published - 1| to `simulator/catalog/published_accuracy.json`.
A run on an NVIDIA or AMD part from defaults (no `{calibration: FILE}`) carries its class's
figures in `summary.json` under `accuracy`, so a planner reads the prediction beside how far
such predictions were from published measurements. A calibrated run carries none: its
yardstick is `kvpd validate` on the machine it was calibrated on. A test regenerates the
file and compares (`tests/test_accuracy.py`), so it cannot fall behind the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

ACCURACY_FILE = Path(__file__).resolve().parent / "catalog" / "published_accuracy.json"
GENERATOR = "python bench/published.py --write-accuracy"

# the published metrics (bench/published_rows.py METRICS) by family
METRIC_FAMILIES = {
    "output_throughput": "throughput", "total_throughput": "throughput",
    "request_throughput": "throughput", "ttft": "ttft", "tpot": "tpot", "itl": "tpot",
    "e2e": "latency", "batch_latency": "latency",
}


def _stats(errors: list[float]) -> dict[str, Any]:
    """Rows, median and 90th percentile |error|, and the median signed error (fractions)."""
    mags = np.abs(errors)
    return {"rows": len(errors), "median_abs_error": round(float(np.percentile(mags, 50)), 4),
            "p90_abs_error": round(float(np.percentile(mags, 90)), 4),
            "median_error": round(float(np.percentile(errors, 50)), 4)}


def accuracy_table(results: Iterable[tuple[bool, str, float]]) -> dict[str, Any]:
    """The file's content from the suite's rows, each (MoE model?, metric name, signed error
    as predicted / published - 1)."""
    by_class: dict[str, dict[str, list[float]]] = {}
    for moe, metric, err in results:
        fam = METRIC_FAMILIES[metric]
        cls = by_class.setdefault("moe" if moe else "dense", {})
        cls.setdefault("all", []).append(err)
        cls.setdefault(fam, []).append(err)
    return {
        "generated_by": GENERATOR,
        "basis": "uncalibrated catalog defaults against the published results in bench/published/",
        "classes": {cls: {fam: _stats(errs) for fam, errs in sorted(fams.items())}
                    for cls, fams in sorted(by_class.items())},
    }


def write_accuracy(table: dict[str, Any], path: Path = ACCURACY_FILE) -> Path:
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    return path


@lru_cache(maxsize=1)
def load_accuracy() -> dict[str, Any] | None:
    """The committed table (None when the file is missing)."""
    try:
        return json.loads(ACCURACY_FILE.read_text())
    except FileNotFoundError:
        return None


def _calibrated(hardware: Any) -> bool:
    return isinstance(hardware, dict) and "calibration" in hardware


def run_accuracy(sc: Any, model: Any) -> dict[str, Any] | None:
    """What a run of scenario `sc` (model spec `model`) from catalog defaults may be off by:
    its model class's rows of the published suite; None for a calibrated part (any pool) or a
    part with no published rows (CPU, Apple)."""
    from simulator.cost.hardware import scenario_accelerator
    from simulator.cost.kernels import KernelProfile, kernel_profile

    parts = [sc.hardware]
    pd = sc.cluster.pd
    if pd is not None:
        parts += [pool.hardware for pool in (pd.prefill, pd.decode) if pool.hardware is not None]
    if any(_calibrated(h) for h in parts):
        return None
    if not all(isinstance(kernel_profile(scenario_accelerator(h)), KernelProfile) for h in parts):
        return None
    table = load_accuracy()
    cls = "moe" if model.is_moe else "dense"
    figures = (table or {}).get("classes", {}).get(cls)
    if not figures:
        return None
    return {"basis": "uncalibrated catalog defaults", "model_class": cls,
            "published_suite": figures, "source": f"{GENERATOR} (bench/published/)"}


FAMILY_ORDER = ("throughput", "ttft", "tpot", "latency")
FAMILY_LABEL = {"throughput": "throughput", "ttft": "TTFT", "tpot": "TPOT", "latency": "latency"}


def accuracy_line(acc: dict[str, Any]) -> str:
    """One line for the CLI: the class's rows and its median / p90 |error| by metric family."""
    figs = acc["published_suite"]
    parts = [f"{figs[f]['median_abs_error']:.0%} / {figs[f]['p90_abs_error']:.0%} "
             f"{FAMILY_LABEL[f]}" for f in FAMILY_ORDER if f in figs]
    return (f"how sure: a prediction from {acc['basis']}; on {figs['all']['rows']} published "
            f"{acc['model_class']}-model results (python bench/published.py) kvpd's |error| was "
            f"median / p90 {', '.join(parts)} (README: How far to trust the simulator)")
