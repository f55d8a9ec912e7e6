"""Re-run the simulator side of a finished `kvpd validate` with another calibration, against
the same stored real runs.

    python bench/resimulate_validation.py VALIDATE_DIR [--calibration FILE] [--modes colocated,pd]

VALIDATE_DIR: a `kvpd validate` output folder (validation.json, runs/). Each rate's simulated
scenario (`runs/TRACE-MODE/rateK-sim/scenario.json`) is run again, with its device's
calibration swapped for FILE if given, and compared with the real repeats kept beside it
(`rateK-real*/summary.json`) by the validation's own `compare` and targets. Without
--calibration it reproduces the validation's table (the simulator is deterministic). It
separates what a cost-model change does from the machine's drift: the real runs are the
same ones.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from realexec.validate import check_targets, compare
from realexec.validate_plan import simulate

SHOWN = ("throughput_tok_s", "ttft_p50", "tpot_p50", "e2e_p50", "tpot_p90", "e2e_p90")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("validate_dir", type=Path)
    ap.add_argument("--calibration", help="calibration YAML to price the steps with")
    ap.add_argument("--modes", default="colocated,pd")
    args = ap.parse_args()
    results = json.loads((args.validate_dir / "validation.json").read_text())["results"]
    met = checked = 0
    print(f"{'trace':6s} {'mode':9s} {'rate':>6s} {'label':12s} "
          + " ".join(f"{k:>9s}" for k in ("tput", "ttft50", "tpot50", "e2e50", "tpot90", "e2e90"))
          + "  targets")
    for r in results:
        if r["mode"] not in args.modes.split(","):
            continue
        folder = args.validate_dir / "runs" / f"{r['trace']}-{r['mode']}"
        same = [x for x in results if (x["trace"], x["mode"]) == (r["trace"], r["mode"])]
        index = same.index(r)
        sc = json.loads((folder / f"rate{index}-sim" / "scenario.json").read_text())
        if args.calibration:
            sc["hardware"] = dict(sc["hardware"], calibration=str(Path(args.calibration).resolve()))
        reals = [json.loads(p.read_text())
                 for p in sorted(folder.glob(f"rate{index}-real*/summary.json"))]
        metrics = compare(reals, simulate(sc).summary)
        ok = check_targets(metrics)
        if r["label"] == "under-loaded":
            met, checked = met + sum(ok.values()), checked + len(ok)
        print(f"{r['trace']:6s} {r['mode']:9s} {r['rate']:6.3f} {r['label']:12s} "
              + " ".join(f"{metrics[k]['error']:+9.1%}" for k in SHOWN)
              + f"  {sum(ok.values())}/{len(ok)}")
    print(f"targets met over under-loaded rates: {met} / {checked}")


if __name__ == "__main__":
    main()
