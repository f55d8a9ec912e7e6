"""`kvpd validate` builds the real engine of a calibration whose model was profiled from a
config.json or a model folder (named by its folder, not a built-in name): `kvpd calibrate`
keeps the profiled HF config, and a scenario that leaves the model out gets it."""

from __future__ import annotations

import pytest

from realexec.engine.configs import builtin_config
from realexec.fidelity.validate.source import _check_model
from simulator.cost.params import CostParams


def test_a_scenario_without_a_model_gets_the_profiled_config() -> None:
    cfg = {**builtin_config("tiny-llama"), "_name_or_path": "my-local-model"}
    params = CostParams(model="my-local-model", device="cpu", extra={"model_config": cfg})
    config, name = _check_model({}, "scenario.yaml", params)
    assert name == "my-local-model" and config["hidden_size"] == cfg["hidden_size"]
    # a scenario naming its model still names it (and must be the calibrated one)
    with pytest.raises(ValueError, match="the calibration is for 'my-local-model'"):
        _check_model({"model": "tiny-llama"}, "scenario.yaml", params)


def test_without_the_profiled_config_a_folder_name_is_refused() -> None:
    """A calibration written before it kept the config: the folder's name alone cannot be
    built, and the refusal says what to name."""
    params = CostParams(model="my-local-model", device="cpu")
    with pytest.raises(ValueError, match="name a built-in model, a config.json or a model folder"):
        _check_model({}, "scenario.yaml", params)
