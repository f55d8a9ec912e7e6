"""FP4 weights (NVFP4 / MXFP4): W4A4 on parts with FP4 tensor cores, weight-only (W4A16)
elsewhere, refused where neither runs; block scales in the bytes read."""

from __future__ import annotations

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_accelerator
from simulator.cost.memory_plan import plan_memory
from simulator.cost.precision import resolve
from simulator.scenario import scenario_from_dict


def _prefill(tokens: int) -> BatchShape:
    return BatchShape.from_lists([tokens], [0])


def _decode(batch: int, ctx: int) -> BatchShape:
    return BatchShape.from_lists([1] * batch, [ctx] * batch)


def test_fp4_runs_on_fp4_units_where_the_part_has_them() -> None:
    b200, h100 = get_accelerator("b200"), get_accelerator("h100-sxm")
    nv = resolve(b200, "fp4")
    assert (nv.method, nv.compute, nv.weight_only) == ("nvfp4", "fp4", False)
    assert resolve(get_accelerator("mi355x"), "fp4").method == "mxfp4"  # the OCP format off NVIDIA
    fallback = resolve(h100, "fp4", {"method": "mxfp4"})
    assert (fallback.compute, fallback.weight_only) == ("bf16", True)
    assert "W4A4" in nv.label() and "W4A16" in fallback.label()
    assert resolve(b200, "mxfp4").method == "mxfp4"  # a dtype naming the format keeps it


def test_fp4_block_scales_are_in_the_bytes() -> None:
    b200 = get_accelerator("b200")
    nv = resolve(b200, "fp4", "nvfp4").matrix_weight_bytes
    mx = resolve(b200, "fp4", "mxfp4").matrix_weight_bytes
    assert nv == pytest.approx(0.5 + 1 / 16) and mx == pytest.approx(0.5 + 1 / 32)
    f8 = plan_memory("llama-3.3-70b", "b200", dtype="fp8")
    f4 = plan_memory("llama-3.3-70b", "b200", dtype="fp4")
    assert 0.5 < f4.weight_bytes_per_gpu / f8.weight_bytes_per_gpu < 0.6
    assert f4.num_gpu_blocks > f8.num_gpu_blocks


def test_fp4_is_faster_than_fp8_on_blackwell_prefill_and_decode() -> None:
    f8, f4 = (CostModel("llama-3.3-70b", "b200", dtype=d) for d in ("fp8", "fp4"))
    pf = _prefill(4096)
    assert f4.explain(pf).bound == "compute"
    assert 1.3 < f8.step_time(pf) / f4.step_time(pf) < 2.0  # twice the peak, less in practice
    dc = _decode(8, 1024)  # weight streaming: ~0.56 of FP8's bytes
    assert 1.2 < f8.step_time(dc) / f4.step_time(dc) < 1.8
    eff = f4.efficiency_sources()["gemm_compute_efficiency"]
    assert "fp4_relative" in eff[1]


def test_fp4_where_neither_fp4_units_nor_a_weight_only_kernel_exist_is_refused() -> None:
    with pytest.raises(ValueError, match=r"mi300x cannot run fp4/mxfp4.*supports: .*fp8"):
        CostModel("llama-3-8b", "mi300x", dtype="fp4")
    with pytest.raises(ValueError, match=r"nvfp4 fixes its block size \(16 weights"):
        resolve(get_accelerator("b200"), "fp4", {"method": "nvfp4", "group_size": 128})
    with pytest.raises(ValueError, match=r"nvfp4.*fp4.*not dtype 'fp8'"):
        resolve(get_accelerator("b200"), "fp8", {"method": "nvfp4"})


def test_scenario_takes_fp4() -> None:
    sc = scenario_from_dict({"model": "llama-3.1-8b", "hardware": "b200", "dtype": "fp4",
                             "quantization": {"method": "nvfp4"}})
    assert sc.quantization.method == "nvfp4"


def test_a_rescaled_cost_model_keeps_its_fp4_precision():
    """The serving-speed rescale rebuilds the cost model from its precision: a weight-only FP4
    one (no group size of its own) must come back as it was, not be refused."""
    from simulator.calibrate.step_speeds import cost_model_at

    for dt, quant, hw in (("fp4", "mxfp4", "h100-sxm"), ("fp4", "nvfp4", "b200"),
                          ("int4", {"method": "gptq", "group_size": 64}, "a100-80gb-sxm")):
        cm = CostModel("llama-3.1-8b", hw, dtype=dt, quantization=quant)
        assert cost_model_at(cm, 1.2, 0.9).precision == cm.precision
