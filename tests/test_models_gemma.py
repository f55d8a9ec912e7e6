"""Gemma 2 and Gemma 3 (text) from their HF configs: parameter counts and local/global layers
as `transformers` builds them from the same config, the sandwich norms' kernels, the windows'
lighter decode reads, and the config errors."""

from __future__ import annotations

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.catalog_file import read_catalog
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_accelerator
from simulator.cost.kernels import kernel_profile
from simulator.cost.models import ModelSpec, get_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

GEMMA3 = ["gemma-3-1b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b"]


def _text_config(name: str) -> dict:
    cfg = read_catalog("models.yaml")[name]["config"]
    return dict(cfg.get("text_config", cfg))


def _built_by_transformers(name: str, model_type: str):
    """(kvpd's spec, transformers' config and its model on the meta device) of a catalog entry."""
    text = {k: v for k, v in _text_config(name).items() if k != "architectures"}
    hf_cfg = transformers.AutoConfig.for_model(model_type, **text)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    spec = get_model(name)
    assert spec.num_params == model.num_parameters()
    assert spec.num_sliding_layers == hf_cfg.layer_types.count("sliding_attention")
    assert spec.sliding_window == hf_cfg.sliding_window
    return spec


@pytest.mark.parametrize("name", GEMMA3)
def test_catalog_entries_count_what_transformers_builds(name: str) -> None:
    """The text model transformers builds from the entry's (text) config has kvpd's parameter
    count, and its layer_types (derived from sliding_window_pattern) kvpd's sliding layers."""
    spec = _built_by_transformers(name, "gemma3_text")
    assert spec.tie_word_embeddings and spec.qk_norm and spec.sandwich_norms


@pytest.mark.parametrize("name", ["gemma-2-2b", "gemma-2-9b", "gemma-2-27b"])
def test_gemma2_entries_count_what_transformers_builds(name: str) -> None:
    """Gemma 2: local and global layers alternate (sliding first, as Gemma2Config derives
    them), sandwich norms, tied embeddings; HF's published sizes 2.61B, 9.24B, 27.2B."""
    spec = _built_by_transformers(name, "gemma2")
    assert spec.sandwich_norms and spec.tie_word_embeddings and not spec.qk_norm
    published = {"gemma-2-2b": 2.61e9, "gemma-2-9b": 9.24e9, "gemma-2-27b": 27.2e9}[name]
    assert spec.num_params == pytest.approx(published, rel=0.005)


def test_published_sizes_and_global_layers() -> None:
    """Google's Gemma 3 report: 1B, 4B, 12B, 27B (the larger three with a ~0.4B SigLIP encoder,
    not priced here); one global layer in six."""
    sizes = {"gemma-3-1b": 1.0e9, "gemma-3-4b": 3.9e9, "gemma-3-12b": 11.8e9, "gemma-3-27b": 27.0e9}
    for name, params in sizes.items():
        m = get_model(name)
        assert m.num_params == pytest.approx(params, rel=0.03)
        assert m.num_layers - m.num_sliding_layers == m.num_layers // 6


def test_sandwich_norms_add_two_kernels_to_each_layer() -> None:
    prof = kernel_profile(get_accelerator("h100-sxm"))
    gemma = get_model("gemma-3-27b")
    plain = ModelSpec(**{**{k: getattr(gemma, k) for k in ModelSpec.__dataclass_fields__},
                         "sandwich_norms": False})
    assert prof.layer_kernels(gemma, False) == prof.layer_kernels(plain, False) + 2
    assert gemma.small_params - plain.small_params == 2 * gemma.num_layers * gemma.hidden_size


def test_local_layers_make_long_context_decode_cheaper() -> None:
    """At 32k tokens of context, 52 of 62 layers read 1,024 keys: far fewer KV bytes than
    the same model with every layer global."""
    gemma = get_model("gemma-3-27b")
    dense = ModelSpec(**{**{k: getattr(gemma, k) for k in ModelSpec.__dataclass_fields__},
                         "sliding_window": 0, "num_sliding_layers": 0})
    t_local = CostModel(gemma, "h200-sxm").step_time(
        BatchShape.from_lists([1] * 16, [32_000] * 16, window=gemma.sliding_window))
    t_global = CostModel(dense, "h200-sxm").step_time(
        BatchShape.from_lists([1] * 16, [32_000] * 16))
    assert t_local < 0.75 * t_global


def test_the_text_model_type_alone_and_the_multimodal_wrapper_both_read() -> None:
    text = {"model_type": "gemma3_text", "num_hidden_layers": 12, "hidden_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "intermediate_size": 96, "vocab_size": 320, "sliding_window": 32}
    a = ModelSpec.from_hf_config(text)
    b = ModelSpec.from_hf_config({"architectures": ["Gemma3ForConditionalGeneration"],
                                  "text_config": text})
    assert a.num_params == b.num_params and a.num_sliding_layers == b.num_sliding_layers == 10
    assert ModelSpec.from_hf_config({**text, "sliding_window_pattern": 3}).num_sliding_layers == 8
    with pytest.raises(ValueError, match="'sliding_window_pattern' must be a positive integer"):
        ModelSpec.from_hf_config({**text, "sliding_window_pattern": 0})
    with pytest.raises(ValueError, match="field 'layer_types' must list 12 entries"):
        ModelSpec.from_hf_config({**text, "layer_types": ["sliding_attention"] * 3})
