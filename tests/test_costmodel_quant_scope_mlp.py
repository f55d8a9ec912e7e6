"""`quantization.scope` `mlp` and `mlp_and_o_proj`: NVIDIA's ModelOpt NVFP4 exports of
DeepSeek keep the attention in BF16 (`exclude_modules: model.layers.N.self_attn*`) and quantize
every MLP, the dense layers' and the shared experts' too; the -FP4-v2 exports also quantize
the attention output projection. Each part is checked in the memory plan, in a decode step's
bytes and in the config.json reader, against sizes worked out here from the config fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kvpd.cli import main
from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.costmodel import CostModel
from simulator.cost.memory_plan import plan_memory
from simulator.cost.models import get_model

CATALOG = Path(__file__).resolve().parents[1] / "simulator" / "catalog"
NVFP4_BYTES = 0.5 + 1 / 16  # E2M1 weights plus one FP8 scale per 16
MODEL = "deepseek-v2-lite"  # MLA without a q LoRA, one dense layer, two shared experts


def scoped(scope: str) -> dict:
    return {"method": "nvfp4", "scope": scope}


def attention_weights() -> tuple[int, int]:
    """(q/k/v-side, output) weights of one DeepSeek-V2-Lite attention layer at TP1, from its
    config.json fields: q_proj, kv_a_proj_with_mqa, kv_b_proj; o_proj."""
    c = yaml.safe_load((CATALOG / "models.yaml").read_text())[MODEL]["config"]
    d, h = c["hidden_size"], c["num_attention_heads"]
    q = h * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]) * d
    kv_a = (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * d
    kv_b = h * (c["qk_nope_head_dim"] + c["v_head_dim"]) * c["kv_lora_rank"]
    return q + kv_a + kv_b, d * h * c["v_head_dim"]


def op(cm: CostModel, name: str):
    shape = BatchShape.from_lists([1] * 4, [1024] * 4)
    return next(o for o in explain_step(cm, shape).ops if o.name == name)


@pytest.mark.parametrize("hardware", ["b200", "h100-sxm"])  # W4A4, and weight-only W4A16
def test_the_memory_plan_keeps_the_left_out_attention_in_16_bits(hardware) -> None:
    layers = get_model(MODEL).num_layers
    qkv, o = attention_weights()
    weights = {s: plan_memory(MODEL, hardware, dtype="fp4", quantization=scoped(s))
               .weight_bytes_per_gpu for s in ("all", "mlp", "mlp_and_o_proj", "experts")}
    assert weights["mlp"] - weights["all"] == pytest.approx(
        layers * (qkv + o) * (2 - NVFP4_BYTES), rel=1e-9)
    assert weights["mlp_and_o_proj"] - weights["all"] == pytest.approx(
        layers * qkv * (2 - NVFP4_BYTES), rel=1e-9)
    # scope experts also keeps the dense layer's MLP, the shared experts and the router in 16 bits
    assert weights["experts"] > weights["mlp"]


def test_a_decode_step_streams_each_part_at_its_own_bytes() -> None:
    layers = get_model(MODEL).num_layers
    qkv, o = attention_weights()
    cms = {s: CostModel(MODEL, "b200", "fp4", quantization=scoped(s))
           for s in ("all", "mlp", "mlp_and_o_proj", "experts")}
    assert op(cms["mlp"], "qkv_proj").bytes - op(cms["all"], "qkv_proj").bytes == pytest.approx(
        layers * qkv * (2 - NVFP4_BYTES), rel=1e-9)
    assert op(cms["mlp"], "o_proj").bytes - op(cms["all"], "o_proj").bytes == pytest.approx(
        layers * o * (2 - NVFP4_BYTES), rel=1e-9)
    assert op(cms["mlp_and_o_proj"], "o_proj").bytes == op(cms["all"], "o_proj").bytes
    assert op(cms["mlp_and_o_proj"], "qkv_proj").bytes == op(cms["mlp"], "qkv_proj").bytes
    # the shared experts and the dense layer's MLP: NVFP4 under mlp, 16-bit under experts
    times = {s: cm.step_time(BatchShape.from_lists([1] * 4, [1024] * 4)) for s, cm in cms.items()}
    assert times["all"] < times["mlp_and_o_proj"] < times["mlp"] < times["experts"]


def test_left_out_projections_run_at_the_16_bit_rate_in_a_prefill() -> None:
    """On B200 the quantized GEMMs run on the FP4 units; a compute-bound prefill's o_proj is
    faster under mlp_and_o_proj than under mlp, and its q/k/v the same under both."""
    shape = BatchShape.from_lists([8192], [0])

    def compute(scope: str, name: str) -> float:
        cm = CostModel(MODEL, "b200", "fp4", quantization=scoped(scope))
        return next(o for o in explain_step(cm, shape).ops if o.name == name).compute_s

    assert compute("mlp_and_o_proj", "o_proj") < compute("mlp", "o_proj")
    assert compute("mlp_and_o_proj", "qkv_proj") == pytest.approx(compute("mlp", "qkv_proj"))


def _modelopt(exclude: list[str], algo: str = "NVFP4", nested: bool = False) -> dict:
    """A ModelOpt export's quantization config: flat (config.json's quantization_config) or
    under `quantization` (hf_quant_config.json's layout)."""
    q = {"quant_algo": algo, "kv_cache_quant_algo": None, "group_size": 16,
         "exclude_modules": exclude}
    return {"producer": {"name": "modelopt"}, "quantization": q} if nested else \
        {"quant_method": "modelopt", **q}


# exclude_modules as NVIDIA's exports write them, for layer 1 (the lists name every layer)
V1 = ["model.layers.1.self_attn*", "model.layers.1.mlp.gate", "lm_head", "model.embed_tokens"]
V2 = ["model.layers.1.self_attn.q_a_proj", "model.layers.1.self_attn.q_b_proj",
      "model.layers.1.self_attn.kv_a_proj_with_mqa", "model.layers.1.self_attn.kv_b_proj",
      "model.layers.1.mlp.gate", "lm_head"]
GATES_ONLY = ["model.layers.1.mlp.gate", "lm_head"]


@pytest.mark.parametrize("exclude, algo, nested, expected", [
    (V1, "NVFP4", False, ("nvfp4", "mlp")),  # DeepSeek-V3-0324-NVFP4, DeepSeek-R1-0528-FP4
    (V1, "NVFP4", True, ("nvfp4", "mlp")),
    (V2, "NVFP4", False, ("nvfp4", "mlp_and_o_proj")),  # DeepSeek-R1-0528-FP4-v2
    (GATES_ONLY, "NVFP4", False, ("nvfp4", "all")),  # Qwen3-30B-A3B-NVFP4: attention too
    (V1, "FP8", False, ("fp8", "mlp")),
    (V1, "W4A8_AWQ", False, ("", "")),  # no cost model: priced as stored
])
def test_a_modelopt_export_gives_its_method_and_scope(exclude, algo, nested, expected) -> None:
    cfg = yaml.safe_load((CATALOG / "models.yaml").read_text())[MODEL]["config"]
    m = get_model({**cfg, "quantization_config": _modelopt(exclude, algo, nested)})
    assert (m.checkpoint_quant_method, m.checkpoint_quant_scope) == expected


def test_a_dense_model_with_its_attention_left_out_is_scope_mlp() -> None:
    cfg = yaml.safe_load((CATALOG / "models.yaml").read_text())["llama-3-8b"]["config"]
    m = get_model({**cfg, "quantization_config": _modelopt(["model.layers.0.self_attn*"])})
    assert (m.checkpoint_quant_method, m.checkpoint_quant_scope) == ("nvfp4", "mlp")
    assert CostModel(m, "b200", "fp4").precision.scope == "mlp"


def test_the_scenario_key_the_estimate_flag_and_a_bad_scope(capsys) -> None:
    rc = main(["estimate", "--model", MODEL, "--hardware", "b200", "--dtype", "fp4",
               "--quantization-scope", "mlp_and_o_proj", "--decode", "4x1024"])
    assert rc == 0
    assert "on the MLPs, experts and attention output (q/k/v 16-bit)" in capsys.readouterr().out
    rc = main(["estimate", "--model", MODEL, "--hardware", "b200", "--dtype", "fp4",
               "--quantization-scope", "mlp", "--decode", "4x1024", "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["precision"]["scope"] == "mlp"
    with pytest.raises(ValueError, match="expected one of all, experts, mlp, mlp_and_o_proj"):
        CostModel(MODEL, "b200", "fp4", quantization=scoped("attention"))


@pytest.mark.parametrize("name, scope", [
    ("nvidia/DeepSeek-R1-0528-FP4", "mlp"), ("nvidia/DeepSeek-R1-FP4", "mlp"),
    ("nvidia/DeepSeek-R1-0528-FP4-v2", "mlp_and_o_proj"), ("nvidia/DeepSeek-R1-FP4-v2",
                                                           "mlp_and_o_proj"),
])
def test_nvidias_deepseek_fp4_exports_are_priced_as_released(name, scope) -> None:
    """The catalog's ModelOpt exports have DeepSeek-V3's shapes and their own checkpoint scope:
    `dtype: fp4` alone prices them as stored; FP8 weights are the FP8 recipe on every matrix."""
    m, base = get_model(name), get_model("deepseek-v3")
    assert (m.num_params, m.kv_bytes_per_token("bf16")) == (base.num_params,
                                                             base.kv_bytes_per_token("bf16"))
    assert (m.checkpoint_quant_method, m.checkpoint_quant_scope) == ("nvfp4", scope)
    prec = CostModel(name, "b200", "fp4", tp=8).precision
    assert (prec.method, prec.scope) == ("nvfp4", scope)
    assert CostModel(name, "b200", "fp8", tp=8).precision.scope == "all"


def test_a_model_folder_with_hf_quant_config_json_is_read_as_released(tmp_path) -> None:
    """A ModelOpt export keeps its quantization in hf_quant_config.json beside config.json
    (nested under `quantization`): a model folder is priced with it, as vLLM reads it; a
    config.json's own quantization_config wins; a broken file is refused naming it."""
    cfg = yaml.safe_load((CATALOG / "models.yaml").read_text())[MODEL]["config"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert get_model(str(tmp_path)).checkpoint_quant_method == ""
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(_modelopt(V2, nested=True)))
    m = get_model(str(tmp_path))
    assert (m.checkpoint_quant_method, m.checkpoint_quant_scope) == ("nvfp4", "mlp_and_o_proj")
    assert get_model(str(tmp_path / "config.json")).checkpoint_quant_scope == "mlp_and_o_proj"
    own = {**cfg, "quantization_config": _modelopt(V1)}
    (tmp_path / "config.json").write_text(json.dumps(own))
    assert get_model(str(tmp_path)).checkpoint_quant_scope == "mlp"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "hf_quant_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="hf_quant_config.json: expected a JSON object"):
        get_model(str(tmp_path))


def test_a_multimodal_release_keeps_the_quantization_config_beside_its_text_config() -> None:
    """A multimodal release's config.json can carry its quantization_config at the top,
    beside text_config: it covers the text model kvpd prices."""
    entry = yaml.safe_load((CATALOG / "models.yaml").read_text())
    name = next(k for k, v in entry.items() if "text_config" in str(v.get("source", ""))
                and v["config"].get("architectures", [""])[0].endswith("ConditionalGeneration"))
    text = dict(entry[name]["config"])
    arch = text.pop("architectures")
    cfg = {"architectures": arch, "text_config": text,
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    m = get_model(cfg)
    assert (m.checkpoint_quant_method, m.checkpoint_quant_scope) == ("fp8", "all")
    assert m.num_params == get_model(name).num_params
