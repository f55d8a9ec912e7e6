"""How well the bracketing serving probes of a `kvpd validate` folder priced each real run's
own steps: per run, the bracket's speed (mean of the probes just before and after it) against
the speed the run's own steps ran at (cost model total / measured total, both x the
calibration), and the same for the probe before the run alone (a forecast).

    python bench/diagnostics/bracket_accuracy.py VALIDATE_DIR

A bracket that misses its run's own speed by more than the metric tolerances explains a
'missed' that is the machine's drift, not the simulator.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    from realexec.fidelity.validate.steps import folder_cost_model, logged_steps, steps_within
    from realexec.fidelity.validate.validation import bracketed
    from simulator.calibrate.step_pricing import speed_factors

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("validate_dir", type=Path)
    vdir = ap.parse_args().validate_dir
    data = json.loads((vdir / "validation.json").read_text())
    cm = folder_cost_model(vdir)
    diffs: dict[str, list[float]] = {"bracket": [], "before": []}
    for r in data["results"]:
        logs = logged_steps(vdir / "runs" / f"{r['case']}-steps")
        cluster = None
        if r["mode"] == "pd":  # priced with the host sharing the simulator used
            sc = json.loads((vdir / "runs" / r["case"] / "rate0-sim0" / "scenario.json").read_text())
            cluster = sc.get("cluster")
        for j, probes in enumerate(r["speed"]["probes"]):
            own = speed_factors(steps_within(logs, [probes["window"]]), cm, cluster)
            if not own:
                continue
            cells = []
            for name, f in (("bracket", bracketed(probes.get("before"), probes.get("after"))),
                            ("before", (probes.get("before") or {}).get("factors"))):
                if not f:
                    continue
                for k, v in f.items():
                    diffs[name].append(v / own[k] - 1)
                    cells.append(f"{name} {k} {v:.3f} ({v / own[k] - 1:+.1%})")
            run = " ".join(f"{k} {v:.3f}" for k, v in own.items())
            print(f"{r['case']:24s} {r['rate']:7.3f} run {j}: own {run}  " + "  ".join(cells))
    for name, d in diffs.items():
        if d:
            a = np.abs(d)
            print(f"{name}: |speed / run's own - 1| median {np.median(a):.1%}, max {a.max():.1%} "
                  f"over {len(d)} (engine, run) pairs")


if __name__ == "__main__":
    main()
