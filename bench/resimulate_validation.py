"""Re-run the simulator side of a finished `kvpd validate` with another calibration (or this
checkout's simulator), against the same stored real runs.

    python bench/resimulate_validation.py VALIDATE_DIR [--calibration FILE] [--modes colocated,pd]
                                          [--step-speed]

VALIDATE_DIR: a `kvpd validate` output folder (validation.json, runs/). Each rate's simulated
scenario (`runs/TRACE-MODE/rateK-sim/scenario.json`) is run again, with its device's
calibration swapped for FILE if given (each engine at FILE's serving speed, when FILE
measured one), and compared with the real repeats kept beside it
(`rateK-real*/summary.json`) by the validation's own `compare` and targets. Without
--calibration it reproduces the validation's table (the simulator is deterministic). It
separates what a cost-model change does from the machine's drift: the real runs are the
same ones.

--step-speed also re-runs the step-speed diagnostic: each engine's device at the speed its
own logged steps ran in that rate's real runs (`simulator.calibrate.step_pricing.speed_factors`,
priced by this checkout), so what is left is the error of everything but step speed. A
rate's steps are those logged while its real runs ran (`real_windows` in validation.json;
folders written before it was recorded: each run's end from its summary's file time and
its length from `wall_s`).

--bracketed also re-runs the bracketed refresh (`Validation._bracketed`): the simulator once
per real run, each engine at the mean speed of the serving probes just before and just
after that run (needs closing probes: commit 829ed4c or later); with --two-speeds the
colocated engine's compute and memory apart where the probes fit both (fitted from the
probes' logged steps, inside their windows, when the folder predates recorded speeds).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from realexec.fidelity.validate.plan import engine_factors, rescaled_scenario, simulate
from realexec.fidelity.validate.steps import (
    logged_steps,
    real_windows,
    steps_within,
    with_probe_speeds,
)
from realexec.fidelity.validate.validation import bracketed_factors, check_targets, compare
from simulator.calibrate.calibrated import calibrated_cost_model
from simulator.calibrate.step_pricing import speed_factors
from simulator.cost.params import CostParams

SHOWN = ("throughput_tok_s", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "e2e_p50",
         "tpot_p90", "e2e_p90")
HEAD = ("tput", "ttft50", "ttft90", "ttft99", "tpot50", "e2e50", "tpot90", "e2e90")


def _row(r: dict[str, Any], metrics: dict[str, Any], ok: dict[str, bool]) -> str:
    return (f"{r['trace']:6s} {r['mode']:9s} {r['rate']:6.3f} {r['label']:12s} "
            + " ".join(f"{metrics[k]['error']:+7.1%}" for k in SHOWN)
            + f"  {sum(ok.values())}/{len(ok)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("validate_dir", type=Path)
    ap.add_argument("--calibration", help="calibration YAML to price the steps with")
    ap.add_argument("--modes", default="colocated,pd")
    ap.add_argument("--step-speed", action="store_true",
                    help="also re-run the step-speed diagnostic from the step logs")
    ap.add_argument("--bracketed", action="store_true",
                    help="also re-run the bracketed refresh (one simulation per real run)")
    ap.add_argument("--two-speeds", action="store_true",
                    help="with --bracketed: colocated compute and memory speeds apart")
    args = ap.parse_args()
    runs_dir = args.validate_dir / "runs"
    results = json.loads((args.validate_dir / "validation.json").read_text())["results"]
    tally = {"base": [0, 0], "step-speed": [0, 0], "bracketed": [0, 0]}
    logs: dict[str, dict[str, list]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="resim-"))
    # the calibration the engines are priced by: FILE, or the copy the validation kept (not
    # a scenario's own, which may be scaled to an engine's serving speed)
    repro = json.loads((args.validate_dir / "repro.json").read_text())
    base_cal = Path(args.calibration or args.validate_dir / Path(repro["calibration"]).name)
    params = CostParams.load(str(base_cal))
    print(f"{'trace':6s} {'mode':9s} {'rate':>6s} {'label':12s} "
          + " ".join(f"{k:>7s}" for k in HEAD) + "  targets")
    for r in results:
        mode = r["mode"]
        if mode not in args.modes.split(","):
            continue
        folder = runs_dir / f"{r['trace']}-{mode}"
        same = [x for x in results if (x["trace"], x["mode"]) == (r["trace"], mode)]
        index = same.index(r)
        sc = json.loads((folder / f"rate{index}-sim" / "scenario.json").read_text())
        stem = scratch / f"{r['trace']}-{mode}-rate{index}"
        if args.calibration:  # every engine's device from FILE, at its serving speed if any
            hw = {k: v for k, v in sc["hardware"].items() if k != "serving_speed"}
            sc["hardware"] = dict(hw, calibration=str(base_cal.resolve()))
            sc = rescaled_scenario(params, sc, engine_factors(params, sc), stem, "serving")
        reals = [json.loads(p.read_text())
                 for p in sorted(folder.glob(f"rate{index}-real*/summary.json"))]
        runs: list[tuple[str, Any]] = [("base", sc)]
        if (args.step_speed or args.bracketed) and mode not in logs:
            logs[mode] = logged_steps(runs_dir, mode)
        cm = calibrated_cost_model(params, sc["model"], params.model or "model",
                                   sc.get("dtype") or "fp32")
        if args.bracketed:
            per_run = [bracketed_factors(with_probe_speeds(p, logs[mode], cm)
                                         if args.two_speeds else p, args.two_speeds)
                       for p in r["probe"]["runs"][:len(reals)]]
            if per_run and all(per_run):
                print("  bracketed speeds: " + ", ".join(json.dumps(f) for f in per_run))
                runs.append(("bracketed", [rescaled_scenario(params, sc, f, stem, f"bracketed{j}")
                                           for j, f in enumerate(per_run)]))
            else:
                print(f"  (rate {index}: not every real run is bracketed)")
        if args.step_speed:
            steps = steps_within(logs[mode], real_windows(r, folder, index))
            factors = speed_factors(steps, cm, sc.get("cluster"))
            if factors is None:
                print(f"  (no logged steps in rate {index}'s runs)")
            else:
                runs.append(("step-speed", rescaled_scenario(params, sc, factors, stem,
                                                             "step-speed")))
        for name, scenario in runs:
            sims = ([simulate(x).summary for x in scenario] if isinstance(scenario, list)
                    else simulate(scenario).summary)
            metrics = compare(reals, sims)
            ok = check_targets(metrics)
            if r["label"] == "under-loaded":
                tally[name][0] += sum(ok.values())
                tally[name][1] += len(ok)
            print(_row(r, metrics, ok) + ("" if name == "base" else f"  ({name})"))
    for name, (met, checked) in tally.items():
        if checked:
            print(f"targets met over under-loaded rates ({name}): {met} / {checked}")


if __name__ == "__main__":
    main()
