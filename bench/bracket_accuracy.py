"""How well each way of refreshing the calibration priced the real runs' own steps in a
`kvpd validate` folder: the calibration as profiled, the serving probe just before the run
(one factor), the bracket of the probes before and after it (one factor), and the bracket
with compute and memory apart (`simulator.calibrate.step_speeds`, colocated engines).

    python bench/bracket_accuracy.py VALIDATE_DIR

For every real run: the cost model's total over the run's own steps (from the step logs,
inside the run's wall-clock window) at each estimator's speeds / their measured total - 1,
overall and for its prompt and decode-only steps apart (colocated); PD workers overall,
priced with host sharing as the simulator prices them. Then per estimator the mean, mean
|error| and worst over the runs. Needs a folder written with probe windows and closing
probes (commit 829ed4c or later); earlier ones have no after-probe for a rate's last run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def _estimators(probes: dict, logs: dict, cm, mode: str) -> dict[str, dict | None]:
    """Estimator -> per engine a `Speed` (one factor or {"compute", "memory"}), or None."""
    from realexec.fidelity.validate.steps import with_probe_speeds
    from realexec.fidelity.validate.validation import bracketed_factors

    before = (probes.get("serving") or {}).get("factors")
    out: dict[str, dict | None] = {"profiled": {k: 1.0 for k in before} if before else None,
                                   "before": before}
    one = {k: {"factors": (probes.get(k) or {}).get("factors")}
           for k in ("serving", "serving_after")}
    out["bracket"] = bracketed_factors(one)
    if mode == "colocated":
        probes = with_probe_speeds(probes, logs, cm)
        sb = ((probes.get("serving") or {}).get("speeds") or {}).get("engine")
        out["before, two speeds"] = {"engine": sb} if sb else None
        two = bracketed_factors(probes, two_speeds=True)
        if two and isinstance(two["engine"], dict):
            out["bracket, two speeds"] = two
    return out


def _priced(steps: list, cm, speed) -> float:
    from simulator.calibrate.step_speeds import compute_memory, cost_model_at

    at = cost_model_at(cm, *compute_memory(speed))
    return float(sum(at.step_time(s.shape) for s in steps))


def main() -> None:
    from realexec.fidelity.validate.steps import folder_cost_model, logged_steps, steps_within
    from simulator.calibrate.step_pricing import speed_factors, usable_steps
    from simulator.calibrate.step_speeds import step_groups

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("validate_dir", type=Path)
    args = ap.parse_args()
    vdir = args.validate_dir
    data = json.loads((vdir / "validation.json").read_text())
    cm = folder_cost_model(vdir)
    logs = {}
    scores: dict[tuple[str, str], list[float]] = {}
    for r in data["results"]:
        mode = r["mode"]
        if mode not in logs:
            logs[mode] = logged_steps(vdir / "runs", mode)
        cluster = r.get("cluster")
        if mode == "pd":
            folder = vdir / "runs" / f"{r['trace']}-pd"
            same = [x for x in data["results"] if (x["trace"], x["mode"]) == (r["trace"], "pd")]
            sc = json.loads((folder / f"rate{same.index(r)}-sim" / "scenario.json").read_text())
            cluster = sc.get("cluster")
        for rep, (probes, window) in enumerate(zip(r["probe"]["runs"], r["real_windows"])):
            steps = steps_within(logs[mode], [window])
            cells = []
            if mode == "colocated":
                groups = {"all": usable_steps(steps["colocated"]),
                          **step_groups(steps["colocated"])}
                for name, est in _estimators(probes, logs[mode], cm, mode).items():
                    if not est:
                        continue
                    errs = []
                    for g, ss in groups.items():
                        real = sum(s.duration_s for s in ss)
                        if real > 0:
                            e = _priced(ss, cm, est["engine"]) / real - 1
                            scores.setdefault((f"colocated {g}", name), []).append(e)
                            errs.append(f"{g} {e:+.1%}")
                    cells.append(f"{name}: " + " ".join(errs))
            else:
                own = speed_factors(steps, cm, cluster)  # the cost model's total / measured
                for name, est in _estimators(probes, logs[mode], cm, mode).items():
                    if not est or not own:
                        continue
                    errs = []
                    for role in ("prefill", "decode"):
                        e = own[role] / est[role] - 1  # priced at est / measured
                        scores.setdefault((f"pd {role}", name), []).append(e)
                        errs.append(f"{role[0].upper()} {e:+.1%}")
                    cells.append(f"{name}: " + " ".join(errs))
            print(f"{r['trace']:6s} {mode:9s} {r['rate']:6.3f} run {rep}  " + "; ".join(cells))
    print("\npriced / measured - 1 over the runs' own steps:")
    for (what, name), errs in sorted(scores.items()):
        a = np.array(errs)
        print(f"  {what:18s} {name:20s} {a.size:3d} runs: mean {a.mean():+6.1%}, "
              f"mean |error| {np.abs(a).mean():5.1%}, worst {np.abs(a).max():5.1%}")


if __name__ == "__main__":
    main()
