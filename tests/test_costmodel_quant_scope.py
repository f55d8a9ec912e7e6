"""`quantization.scope`: a checkpoint that quantizes its routed MoE experts only (gpt-oss's
MXFP4 release) keeps attention, router, shared experts, dense MLPs and embeddings in 16 bits,
in the memory plan and in every step's bytes and GEMMs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kvpd.cli import main
from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_accelerator
from simulator.cost.memory_plan import plan_memory
from simulator.cost.models import get_model
from simulator.cost.precision import resolve
from simulator.scenario import scenario_from_dict

CATALOG = Path(__file__).resolve().parents[1] / "simulator" / "catalog"
MXFP4_BYTES = 0.5 + 1 / 32  # E2M1 weights plus one E8M0 scale per 32 (the OCP MX spec)
EXPERTS = {"method": "mxfp4", "scope": "experts"}
EVERY = {"method": "mxfp4", "scope": "all"}


def decode(batch: int, ctx: int) -> BatchShape:
    return BatchShape.from_lists([1] * batch, [ctx] * batch)


def op(cm: CostModel, shape: BatchShape, name: str):
    return next(o for o in explain_step(cm, shape).ops if o.name == name)


def routed_expert_params(name: str) -> int:
    """Routed-expert weights of a catalog MoE, from its config.json fields in the catalog file
    alone (gate, up, down per expert)."""
    c = yaml.safe_load((CATALOG / "models.yaml").read_text())[name]["config"]
    return (c["num_hidden_layers"] * c["num_local_experts"] * 3 * c["hidden_size"]
            * c["intermediate_size"])


def test_the_memory_plan_stores_only_the_routed_experts_in_mxfp4() -> None:
    """gpt-oss-120b on one H100: its weights are the routed experts at MXFP4 bytes and every
    other parameter at 2 bytes (~65 GB, the release checkpoint's size), not all at MXFP4."""
    m = get_model("gpt-oss-120b")
    experts = routed_expert_params("gpt-oss-120b")
    want = (m.num_params - experts) * 2 + experts * MXFP4_BYTES
    plan = plan_memory("gpt-oss-120b", "h100-sxm", dtype="fp4", quantization=EXPERTS)
    assert plan.weight_bytes_per_gpu == pytest.approx(want, rel=1e-12)
    assert 64e9 < plan.weight_bytes_per_gpu < 66e9
    every = plan_memory("gpt-oss-120b", "h100-sxm", dtype="fp4", quantization=EVERY)
    assert every.weight_bytes_per_gpu < plan.weight_bytes_per_gpu
    assert plan.num_gpu_blocks < every.num_gpu_blocks  # 16-bit attention leaves less KV room
    # the routed experts' own share is the same in both scopes
    assert plan.expert_weight_bytes_per_gpu == every.expert_weight_bytes_per_gpu


def test_attention_weights_stream_at_16_bits_and_the_experts_at_mxfp4() -> None:
    """At decode, the QKV/O projections read 2 bytes per weight under scope `experts`
    (MXFP4's bytes under scope `all`); the routed experts read the same bytes either way; the
    step is slower by the difference."""
    m = get_model("gpt-oss-120b")
    every = CostModel("gpt-oss-120b", "h100-sxm", "fp4", quantization=EVERY)
    scoped = CostModel("gpt-oss-120b", "h100-sxm", "fp4", quantization=EXPERTS)
    shape = decode(1, 2048)
    w_qkv = m.num_layers * m.hidden_size * (m.num_heads + 2 * m.num_kv_heads) * m.head_dim
    extra = op(scoped, shape, "qkv_proj").bytes - op(every, shape, "qkv_proj").bytes
    assert extra == pytest.approx(w_qkv * (2 - MXFP4_BYTES), rel=1e-9)
    assert op(scoped, shape, "moe_experts").bytes == op(every, shape, "moe_experts").bytes
    assert scoped.step_time(shape) > every.step_time(shape)


def test_16_bit_attention_pays_no_dequantization_at_prefill() -> None:
    """Weight-only (W4A16) GEMMs pay a dequantization pass per row block; outside the scope
    the projections are plain BF16 GEMMs, so a long prefill's attention projections cost less
    compute than under scope `all`, and the experts' compute is unchanged."""
    every = CostModel("gpt-oss-120b", "h100-sxm", "fp4", quantization=EVERY)
    scoped = CostModel("gpt-oss-120b", "h100-sxm", "fp4", quantization=EXPERTS)
    shape = BatchShape.from_lists([8192], [0])
    assert op(scoped, shape, "qkv_proj").compute_s < op(every, shape, "qkv_proj").compute_s
    assert op(scoped, shape, "moe_experts").compute_s == pytest.approx(
        op(every, shape, "moe_experts").compute_s, rel=0.02)


def test_on_fp4_tensor_cores_the_rest_runs_at_the_bf16_rate() -> None:
    """On B200 the experts run W4A4 on the FP4 units; the projections outside the scope run
    at the BF16 peak, so a compute-bound prefill's QKV takes longer than under scope `all`."""
    every = CostModel("gpt-oss-120b", "b200", "fp4", quantization=EVERY)
    scoped = CostModel("gpt-oss-120b", "b200", "fp4", quantization=EXPERTS)
    assert scoped.precision.compute == "fp4" and scoped.precision.dense.compute == "bf16"
    shape = BatchShape.from_lists([8192], [0])
    ratio = op(scoped, shape, "qkv_proj").compute_s / op(every, shape, "qkv_proj").compute_s
    acc = get_accelerator("b200")
    assert ratio > 0.5 * acc.peak_flops("fp4") / acc.peak_flops("bf16")


def test_scope_all_is_the_default_and_prices_as_before() -> None:
    assert resolve(get_accelerator("h100-sxm"), "fp8").scope == "all"
    plain = CostModel("qwen3-30b-a3b", "h100-sxm", "fp8")
    named = CostModel("qwen3-30b-a3b", "h100-sxm", "fp8",
                      quantization={"method": "fp8", "scope": "all"})
    for shape in (decode(32, 1024), BatchShape.from_lists([4096], [0])):
        assert named.step_time(shape) == plain.step_time(shape)


def test_without_grouped_gemm_terms_the_rest_still_runs_outside_the_scope() -> None:
    """A part with no kernel profile prices an MoE MLP as plain GEMMs: under scope `experts`
    the routed experts run at the FP8 rate and the shared experts and the dense first layer's
    MLP at the 16-bit rate, so the MLP takes exactly their FLOPs x (BF16 - FP8 seconds per
    FLOP) longer than under scope `all`."""
    hw = {"base": "m3-max", "fp8_tflops": 28.6}  # a hypothetical Apple part with FP8 units
    m = get_model("deepseek-v2-lite")
    every = CostModel(m.name, hw, "fp8", quantization={"method": "fp8", "scope": "all"})
    scoped = CostModel(m.name, hw, "fp8", quantization={"method": "fp8", "scope": "experts"})
    d = m.hidden_size
    dense_layers = m.num_layers - m.num_moe_layers
    rest = (m.num_moe_layers * 3 * d * m.shared_expert_ffn_size + m.num_experts * d * m.num_moe_layers
            + dense_layers * 3 * d * m.dense_ffn_size)
    acc, eff = scoped.accelerator, scoped.params.gemm_compute_efficiency
    bf16_eff = CostModel(m.name, hw, "bf16").params.gemm_compute_efficiency
    per_flop = 1 / (acc.peak_flops("bf16") * bf16_eff) - 1 / (acc.peak_flops("fp8") * eff)
    rows = 512
    lin = lambda cm: cm._stages[0]["linear"]["mlp"]  # noqa: E731
    assert lin(scoped).seconds(rows) - lin(every).seconds(rows) == pytest.approx(
        rows * 2 * rest * per_flop, rel=1e-9)
    assert lin(scoped).flops_per_row == lin(every).flops_per_row


@pytest.mark.parametrize("quant, dtype, model, message", [
    ({"method": "mxfp4", "scope": "attention"}, "fp4", "gpt-oss-20b",
     "'attention' is not a quantization scope; expected one of all, experts"),
    ({"scope": "experts"}, "bf16", "gpt-oss-20b", "needs a quantized dtype"),
    ({"method": "fp8", "scope": "experts"}, "fp8", "llama-3-8b",
     "llama-3-8b is not a mixture of experts"),
])
def test_a_scope_kvpd_cannot_apply_is_refused(quant, dtype, model, message) -> None:
    with pytest.raises(ValueError, match=message):
        CostModel(model, "h100-sxm", dtype, quantization=quant)
    with pytest.raises(ValueError, match=message):
        plan_memory(model, "h100-sxm", dtype=dtype, quantization=quant)


def test_the_scenario_key_and_the_estimate_flag(capsys) -> None:
    sc = scenario_from_dict({"model": "gpt-oss-20b", "hardware": "h100-sxm", "dtype": "fp4",
                             "quantization": EXPERTS})
    assert sc.quantization.to_dict() == EXPERTS
    with pytest.raises(ValueError, match="quantization.scope"):
        scenario_from_dict({"model": "gpt-oss-20b", "hardware": "h100-sxm", "dtype": "fp4",
                            "quantization": {"method": "mxfp4", "scope": "layers"}})
    times = {}
    for scope in ("all", "experts"):
        rc = main(["estimate", "--model", "gpt-oss-20b", "--hardware", "h100-sxm", "--dtype",
                   "fp4", "--quantization", "mxfp4", "--quantization-scope", scope,
                   "--decode", "8x1024", "--json"])
        assert rc == 0
        data = json.loads(capsys.readouterr().out)
        assert data["memory_plan"]["quantization"] == "mxfp4"
        times[scope] = data["step_time_s"]
    assert times["experts"] > times["all"]  # 16-bit attention weights to stream
    assert main(["estimate", "--model", "gpt-oss-20b", "--hardware", "h100-sxm", "--dtype", "fp4",
                 "--quantization-scope", "experts", "--decode", "8x1024"]) == 0
    assert "on the routed experts (the rest 16-bit)" in capsys.readouterr().out


def test_a_catalog_release_is_priced_as_stored_unless_the_scenario_says_otherwise() -> None:
    """gpt-oss's catalog entry carries its config.json quantization_config (MXFP4, attention
    left out): `dtype: fp4` alone prices the release (MXFP4 on the routed experts, not the
    vendor's default NVFP4 on every matrix); a method or scope the scenario names wins; BF16
    weights are BF16."""
    m = get_model("gpt-oss-120b")
    assert (m.checkpoint_quant_method, m.checkpoint_quant_scope) == ("mxfp4", "experts")
    plain = CostModel("gpt-oss-120b", "h100-sxm", "fp4")
    assert (plain.precision.method, plain.precision.scope) == ("mxfp4", "experts")
    assert plain.step_time(decode(4, 1024)) == CostModel(
        "gpt-oss-120b", "h100-sxm", "fp4", quantization=EXPERTS).step_time(decode(4, 1024))
    assert plan_memory("gpt-oss-120b", "h100-sxm", dtype="fp4").weight_bytes_per_gpu == \
        plan_memory("gpt-oss-120b", "h100-sxm", dtype="fp4", quantization=EXPERTS).weight_bytes_per_gpu
    assert CostModel("gpt-oss-120b", "h100-sxm", "fp4",
                     quantization={"scope": "all"}).precision.scope == "all"
    named = CostModel("gpt-oss-120b", "h100-sxm", "nvfp4").precision
    assert (named.method, named.scope) == ("nvfp4", "all")  # another format: not the release
    assert CostModel("gpt-oss-120b", "h100-sxm", "bf16").precision.method is None
    # dense catalog models and MoEs released in 16 bits keep the vendor's default
    assert CostModel("llama-3-8b", "h100-sxm", "fp4").precision.method == "nvfp4"
    assert CostModel("qwen3-30b-a3b", "h100-sxm", "fp4").precision.scope == "all"


@pytest.mark.parametrize("skipped, scope", [
    (["model.layers.*.self_attn", "model.layers.*.mlp.router", "lm_head"], "experts"),
    (["lm_head"], "all"),
    ([], "all"),
])
def test_a_config_json_quantization_config_gives_the_checkpoint_scope(skipped, scope) -> None:
    """A user's config.json: `quantization_config.quant_method` names the method and
    `modules_to_not_convert` naming the attention makes an MoE's scope `experts`."""
    cfg = yaml.safe_load((CATALOG / "models.yaml").read_text())["gpt-oss-20b"]["config"]
    cfg = {**cfg, "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": skipped}}
    m = get_model(cfg)
    assert (m.checkpoint_quant_method, m.checkpoint_quant_scope) == ("mxfp4", scope)
    assert CostModel(cfg, "h100-sxm", "fp4").precision.scope == scope
    cfg["quantization_config"] = {"quant_method": "bitsandbytes"}  # no cost model: as stored
    assert get_model(cfg).checkpoint_quant_method == ""


def test_model_show_names_the_checkpoint_quantization(capsys) -> None:
    assert main(["model", "show", "gpt-oss-20b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["checkpoint_quantization"] == {"method": "mxfp4", "scope": "experts"}
    assert main(["model", "show", "llama-3-8b"]) == 0
    assert "checkpoint_quantization  none in its config" in capsys.readouterr().out


def test_estimate_says_when_the_checkpoint_chose_the_precision(capsys) -> None:
    base = ["estimate", "--model", "gpt-oss-20b", "--hardware", "h100-sxm", "--decode", "4x512"]
    assert main([*base, "--dtype", "fp4", "--json"]) == 0
    prec = json.loads(capsys.readouterr().out)["precision"]
    assert prec["from_checkpoint"] and (prec["quantization"], prec["scope"]) == ("mxfp4", "experts")
    assert main([*base, "--dtype", "fp4", "--quantization", "mxfp4",
                 "--quantization-scope", "experts", "--json"]) == 0
    assert not json.loads(capsys.readouterr().out)["precision"]["from_checkpoint"]
    assert main([*base, "--dtype", "fp4"]) == 0
    assert "precision     as released: mxfp4 on the routed experts" in capsys.readouterr().out


def _int4_scheme(**weights) -> dict:
    """A compressed-tensors quantization_config with one scheme (Kimi-K2.5's by default)."""
    w = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, **weights}
    return {"quant_method": "compressed-tensors",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
                                          "input_activations": None}},
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"]}


@pytest.mark.parametrize("weights, expected", [
    ({}, ("gptq", "experts", 32)),  # Kimi-K2.5 / K2-Thinking: W4A16, groups of 32
    ({"strategy": "channel", "group_size": None}, ("gptq", "experts", -1)),
    ({"num_bits": 8, "type": "float", "strategy": "block"}, ("fp8", "experts", 0)),
    ({"num_bits": 8}, ("", "", 0)),  # 8-bit integer weights: no cost model, priced as stored
])
def test_a_compressed_tensors_checkpoint_gives_method_scope_and_group(weights, expected) -> None:
    cfg = yaml.safe_load((CATALOG / "models.yaml").read_text())["gpt-oss-20b"]["config"]
    cfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
    m = get_model({**cfg, "quantization_config": _int4_scheme(**weights)})
    assert (m.checkpoint_quant_method, m.checkpoint_quant_scope,
            m.checkpoint_quant_group_size) == expected


def test_kimi_k25_int4_is_priced_as_released_in_groups_of_32(capsys) -> None:
    """`dtype: int4` alone prices Kimi-K2.5 as released (GPTQ-style W4A16 in groups of 32 on
    the routed experts); a group size the scenario names wins."""
    released = CostModel("kimi-k2.5", "h200-sxm", "int4", tp=8).precision
    assert (released.method, released.scope, released.group_size) == ("gptq", "experts", 32)
    own = CostModel("kimi-k2.5", "h200-sxm", "int4", tp=8,
                    quantization={"method": "gptq", "group_size": 128}).precision
    assert (own.scope, own.group_size) == ("experts", 128)
    g32 = plan_memory("kimi-k2.5", "h200-sxm", dtype="int4", tp=8).weight_bytes_per_gpu
    g128 = plan_memory("kimi-k2.5", "h200-sxm", dtype="int4", tp=8,
                       quantization={"method": "gptq", "group_size": 128}).weight_bytes_per_gpu
    assert g32 > g128  # a 16-bit scale per 32 weights, not per 128
    assert main(["model", "show", "kimi-k2.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint_quantization"] == {
        "method": "gptq", "scope": "experts", "group_size": 32}
