"""`calibrated_cost_model`: the simulator's cost model from a calibration file or its params."""

from __future__ import annotations

import pytest

from realexec.engine.configs import TINY
from simulator.calibrate.calibrated import calibrated_cost_model
from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.models import ModelSpec
from simulator.cost.params import CostParams
from tests.test_validate import tiny_calibration


def test_from_a_file_or_params_it_is_the_calibrated_model(tmp_path):
    path = tiny_calibration(tmp_path / "cal.yaml")
    cfg = TINY["tiny-llama"]
    params = CostParams.load(str(path), model="tiny-llama")
    want = CostModel(ModelSpec.from_hf_config(cfg, name="tiny-llama"), "cpu", "fp32", params=params)
    shape = BatchShape.from_lists([40, 1, 1], [0, 30, 90])
    for source in (path, str(path), params):
        got = calibrated_cost_model(source, cfg, "tiny-llama", "fp32")
        assert got.step_time(shape) == pytest.approx(want.step_time(shape), rel=1e-12)
    # the fitted overheads are in: a different params object gives a different time
    other = calibrated_cost_model(CostParams(device="cpu", model="tiny-llama"), cfg, "tiny-llama", "fp32")
    assert other.step_time(shape) != pytest.approx(want.step_time(shape))


def test_a_calibration_of_another_model_is_refused_by_name(tmp_path):
    path = tiny_calibration(tmp_path / "cal.yaml", model="llama-50m")
    with pytest.raises(ValueError, match="llama-50m"):
        calibrated_cost_model(path, TINY["tiny-llama"], "tiny-llama", "fp32")


def test_a_calibration_at_a_measured_speed_prices_at_that_speed(tmp_path):
    """`kvpd validate` writes the calibrated device at each run's measured speed as peaks x f
    in `extra.hardware` and overheads / f: every step time / f, as the simulator prices it."""
    from realexec.fidelity.validate.plan import scaled_hardware

    cfg = TINY["tiny-llama"]
    params = CostParams.load(str(tiny_calibration(tmp_path / "cal.yaml")), model="tiny-llama")
    scaled_hardware(params, 1.25, tmp_path / "fast.yaml")
    base = calibrated_cost_model(params, cfg, "tiny-llama", "fp32")
    fast = calibrated_cost_model(tmp_path / "fast.yaml", cfg, "tiny-llama", "fp32")
    for shape in (BatchShape.from_lists([40, 1, 1], [0, 30, 90]), BatchShape.from_lists([1] * 8, [64] * 8)):
        assert fast.step_time(shape) == pytest.approx(base.step_time(shape) / 1.25, rel=1e-9)


def test_a_calibration_file_that_is_missing_or_not_yaml_is_named(tmp_path):
    """(before: a yaml ParserError traceback; Errno 2 for a missing file)"""
    bad = tmp_path / "cal.yaml"
    bad.write_text("params: [\n")
    with pytest.raises(ValueError, match=r"cal.yaml: not valid YAML"):
        CostParams.load(str(bad))
    with pytest.raises(FileNotFoundError, match=r"calibration file not found: .*none.yaml "
                                                r"\(written by `kvpd calibrate`\)"):
        CostParams.load(str(tmp_path / "none.yaml"))


@pytest.mark.parametrize(("hardware", "message"), [
    ({"base": "cpux"}, r"extra.hardware: unknown hardware 'cpux'; did you mean: cpu"),
    ({"base": "cpu", "pcie": {"name": "swap", "bandwidth_gb_s": -1, "latency_us": 1}},
     r"extra.hardware: inline link 'swap': field 'bandwidth_gb_s' must be a finite non-negative number"),
    ("cpu", r"extra.hardware must be a mapping"),
])
def test_a_calibration_whose_device_does_not_resolve_is_refused_naming_the_file(
        tmp_path, hardware, message):
    """`extra.hardware` (the device `kvpd validate` and `calibrated_cost_model` price on);
    before, the error came later, from wherever it was resolved, as 'inline hardware' with no
    file."""
    path = tiny_calibration(tmp_path / "cal.yaml")
    params = CostParams.load(str(path))
    params.extra["hardware"] = hardware
    params.save(str(path))
    with pytest.raises(ValueError, match=rf"cal.yaml: {message}"):
        CostParams.load(str(path))
