"""Model catalog and config.json parsing: shapes, derived sizes, bad input."""

from __future__ import annotations

import json

import pytest

from simulator.cost.dtypes import dtype_bytes
from simulator.cost.hf_config import SUPPORTED_ARCHITECTURES
from simulator.cost.models import ModelSpec, get_model, list_models

REQUIRED_MODELS = ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b",
                   "llama-3.1-405b", "mistral-7b", "mixtral-8x7b", "qwen2.5-7b", "qwen2.5-72b",
                   "gpt2", "opt-13b", "opt-66b"]

# KV bytes per token at fp16 from reference/hardware-and-models.md section 2 (each model's
# config.json): 2 x layers x KV heads x head_dim x 2 bytes.
REFERENCE_KV_BYTES_FP16 = {
    "llama-2-7b": 524_288, "llama-2-13b": 819_200, "llama-2-70b": 327_680,
    "llama-3-8b": 131_072, "llama-3-70b": 327_680, "llama-3.1-405b": 516_096,
    "mistral-7b": 131_072, "mixtral-8x7b": 131_072, "qwen2.5-7b": 57_344,
    "qwen2.5-72b": 327_680, "gpt2": 36_864, "opt-13b": 819_200, "opt-66b": 2_359_296,
}

# Parameter counts published by the model cards / `model.num_parameters()` of transformers.
PUBLISHED_PARAMS = {
    "gpt2": 124_439_808,  # GPT-2 small, transformers GPT2LMHeadModel.num_parameters()
    "llama-2-7b": 6_738_415_616,  # Llama-2-7b-hf
    "llama-3-8b": 8_030_261_248,  # Meta-Llama-3-8B ("8.03B" on the model card)
    "mistral-7b": 7_241_732_096,  # Mistral-7B-v0.1 ("7.24B")
    "mixtral-8x7b": 46_702_792_704,  # Mixtral-8x7B-v0.1 ("46.7B")
    "qwen2.5-7b": 7_615_616_512,  # Qwen2.5-7B model card: 7.61B
    "llama-3.1-405b": 405_853_388_800,  # Llama-3.1-405B ("405.85B")
}


def test_catalog_has_every_required_model() -> None:
    assert set(REQUIRED_MODELS) <= set(list_models())


@pytest.mark.parametrize("name", REQUIRED_MODELS)
def test_kv_bytes_per_token_is_the_gqa_formula(name: str) -> None:
    m = get_model(name)
    for dt in ("fp32", "bf16", "fp16", "fp8"):
        assert m.kv_bytes_per_token(dt) == 2 * m.num_layers * m.num_kv_heads * m.head_dim * dtype_bytes(dt)
    assert m.kv_bytes_per_token("fp16") == REFERENCE_KV_BYTES_FP16[name]


@pytest.mark.parametrize("name, params", sorted(PUBLISHED_PARAMS.items()))
def test_parameter_counts_match_published_figures(name: str, params: int) -> None:
    assert get_model(name).num_params == params


def test_reference_shapes() -> None:
    """Shapes from reference/hardware-and-models.md section 2."""
    m = get_model("qwen2.5-7b")
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim,
            m.ffn_size, m.vocab_size) == (28, 3584, 28, 4, 128, 18944, 152064)
    mx = get_model("mixtral-8x7b")
    assert mx.is_moe and (mx.num_experts, mx.experts_per_token) == (8, 2)
    assert mx.num_active_params < mx.num_params / 3
    assert get_model("gpt2").tie_word_embeddings and not get_model("llama-3-8b").tie_word_embeddings


@pytest.mark.parametrize("name", REQUIRED_MODELS)
def test_weight_bytes_shrink_with_the_dtype(name: str) -> None:
    m = get_model(name)
    w = {dt: m.weight_bytes(dt) for dt in ("fp32", "bf16", "fp16", "fp8", "int4")}
    assert w["fp32"] == 2 * w["bf16"] and w["bf16"] == w["fp16"] == 2 * m.num_params
    assert w["bf16"] > w["fp8"] > w["int4"] > m.num_params * 0.5


def test_flops_per_token_is_twice_the_matrix_weights() -> None:
    m = get_model("llama-3-8b")
    # every parameter but the input embedding table and the norms is a matrix used once
    non_matrix = m.vocab_size * m.hidden_size + (2 * m.num_layers + 1) * m.hidden_size
    assert m.flops_per_token == 2 * (m.num_params - non_matrix)
    assert m.attention_flops_per_token(1000) == 4 * 32 * 32 * 128 * 1000


def test_catalog_lookup_by_alias_hf_id_and_case() -> None:
    assert get_model("Llama-3-8B").name == "llama-3-8b"
    assert get_model("meta-llama/Meta-Llama-3-8B").name == "llama-3-8b"
    assert get_model("mixtral").name == "mixtral-8x7b"


def test_unknown_model_lists_close_matches() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'llama-3-7b'.*llama-3-8b"):
        get_model("llama-3-7b")
    with pytest.raises(ValueError, match=r"qwen2.5-7b"):
        get_model("qwen-2.5-7b")


def test_dtype_bytes() -> None:
    assert [dtype_bytes(d) for d in ("fp32", "bf16", "fp16", "fp8", "int4")] == [4, 2, 2, 1, 0.5]
    assert dtype_bytes("bfloat16") == 2
    with pytest.raises(ValueError, match="expected one of"):
        dtype_bytes("int3")


# ---- config.json files, one per supported family ----
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
         "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False}
FAMILY_CONFIGS = {
    "llama": LLAMA,
    "mistral": {**LLAMA, "architectures": ["MistralForCausalLM"], "vocab_size": 32000,
                "sliding_window": 4096, "max_position_embeddings": 32768},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584,
              "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
              "intermediate_size": 18944, "vocab_size": 152064,
              "max_position_embeddings": 131072, "tie_word_embeddings": False},
    "mixtral": {**LLAMA, "architectures": ["MixtralForCausalLM"], "vocab_size": 32000,
                "num_local_experts": 8, "num_experts_per_tok": 2},
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "n_layer": 12, "n_embd": 768, "n_head": 12,
             "n_inner": None, "vocab_size": 50257, "n_positions": 1024},
    "opt": {"architectures": ["OPTForCausalLM"], "num_hidden_layers": 40, "hidden_size": 5120,
            "num_attention_heads": 40, "ffn_dim": 20480, "vocab_size": 50272,
            "max_position_embeddings": 2048, "word_embed_proj_dim": 5120},
}
EXPECTED_FROM_CATALOG = {"llama": "llama-3-8b", "mistral": "mistral-7b", "qwen2": "qwen2.5-7b",
                         "mixtral": "mixtral-8x7b", "gpt2": "gpt2", "opt": "opt-13b"}


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_config_json_of_each_family_loads_like_the_catalog(tmp_path, family: str) -> None:
    model_dir = tmp_path / f"my-{family}"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(FAMILY_CONFIGS[family]))
    from_dir = get_model(str(model_dir))
    from_file = get_model(str(model_dir / "config.json"))
    catalog = get_model(EXPECTED_FROM_CATALOG[family])
    assert from_dir.name == f"my-{family}"
    for m in (from_dir, from_file, ModelSpec.from_hf_config(FAMILY_CONFIGS[family])):
        assert m.num_params == catalog.num_params
        assert m.kv_bytes_per_token("bf16") == catalog.kv_bytes_per_token("bf16")
        assert m.architecture == FAMILY_CONFIGS[family]["architectures"][0]


def test_a_config_file_of_another_name_is_named_by_its_stem(tmp_path) -> None:
    """A checkpoint's config.json takes its folder's name; any other file its own stem (it
    took the folder's, so /tmp/glm52.json was called "tmp")."""
    (tmp_path / "glm52.json").write_text(json.dumps(LLAMA))
    assert get_model(str(tmp_path / "glm52.json")).name == "glm52"


def test_model_type_is_enough_without_architectures() -> None:
    cfg = {k: v for k, v in LLAMA.items() if k != "architectures"} | {"model_type": "llama"}
    assert ModelSpec.from_hf_config(cfg).num_params == get_model("llama-3-8b").num_params


def test_unsupported_architecture_lists_the_supported_ones(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["FalconForCausalLM"], "hidden_size": 4544}))
    with pytest.raises(ValueError, match=r"unsupported architectures \['FalconForCausalLM'\]") as e:
        get_model(str(path))
    for arch in SUPPORTED_ARCHITECTURES:
        assert arch in str(e.value)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("change, message", [
    ({"num_hidden_layers": None}, "missing field 'num_hidden_layers'"),
    ({"hidden_size": "4096"}, "'hidden_size' must be a positive integer"),
    ({"num_key_value_heads": 5}, "must divide num_attention_heads"),
])
def test_bad_config_fields_are_named(change: dict, message: str) -> None:
    cfg = {**LLAMA, **change}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_hf_config(cfg)


@pytest.mark.parametrize("family, change, message", [
    # found by a fuzz of mutated catalog configs: each crashed with a TypeError or a
    # ZeroDivisionError before it was named
    ("llama", {"architectures": True}, "field 'architectures' must be a list of class names"),
    ("llama", {"hidden_size": 1}, "hidden_size=1 is smaller than num_attention_heads=32"),
    ("gpt2", {"n_head": 1024}, "n_embd=768 is smaller than n_head=1024"),
    ("mixtral", {"num_hidden_layers": 0.5}, "'num_hidden_layers' must be a positive integer"),
    ("mistral", {"layer_types": 2}, "field 'layer_types' must be a list of strs"),
    ("mistral", {"layer_types": [[]] * 32}, "field 'layer_types' must be a list of strs"),
])
def test_malformed_config_fields_are_named_not_crashed_on(family: str, change: dict,
                                                          message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_hf_config({**FAMILY_CONFIGS[family], **change})


def test_invalid_json_names_the_file_and_line(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "hidden_size": 4096,\n  oops\n}')
    with pytest.raises(ValueError, match=r"config.json: not valid JSON \(line 3\)"):
        get_model(str(path))


def test_a_folder_without_a_config_or_a_binary_config_is_named(tmp_path) -> None:
    """(before: "[Errno 2] No such file or directory: '.../config.json'" and a bare
    UnicodeDecodeError naming no file)"""
    with pytest.raises(FileNotFoundError, match=r"a model folder holds a config.json; this "
                                                r"one has none"):
        get_model(str(tmp_path))
    (tmp_path / "config.json").write_bytes(b"\xff\xfe{}")
    for where in (tmp_path, tmp_path / "config.json"):
        with pytest.raises(ValueError, match=r"config.json: not a JSON text file"):
            get_model(str(where))


def test_release_names_resolve_to_their_architecture_and_no_alias_is_shared():
    """Instruct/chat fine-tunes and FP8 / FP4 exports with the base model's config.json shapes
    are aliases of its entry; an alias names one entry only."""
    from importlib import resources

    import yaml

    catalog = yaml.safe_load(resources.files("simulator").joinpath("catalog", "models.yaml").read_text())
    owner: dict[str, str] = {}
    for name, entry in catalog.items():
        for alias in entry.get("aliases") or ():
            key = alias.lower()
            assert key not in owner, f"{alias} is an alias of {owner.get(key)} and {name}"
            owner[key] = name
            assert get_model(alias).name == name
    assert get_model("meta-llama/Llama-3.1-70B-Instruct").name == "llama-3.1-70b"
    assert get_model("mistralai/Mixtral-8x7B-Instruct-v0.1").name == "mixtral-8x7b"
    # NVIDIA's ModelOpt FP4 exports (the names of NVIDIA's own FP4 benchmark rows)
    assert get_model("nvidia/DeepSeek-R1-0528-FP4-v2").name == "deepseek-r1-fp4-v2"
    assert get_model("nvidia/Llama-3.3-70B-Instruct-FP4").name == "llama-3.3-70b"
    # an instruct release with another context is its own entry, the base's shapes merged in
    base, instruct = get_model("Qwen/Qwen2.5-72B"), get_model("Qwen/Qwen2.5-72B-Instruct")
    assert (base.max_position_embeddings, instruct.max_position_embeddings) == (131_072, 32_768)
    assert instruct.num_params == base.num_params
    first, release = get_model("Qwen/Qwen3-30B-A3B"), get_model("Qwen/Qwen3-30B-A3B-Thinking-2507")
    assert (first.max_position_embeddings, release.max_position_embeddings) == (40_960, 262_144)
    assert release.name == "qwen3-30b-a3b-2507" and release.num_params == first.num_params
    # Mistral-7B: v0.1 slides a 4,096-token window on every layer, v0.2 and v0.3 do not
    v1, v2 = get_model("mistralai/Mistral-7B-Instruct-v0.1"), get_model("mistralai/Mistral-7B-Instruct-v0.2")
    assert (v1.sliding_window, v1.num_sliding_layers) == (4096, 32) and v2.num_sliding_layers == 0
    assert get_model("mistralai/Mistral-7B-Instruct-v0.3").vocab_size == 32768
