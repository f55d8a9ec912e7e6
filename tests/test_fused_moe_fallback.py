"""The old fused-MoE fallback config (`cluster.fused_moe_config: legacy_default`): its price is
the fit of vLLM's measured fallback kernel, and the vllm and sglang presets pick it exactly
where the engine finds no tuned file for the shape."""

from __future__ import annotations

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_accelerator
from simulator.cost.kernels import kernel_profile
from simulator.engines import apply_engine
from simulator.engines.fused_moe_fallback import fused_moe_fallback_rule, has_tuned_config
from tests.bench_helpers import load_diagnostic
from tests.sim_helpers import merged, sim


def test_the_fallback_terms_are_the_fit_of_vllms_measured_fallback_kernel():
    """kernels.yaml hopper grouped_gemm.legacy_default: relative and stream_efficiency fitted
    to vLLM PR #24700's 'Main' column; every one of its 18 batch sizes within 10%, and the
    B200's same fallback (assumed as Hopper's) within 10% where it is published."""
    diag = load_diagnostic("moe_kernels")
    relative, stream, _ = diag.fit_legacy()
    g = kernel_profile(get_accelerator("h100-sxm")).grouped_gemm.legacy_default
    assert g.relative == pytest.approx(relative, abs=0.003)
    assert g.stream_efficiency == pytest.approx(stream, abs=0.005)
    assert {row[2] for row in diag.LEGACY_ROWS} == {"h100-sxm", "b200"}
    for _, model, hw, tp, dtype, measured, _ in diag.LEGACY_ROWS:
        cm = CostModel(model, hw, dtype, tp=tp, fused_moe_config="legacy_default")
        ratios = [diag.kvpd_us(cm, m) / us for m, us in measured.items()]
        assert all(0.9 <= r <= 1.1 for r in ratios), (hw, ratios)


def test_the_fallback_slows_prefill_not_decode():
    def step(cfg: str, shape: BatchShape) -> float:
        return CostModel("glm-4.6", "h200-sxm", tp=8, fused_moe_config=cfg).step_time(shape)

    prefill = BatchShape.from_lists([2000] * 4, [0] * 4)
    decode = BatchShape.from_lists([1] * 16, [2000] * 16)
    assert step("legacy_default", prefill) > 1.3 * step("tuned", prefill)
    assert step("legacy_default", decode) == pytest.approx(step("tuned", decode), rel=0.15)
    # (BLOCK_SIZE_M by tokens: 64 once the step's tokens exceed the 160 experts)
    legacy = CostModel("glm-4.6", "h200-sxm", tp=8, fused_moe_config="legacy_default")
    assert legacy.kernels.grouped_gemm.block_m_by_tokens
    assert legacy.describe()["fused_moe_config"] == "legacy_default"


def _scenario(model: str, hardware: str, version: str, **cluster) -> dict:
    return {"model": model, "hardware": hardware, "engine": {"name": "vllm", "version": version},
            "cluster": {"tp": 8, **cluster}}


@pytest.mark.parametrize("model, hardware, version, cluster, picked", [
    # vLLM 0.11 has no E=160,N=192 H200 file for GLM-4.6 at TP8
    ("glm-4.6", "h200-sxm", "0.11.0", {}, True),
    # ... nor E=20,N=1536 with expert parallelism (whole experts, 160 / 8 per GPU)
    ("glm-4.6", "h200-sxm", "0.11.0", {"ep": 8}, True),
    # Qwen3-235B's E=128,N=192 H100 file ships in 0.11.0
    ("qwen3-235b-a22b", "h100-sxm", "0.11.0", {}, False),
    # v0.17 replaced the fallback
    ("glm-4.6", "h200-sxm", "0.17.0", {}, False),
    # a dense model, and an AMD part (not looked up: kvpd prices AMD's CK kernels)
    ("llama-3.1-70b", "h200-sxm", "0.11.0", {}, False),
    ("glm-4.6", "mi300x", "0.11.0", {}, False),
    # the scenario's own choice wins
    ("glm-4.6", "h200-sxm", "0.11.0", {"fused_moe_config": "tuned"}, False),
])
def test_the_vllm_preset_picks_the_fallback_where_vllm_has_no_tuned_file(
        model, hardware, version, cluster, picked):
    data = _scenario(model, hardware, version, **cluster)
    notes = apply_engine(data)
    assert (data["cluster"].get("fused_moe_config") == "legacy_default") == picked
    assert any(n.startswith("fused_moe_config legacy_default") for n in notes) == picked


def test_a_part_sold_as_several_boards_looks_up_each_boards_file():
    """The RTX PRO 6000's Server and Workstation Editions name their files apart; vLLM 0.11
    ships neither for Qwen3-30B-A3B's 16-bit experts, so both are named."""
    data = _scenario("qwen3-30b-a3b", "rtx-pro-6000", "0.11.0", tp=1)
    notes = apply_engine(data)
    assert data["cluster"]["fused_moe_config"] == "legacy_default"
    note = next(n for n in notes if n.startswith("fused_moe_config legacy_default"))
    assert "Blackwell_Server_Edition.json or " in note and "Workstation_Edition.json" in note


def test_quantized_experts_keep_the_tuned_price():
    data = {**_scenario("glm-4.6", "h200-sxm", "0.11.0"), "dtype": "fp8"}
    assert fused_moe_fallback_rule("vllm", data, data["cluster"], "0.11.0") == []
    # gpt-oss is released in MXFP4: with no dtype it runs as released, not as 16-bit experts
    data = _scenario("gpt-oss-120b", "h100-sxm", "0.11.0")
    assert fused_moe_fallback_rule("vllm", data, data["cluster"], "0.11.0") == []


def test_tuned_files_count_from_the_first_catalogued_wheel_that_ships_them():
    from packaging.version import Version

    name = "E=128,N=192,device_name=NVIDIA_H100_80GB_HBM3"
    assert has_tuned_config("vllm", name, Version("0.11.0"))
    assert not has_tuned_config("vllm", "E=160,N=192,device_name=NVIDIA_H200", Version("0.16.0"))
    # SGLang 0.5.7 ships Qwen3-235B's TP8 H200 file (in a triton_* folder it searches)
    assert has_tuned_config("sglang", "E=128,N=192,device_name=NVIDIA_H200", Version("0.5.7"))


@pytest.mark.parametrize("model, version, cluster, picked", [
    # SGLang 0.5.7 has no 16-bit E=160,N=192 H200 file for GLM-4.6 at TP8: its fallback
    ("glm-4.6", "0.5.7", {}, True),
    # ... but has Qwen3-235B's E=128,N=192
    ("qwen3-235b-a22b", "0.5.7", {}, False),
    # releases after the last one read are not judged
    ("glm-4.6", "0.5.9", {}, False),
])
def test_the_sglang_preset_picks_its_fallback_the_same_way(model, version, cluster, picked):
    data = {"model": model, "hardware": "h200-sxm",
            "engine": {"name": "sglang", "version": version}, "cluster": {"tp": 8, **cluster}}
    notes = apply_engine(data)
    assert (data["cluster"].get("fused_moe_config") == "legacy_default") == picked
    assert any("SGLang" in n and n.startswith("fused_moe_config") for n in notes) == picked


BURST = {"workload": {"synthetic": {"num_requests": 24, "arrival": {"process": "burst"},
                                    "prompt_len": {"dist": "fixed", "value": 800},
                                    "output_len": {"dist": "fixed", "value": 8}}}}


@pytest.mark.parametrize("patch, message", [
    ({"model": "llama-3-8b", "cluster": {"fused_moe_config": "legacy_default"}},
     "cluster.fused_moe_config: legacy_default, but llama-3-8b is a dense model"),
    ({"model": "mixtral-8x7b", "hardware": "mi300x", "cluster": {"tp": 2,
                                                                "fused_moe_config": "legacy_default"}},
     "mi300x has no fallback-config entry"),
    ({"model": "qwen3-30b-a3b", "hardware": "m4-max",
      "cluster": {"fused_moe_config": "legacy_default"}},
     "m4-max has no fallback-config entry (it has no kernel tables"),
    ({"model": "mixtral-8x7b", "cluster": {"tp": 2, "fused_moe_config": "untuned"}},
     "cluster.fused_moe_config"),
])
def test_a_fallback_that_cannot_apply_is_refused_naming_the_key(patch, message):
    with pytest.raises(ValueError) as err:
        sim(merged(merged({"hardware": "h100-sxm"}, BURST), patch), base={})
    assert message in str(err.value)


def test_a_simulated_replica_on_the_fallback_takes_longer():
    base = merged({"model": "mixtral-8x7b", "hardware": "h100-sxm", "cluster": {"tp": 2}}, BURST)
    tuned = sim(base, base={})
    legacy = sim(merged(base, {"cluster": {"fused_moe_config": "legacy_default"}}), base={})
    assert legacy.summary["requests"]["finished"] == tuned.summary["requests"]["finished"] == 24
    assert legacy.summary["span_s"] > tuned.summary["span_s"]
