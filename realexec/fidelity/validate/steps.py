"""Finding a validated rate's own steps in a `kvpd validate` folder: the step logs its
engines wrote, and the wall-clock windows of its real runs. Pricing them is
`simulator.calibrate.step_pricing`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def folder_cost_model(validate_dir: Path):
    """The calibrated cost model a `kvpd validate` folder priced with (its calibration is
    copied beside its results; `repro.json` names it, the model and the dtype)."""
    from simulator.calibrate.calibrated import calibrated_cost_model

    repro = json.loads((validate_dir / "repro.json").read_text())
    return calibrated_cost_model(validate_dir / Path(repro["calibration"]).name,
                                 repro["model_config"], repro["model"], repro["dtype"])


def logged_steps(steps_dir: Path) -> dict[str, list]:
    """Every step the engines of one case logged (`steps_dir`: runs/CASE-steps/ of a
    `kvpd validate` folder), by role ("colocated"; PD: "prefill", "decode")."""
    from realexec.serving.step_log import read_step_log

    out: dict[str, list] = {}
    for p in sorted(steps_dir.glob("*.steps.jsonl")):
        role = next((r for r in ("prefill", "decode") if p.name.startswith(r)), "colocated")
        out.setdefault(role, []).extend(read_step_log(p)[0])
    return out


def real_windows(result: dict[str, Any], folder: Path, index: int) -> list[tuple[float, float]]:
    """Wall-clock (start, end) (s, epoch) of each real run of a validated rate: its
    `real_windows`, or, in folders written before they were recorded, each run's end from
    its summary's file time and its length from `wall_s` (such a folder must have been
    copied keeping file times)."""
    if result.get("real_windows"):
        return [(float(a), float(b)) for a, b in result["real_windows"]]
    out = []
    for p in sorted(folder.glob(f"rate{index}-real*/summary.json")):
        end = p.stat().st_mtime
        out.append((end - json.loads(p.read_text())["wall_s"], end))
    return out


def steps_within(logs: dict[str, list], windows: Sequence[tuple[float, float]]) -> dict[str, list]:
    """The steps of `logs` (role -> steps) that started inside one of `windows`."""
    return {role: [s for s in steps if any(a <= s.t_start <= b for a, b in windows)]
            for role, steps in logs.items()}


def with_probe_speeds(probes: dict[str, Any], logs: dict[str, list], cost_model) -> dict[str, Any]:
    """A run's probes (`probe.runs[i]` of validation.json) with every colocated serving
    probe's two speeds (`simulator.calibrate.step_speeds`): as recorded, else fitted from its steps in
    the step logs `logs` (inside its `window`; folders written before probes had speeds)."""
    from simulator.calibrate.step_speeds import fit_two_speeds

    out = dict(probes)
    for key in ("serving", "serving_after"):
        probe = probes.get(key) or {}
        if probe.get("speeds") or not probe.get("window") or "colocated" not in logs:
            continue
        fit = fit_two_speeds(steps_within(logs, [probe["window"]])["colocated"], cost_model)
        if fit is not None:
            out[key] = {**probe, "speeds": {"engine": fit}}
    return out
