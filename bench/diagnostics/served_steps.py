"""Where a `kvpd validate` folder's real steps depart from the cost model: each real run's
logged steps priced at that run's bracketing speed (`runs/CASE/rateI-speedK.yaml`, PD
`rateI-ROLE-speedK.yaml`: the calibration the simulated run used; without host sharing, so
PD workers' steps that overlapped read slower), with the wake cost of steps after idling, as
total predicted / total measured - 1 per role and step kind, and for prompt-only steps by the
idle time before them (the engine waiting for requests).

    python bench/diagnostics/served_steps.py VALIDATE_DIR [--calibration FILE]

`--calibration` prices every run with another calibration instead (at speed 1: compare kinds
and gaps with each other, not the level). This is how the 2026-12-02 quiet full run's
misses were traced to prompt steps after idle spells (20-52% fast) and to decode batches of
5-16 (11-29% fast, a GEMM size-factor problem); docs/validation-runs.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

GAPS_S = (0.0, 0.005, 0.1, 1.0, float("inf"))  # idle before a prompt step: bucket edges (s)


def price_run(steps, cm, kinds: dict[str, list], gaps: dict[int, list[float]]) -> None:
    """Add one real run's `steps` (one role's), priced with `cm` as the simulator prices them
    (wake cost after idle spells included), to the per-kind totals [predicted s, measured s,
    steps] of `kinds` and the prompt-only steps' errors by idle bucket (`GAPS_S`) of `gaps`."""
    from simulator.calibrate.step_pricing import step_kind, wake_extras

    steps = sorted((s for s in steps if s.duration_s > 0 and s.shape.num_tokens),
                   key=lambda s: s.t_start)
    wake = wake_extras(steps, cm.params)
    prev_end = None
    for s in steps:
        pred = cm.step_time(s.shape) + wake.get(id(s), 0.0)
        tot = kinds.setdefault(step_kind(s.shape), [0.0, 0.0, 0])
        tot[0] += pred
        tot[1] += s.duration_s
        tot[2] += 1
        if not s.shape.num_decode_reqs and prev_end is not None:
            b = int(np.searchsorted(GAPS_S, s.t_start - prev_end, side="right")) - 1
            gaps.setdefault(b, []).append(pred / s.duration_s - 1)
        prev_end = s.t_end


def report(title: str, kinds: dict[str, list], gaps: dict[int, list[float]]) -> None:
    print(f"{title}: predicted / measured - 1, over the real runs' steps")
    for kind, (pred, real, n) in sorted(kinds.items()):
        print(f"  {kind:12s} {n:6d} steps  {pred / real - 1:+7.1%}")
    for b, errs in sorted(gaps.items()):
        lo, hi = GAPS_S[b], GAPS_S[b + 1]
        print(f"  prompt steps after {lo * 1e3:g}-{hi * 1e3:g} ms idle: {len(errs):4d}, "
              f"median {np.median(errs):+7.1%}")


def main() -> None:
    from realexec.fidelity.validate.steps import logged_steps, real_windows, steps_within
    from simulator.calibrate.calibrated import calibrated_cost_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("validate_dir", type=Path)
    ap.add_argument("--calibration", type=Path, help="price with this calibration (speed 1)")
    args = ap.parse_args()
    vdir = args.validate_dir
    data = json.loads((vdir / "validation.json").read_text())
    repro = json.loads((vdir / "repro.json").read_text())

    def cost_model(path: Path):
        return calibrated_cost_model(path, repro["model_config"], repro["model"], repro["dtype"])

    fixed = cost_model(args.calibration) if args.calibration else None
    cases: dict[str, list] = {}
    for r in data["results"]:
        cases.setdefault(r["case"], []).append(r)
    for case, rates in cases.items():
        folder = vdir / "runs" / case
        logs = logged_steps(vdir / "runs" / f"{case}-steps")
        for role in logs:
            kinds: dict[str, list] = {}
            gaps: dict[int, list[float]] = {}
            speed = "speed" if role == "colocated" else f"{role}-speed"
            for i, r in enumerate(rates):
                for k, window in enumerate(real_windows(r, folder, i)):
                    cm = fixed or cost_model(folder / f"rate{i}-{speed}{k}.yaml")
                    price_run(steps_within(logs, [window])[role], cm, kinds, gaps)
            report(f"{case} ({role})", kinds, gaps)


if __name__ == "__main__":
    main()
