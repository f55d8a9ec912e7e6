"""The simulator's cost model for a model on a calibrated device (`kvpd calibrate`'s file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulator.costmodel import CostModel
from simulator.costparams import CostParams
from simulator.models import ModelSpec


def calibrated_cost_model(calibration: CostParams | str | Path, model_config: dict[str, Any],
                          model_name: str, dtype: str) -> CostModel:
    """`CostModel` of `model_config` (an HF config dict) on the device a calibration names,
    with its fitted params; a path is loaded and checked to be for `model_name`."""
    params = (calibration if isinstance(calibration, CostParams)
              else CostParams.load(str(calibration), model=model_name))
    return CostModel(ModelSpec.from_hf_config(model_config, name=model_name), params.device,
                     dtype, params=params)
