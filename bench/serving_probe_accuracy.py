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

It also scores two estimators built from the same stored probes, to see whether a better
use of them would foretell the runs better: the mean of a probe and up to `PAST` probes
before it on the same engine (still taken before the run), and the mean of the probes just
before and just after the run (a bracket; not a forecast).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def _speeds_from_logs(vdir: Path, result: dict, index: int, cost_model) -> list[dict]:
    from realexec.fidelity.validate.steps import logged_steps, real_windows, steps_within
    from simulator.calibrate.step_pricing import speed_factors

    runs = vdir / "runs"
    logs = logged_steps(runs, result["mode"])
    folder = runs / f"{result['trace']}-{result['mode']}"
    cluster = json.loads((folder / f"rate{index}-sim" / "scenario.json").read_text()).get("cluster")
    return [speed_factors(steps_within(logs, [w]), cost_model, cluster)
            for w in real_windows(result, folder, index)]


PAST = 3  # earlier probes averaged into the "recent" estimator


def _score(diffs: dict[str, list[float]], title: str) -> None:
    print(f"\n{title}")
    for k, d in diffs.items():
        a = np.array(d)
        print(f"  {k:32s} {a.size:3d} runs: mean {a.mean():+.1%}, mean |error| "
              f"{np.abs(a).mean():.1%}, worst {np.abs(a).max():.1%}")


def _estimators(seq: list[tuple[str, dict | None, dict | None]]) -> dict[str, dict]:
    """Errors of the "recent" and "bracket" estimators over `seq`, the runs in the order
    they ran: (group, the probe's factors before the run, the run's own speeds); probes
    are averaged only within a group (an engine, or an engine on one trace)."""
    recent: dict[str, list[float]] = {}
    bracket: dict[str, list[float]] = {}
    probed: dict[str, list[dict]] = {}  # group -> its probes so far, in order
    for i, (group, probe, run) in enumerate(seq):
        if not probe:
            continue
        past = probed.setdefault(group, [])
        past.append(probe)
        if not run:
            continue
        after = seq[i + 1][1] if i + 1 < len(seq) and seq[i + 1][0] == group else None
        for k in probe:
            mean = float(np.mean([p[k] for p in past[-(PAST + 1):] if k in p]))
            recent.setdefault(f"{group} {k}", []).append(mean / run[k] - 1)
            if after and k in after:
                bracket.setdefault(f"{group} {k}", []).append((probe[k] + after[k]) / 2 / run[k] - 1)
    return {"recent": recent, "bracket": bracket}


def main() -> None:
    from realexec.fidelity.validate.steps import folder_cost_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("validate_dir", type=Path)
    args = ap.parse_args()
    vdir = args.validate_dir
    data = json.loads((vdir / "validation.json").read_text())
    cost_model = None
    diffs: dict[str, list[float]] = {}
    # kind -> (block, repeat, rate index) -> (group, probe factors, run speeds): `kvpd
    # validate` runs one trace and mode after another, and within them the repeats round the
    # rates (rate 0, 1, 2, then 0, 1, 2 again), so that is the order the probes were taken in
    ran: dict[str, dict[tuple[int, int, int], tuple]] = {"serving": {}, "trace": {}}
    blocks: dict[tuple[str, str], int] = {}  # (trace, mode) -> its order
    rates_seen: dict[tuple[str, str], int] = {}  # (trace, mode) -> rates read so far
    for r in data["results"]:
        key = (r["trace"], r["mode"])
        block = blocks.setdefault(key, len(blocks))
        index = rates_seen[key] = rates_seen.get(key, -1) + 1  # the rate's index in its block
        speeds = r.get("run_speeds")
        if speeds is None:
            cost_model = cost_model or folder_cost_model(vdir)
            speeds = _speeds_from_logs(vdir, r, index, cost_model)
        for rep, (probe, run) in enumerate(zip(r["probe"]["runs"], speeds)):
            for kind in ("serving", "trace"):
                pf = (probe.get(kind) or {}).get("factors")
                # a trace probe's mix is its trace's: average it only within that trace
                group = r["mode"] if kind == "serving" else f"{r['trace']} {r['mode']}"
                ran[kind][(block, rep, index)] = (group, pf, run)
                if not pf or not run:
                    continue
                cells = []
                for k, f in pf.items():
                    d = f / run[k] - 1
                    diffs.setdefault(f"{kind} probe, {r['mode']} {k}", []).append(d)
                    cells.append(f"{k}: probe {f:.3f} run {run[k]:.3f} ({d:+.1%})")
                print(f"{r['trace']:6s} {r['mode']:9s} {r['rate']:6.3f} run {rep} {kind:7s}  "
                      + "  ".join(cells))
    _score(diffs, "probe / run - 1 over the runs (the probe's error in foretelling the run's step speed):")
    for kind, runs in ran.items():
        est = _estimators([runs[key] for key in sorted(runs)])
        if est["recent"]:
            _score(est["recent"], f"{kind} probes: the mean of the probe before the run and up to "
                   f"{PAST} before it on the same engine{' and trace' if kind == 'trace' else ''}:")
        if est["bracket"]:
            _score(est["bracket"], f"{kind} probes: the mean of the probes just before and just "
                   "after the run (a bracket, not a forecast):")


if __name__ == "__main__":
    main()
