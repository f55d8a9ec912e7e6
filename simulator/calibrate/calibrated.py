"""The simulator's cost model for a model on a calibrated device (`kvpd calibrate`'s file),
and that device at the speed an engine of a given role served at (`serving_speed`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from simulator.calibrate.serving_speed import ROLES
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import Accelerator, get_accelerator
from simulator.cost.models import ModelSpec
from simulator.cost.params import (
    CALIBRATION_USE_KEYS,
    LOOP_FIELDS,
    LOOP_TIME_CONSTANTS,
    OVERHEAD_FIELDS,
    CostParams,
)

# every throughput figure of a device (bandwidths and peaks); latencies of links stay
SPEED_FIELDS = ("bf16_tflops", "fp8_tflops", "fp32_tflops", "mem_bw_bytes_per_s")
MEMORY_FIELD = "mem_bw_bytes_per_s"


def calibrated_cost_model(calibration: CostParams | str | Path, model_config: dict[str, Any],
                          model_name: str, dtype: str) -> CostModel:
    """`CostModel` of `model_config` (an HF config dict) on the device a calibration names,
    with its fitted params; a path is loaded and checked to be for `model_name`."""
    params = (calibration if isinstance(calibration, CostParams)
              else CostParams.load(str(calibration), model=model_name))
    return CostModel(ModelSpec.from_hf_config(model_config, name=model_name),
                     calibrated_device(params), dtype, params=params)


def calibrated_device(params: CostParams) -> Accelerator | str:
    """The device a calibration describes: its `extra.hardware` (the mapping a scenario's
    `hardware` gets from it, `<field>_scale` factors included, e.g. `kvpd validate`'s files of
    a device at a measured speed) without the keys that are not the accelerator's, resolved
    as the simulator resolves a scenario's; the catalog's `params.device` without one."""
    hw = params.extra.get("hardware")
    spec = {k: v for k, v in hw.items() if k not in CALIBRATION_USE_KEYS} if isinstance(hw, dict) else {}
    return get_accelerator(spec) if spec else params.device


def serving_speed(params: CostParams, role: str, where: str = "calibration") -> float:
    """The speed (cost model's time / measured time) an engine of `role` served at, from
    the calibration's `serving_speed` (the profile's serving probe); ValueError naming what
    is missing."""
    if role not in ROLES:
        raise ValueError(f"serving speed: unknown role {role!r}; expected one of {list(ROLES)}")
    ss = params.extra.get("serving_speed")
    if not isinstance(ss, dict) or "error" in ss:
        why = ss["error"] if isinstance(ss, dict) else "no serving_speed"
        raise ValueError(f"{where}: has no serving speed ({why}); profile with a serving probe "
                         f"(`kvpd profile --serving-requests N`, PD roles also need transfers) "
                         f"and calibrate again, or drop serving_speed")
    f = ss.get(role)
    if not isinstance(f, (int, float)) or not f > 0:
        why = (ss.get("errors") or {}).get(role) or "not measured"
        raise ValueError(f"{where}: no serving speed for the {role} role ({why}); measured: "
                         f"{[r for r in ROLES if r in ss] or 'none'}")
    return float(f)


def at_speed(acc: Accelerator, params: CostParams, factor: float) -> tuple[Accelerator, CostParams]:
    """`acc` and `params` of a device `factor` x as fast: peaks and bandwidth x factor,
    per-step overheads / factor, so every step time (and host-sharing memory seconds) is
    divided by `factor`; links are unchanged."""
    return at_speeds(acc, params, factor, factor)


def at_speeds(acc: Accelerator, params: CostParams, compute: float,
              memory: float) -> tuple[Accelerator, CostParams]:
    """`acc` and `params` of a device whose compute runs `compute` x as fast (every peak
    FLOP/s x compute, fixed overheads / compute: they are host work) and whose memory
    streams `memory` x as fast (bandwidth x memory); links are unchanged."""
    for name, f in (("compute", compute), ("memory", memory)):
        if not f > 0:
            raise ValueError(f"{name} speed factor must be > 0, got {f}")
    faster = {f: getattr(acc, f) * (memory if f == MEMORY_FIELD else compute)
              for f in SPEED_FIELDS if getattr(acc, f) is not None}
    return dataclasses.replace(acc, **faster), overheads_at_speed(params, compute)


def overheads_at_speed(params: CostParams, factor: float) -> CostParams:
    """`params` with every fixed overhead (seconds) / `factor`: the overhead side of a
    device `factor` x as fast (`at_speed`; the peaks are the accelerator's). Time constants
    (`LOOP_TIME_CONSTANTS`) are not work: they stay."""
    return dataclasses.replace(params, **{f: getattr(params, f) / factor
                                          for f in (*OVERHEAD_FIELDS, *LOOP_FIELDS)
                                          if f not in LOOP_TIME_CONSTANTS})
