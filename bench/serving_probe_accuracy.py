"""How well the serving probe and the trace probe before each real run of a `kvpd validate`
foretold the speed that run's own steps ran at (both relative to the calibration, PD workers
priced with the run's host sharing).

    python bench/serving_probe_accuracy.py VALIDATE_DIR

VALIDATE_DIR: a `kvpd validate` output folder (validation.json, runs/) from a run with
serving probes. Each rate's `run_speeds` (one per repeat) are compared with each probe
taken just before that repeat (the trace probe only where the run had one). Folders
written before `run_speeds` was recorded are read from the step logs instead: a repeat's
steps are those that started between its summary.json's modification time minus its
`wall_s` and that time (so such a folder must not have been copied without keeping
times).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np


def _cost_model(vdir: Path):
    """The validation's calibrated cost model (its calibration is copied beside it)."""
    from simulator.calibrated import calibrated_cost_model

    repro = json.loads((vdir / "repro.json").read_text())
    return calibrated_cost_model(vdir / Path(repro["calibration"]).name, repro["model_config"],
                                 repro["model"], repro["dtype"])


def _speeds_from_logs(vdir: Path, result: dict, index: int, cost_model) -> list[dict]:
    from realexec.step_log import read_step_log
    from realexec.validate_steps import speed_factors

    runs = vdir / "runs"
    if result["mode"] == "colocated":
        logs = {"colocated": read_step_log(runs / "colocated-steps" / "engine.steps.jsonl")[0]}
    else:
        logs = {r: read_step_log(runs / "pd-steps" / f"{r}-0.steps.jsonl")[0]
                for r in ("prefill", "decode")}
    folder = runs / f"{result['trace']}-{result['mode']}"
    cluster = json.loads((folder / f"rate{index}-sim" / "scenario.json").read_text()).get("cluster")
    out = []
    for rep in range(len(result["probe"]["runs"])):
        summary = folder / f"rate{index}-real{rep}" / "summary.json"
        end = os.path.getmtime(summary)
        start = end - json.loads(summary.read_text())["wall_s"]
        steps = {k: [s for s in v if start <= s.t_start <= end] for k, v in logs.items()}
        out.append(speed_factors(steps, cost_model, cluster))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("validate_dir", type=Path)
    args = ap.parse_args()
    vdir = args.validate_dir
    data = json.loads((vdir / "validation.json").read_text())
    cost_model = None
    diffs: dict[str, list[float]] = {}
    for r in data["results"]:
        speeds = r.get("run_speeds")
        if speeds is None:
            same = [x for x in data["results"] if (x["trace"], x["mode"]) == (r["trace"], r["mode"])]
            cost_model = cost_model or _cost_model(vdir)
            speeds = _speeds_from_logs(vdir, r, same.index(r), cost_model)
        for rep, (probe, run) in enumerate(zip(r["probe"]["runs"], speeds)):
            for kind in ("serving", "trace"):
                pf = (probe.get(kind) or {}).get("factors")
                if not pf or not run:
                    continue
                cells = []
                for k, f in pf.items():
                    d = f / run[k] - 1
                    diffs.setdefault(f"{kind} probe, {r['mode']} {k}", []).append(d)
                    cells.append(f"{k}: probe {f:.3f} run {run[k]:.3f} ({d:+.1%})")
                print(f"{r['trace']:6s} {r['mode']:9s} {r['rate']:6.3f} run {rep} {kind:7s}  "
                      + "  ".join(cells))
    print("\nprobe / run - 1 over the runs (the probe's error in foretelling the run's step speed):")
    for k, d in diffs.items():
        a = np.array(d)
        print(f"  {k:32s} {a.size:3d} runs: mean {a.mean():+.1%}, mean |error| "
              f"{np.abs(a).mean():.1%}, worst {np.abs(a).max():.1%}")


if __name__ == "__main__":
    main()
