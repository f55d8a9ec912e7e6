"""Every scenario and sweep shipped in scenarios/ loads and passes the pre-run checks (model,
hardware, precision, parallelism, links), so a user's first `kvpd simulate` of any of them
does not stop on its own file."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.plan.sweep_spec import load_sweep
from simulator.preflight import preflight
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1] / "scenarios"
SCENARIOS = sorted(p for p in ROOT.rglob("*.yaml") if "sweeps" not in p.parts)
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))


def test_there_is_something_to_check():
    assert len(SCENARIOS) >= 15 and SWEEPS


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_scenario_loads_and_passes_preflight(path):
    preflight(load_scenario(path))


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_shipped_sweep_loads(path):
    spec = load_sweep(path)
    assert spec.base_data and spec.points
