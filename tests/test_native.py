"""The core compiled with mypyc (`simulator.native`, `kvpd native build`): a build is found
only for the sources it was made from, is loaded only with KVPD_NATIVE=1, and gives the same
simulation, figure for figure, as the pure-Python core."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator import native

REPO = Path(__file__).resolve().parents[1]


def test_a_build_is_found_only_under_its_own_sources_key(tmp_path, monkeypatch):
    monkeypatch.setenv("KVPD_CACHE_DIR", str(tmp_path))
    root = native.cache_root()
    assert native._find_build() is None  # nothing built here
    stale = root / "0123456789abcdef0123"  # another version of the sources
    stale.mkdir(parents=True)
    (stale / "COMPLETE").write_text("mypy x\n")
    assert native._find_build() is None
    unfinished = root / native.build_key()  # a build that stopped half way
    unfinished.mkdir()
    assert native._find_build() is None
    (unfinished / "COMPLETE").write_text("mypy x\n")
    assert native._find_build() == unfinished
    monkeypatch.delenv("KVPD_NATIVE", raising=False)
    assert not native.wanted() and "set KVPD_NATIVE=1" in native.status()
    monkeypatch.setenv("KVPD_NATIVE", "1")
    assert native.wanted()
    assert native.clean() == 2 and native._find_build() is None


def test_the_key_covers_every_compiled_module_and_the_interpreter():
    key = native.build_key()
    assert len(key) == 20 and key == native.build_key()
    assert all(native.source(m).is_file() for m in native.MODULES)
    assert "simulator.core.engine" not in native.MODULES  # (not compiled: see the list)


_RUN = (
    "import json, sys; sys.path.insert(0, '.'); "
    "from simulator import native; from simulator.run import run_scenario; "
    "from simulator.scenario import scenario_from_dict; "
    "sc = scenario_from_dict({'name': 'n', 'model': 'llama-3-8b', 'hardware': 'h100-sxm', "
    "'cache': {'enable_prefix_caching': True}, 'workload': {'trace': %r, 'limit': 1500}, "
    "'output': {'timeseries': False, 'plots': False}}); "
    "s = run_scenario(sc).summary; s.pop('wall_s'); s['sim'].pop('requests_per_wall_s'); "
    "print(json.dumps({'native': native.active(), 'summary': s}, sort_keys=True, default=str))"
)


@pytest.mark.skipif(native._find_build() is None, reason="no native build for these sources "
                    "(`kvpd native build`; .ci/run builds one)")
def test_native_and_pure_cores_give_identical_summaries():
    trace = REPO.parent / "shared" / "data" / "traces" / "azure2023_AzureLLMInferenceTrace_conv.csv"
    out = {}
    for flag in ("0", "1"):
        res = subprocess.run([sys.executable, "-c", _RUN % str(trace)], cwd=REPO, check=True,
                             capture_output=True, text=True,
                             env=dict(os.environ, KVPD_NATIVE=flag, PYTHONPATH=str(REPO)))
        out[flag] = json.loads(res.stdout.splitlines()[-1])
    assert out["0"]["native"] is False and out["1"]["native"] is True
    assert out["0"]["summary"] == out["1"]["summary"]
