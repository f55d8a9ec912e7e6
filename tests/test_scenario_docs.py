"""docs/scenarios.md documents every scenario key, and every key it documents exists."""

import re
from pathlib import Path

from simulator.scenario import scenario_keys

DOC = Path(__file__).resolve().parents[1] / "docs" / "scenarios.md"
POOL_KEYS = ("replicas", "tp", "pp", "ep", "moe_a2a_backend", "ep_link", "hardware", "router",
             "num_gpu_blocks", "attention_backend")


def _documented() -> set[str]:
    return set(re.findall(r"^\| `([a-z_.]+)`", DOC.read_text(), re.M)) | set(
        re.findall(r"^\| `[a-z_.]+`, `([a-z_.]+)`", DOC.read_text(), re.M))


def test_every_scenario_key_is_documented():
    text = DOC.read_text()
    pool_row = next(line for line in text.splitlines()
                    if line.startswith("| `cluster.pd.prefill`, `cluster.pd.decode`"))
    missing = []
    for key in scenario_keys():
        if key.startswith(("cluster.pd.prefill.", "cluster.pd.decode.")):
            leaf = key.rsplit(".", 1)[1]  # documented once for both pools, in their row
            assert leaf in POOL_KEYS and f"`{leaf}`" in pool_row, key
            continue
        if f"`{key}`" not in text:
            missing.append(key)
    assert not missing, f"undocumented scenario keys (add them to docs/scenarios.md): {missing}"


def test_every_documented_key_exists():
    keys = set(scenario_keys())
    assert _documented() - keys == set()
    assert len(_documented()) > 40  # the tables were read
