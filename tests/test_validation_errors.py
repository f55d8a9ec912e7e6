"""The one report of a bad file's keys (simulator/validation_errors.py), as a scenario and a
profile both give it: key path, what is wrong, the value, and the allowed keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.calibrate.profile_meta import check_profile_meta
from simulator.scenario import scenario_from_dict

FACTS = {"device": "cpu", "model": "tiny", "model_config": {}, "dtype": "bf16",
         "device_facts": {}}


def test_a_profile_missing_a_key_is_named_without_its_parent_printed():
    facts = {k: v for k, v in FACTS.items() if k != "model"}
    with pytest.raises(ValueError) as info:
        check_profile_meta(facts, Path("p.json"))
    lines = str(info.value).splitlines()
    assert lines[0] == "p.json: not a profile's facts as `kvpd profile` writes them"
    assert lines[1:] == ["  model: missing (a required key)"]
    check_profile_meta(FACTS, Path("p.json"))  # the same facts, whole, pass


def test_a_scenario_and_a_profile_report_a_bad_value_alike():
    with pytest.raises(ValueError) as scen:
        scenario_from_dict({"scheduler": {"max_num_seqs": 0, "max_num_batchd_tokens": 8}}, "s.yaml")
    text = str(scen.value)
    assert text.startswith("s.yaml: invalid scenario\n")
    assert "  scheduler.max_num_seqs: Input should be greater than or equal to 1 (got 0)" in text
    assert "  scheduler.max_num_batchd_tokens: unknown key; did you mean ['max_num_batched_tokens']?" in text
    with pytest.raises(ValueError) as prof:
        check_profile_meta({**FACTS, "device_facts": {"cpu_available": -1}}, Path("p.json"))
    assert "  device_facts.cpu_available: Input should be greater than or equal to 0 (got -1)" in str(prof.value)
