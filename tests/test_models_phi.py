"""Phi-3 / Phi-4 (Phi3ForCausalLM: fused QKV and gate/up projections) from their HF configs."""

from __future__ import annotations

import pytest

from simulator.cost.models import ModelSpec, get_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_phi4_entries_count_the_published_checkpoints() -> None:
    """Phi-4-mini-instruct's safetensors hold 3,836,021,760 parameters (its tied embeddings
    counted once); Phi-4's 14.66B equal what transformers builds from the same config."""
    assert get_model("microsoft/Phi-4-mini-instruct").num_params == 3_836_021_760
    spec = get_model("phi-4")
    cfg = transformers.AutoConfig.for_model(
        "phi3", num_hidden_layers=40, hidden_size=5120, num_attention_heads=40,
        num_key_value_heads=10, intermediate_size=17920, vocab_size=100352,
        max_position_embeddings=16384, tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert spec.num_params == model.num_parameters() == 14_659_507_200


def test_a_window_no_prompt_reaches_is_no_window() -> None:
    """Phi-4-mini states a 262,144-token window over 131,072 positions: no layer slides. A
    window inside the context (Phi-3-mini-4k's 2,047 of 4,096) slides every layer, as HF's
    Phi3Attention applies it."""
    assert get_model("phi-4-mini").sliding_window == 0
    mini = {"architectures": ["Phi3ForCausalLM"], "num_hidden_layers": 32, "hidden_size": 3072,
            "num_attention_heads": 32, "intermediate_size": 8192, "vocab_size": 32064,
            "max_position_embeddings": 4096, "sliding_window": 2047}
    m = ModelSpec.from_hf_config(mini)
    assert (m.sliding_window, m.num_sliding_layers) == (2047, 32)
    m = ModelSpec.from_hf_config({**mini, "sliding_window": 4096})
    assert (m.sliding_window, m.num_sliding_layers) == (0, 0)


def test_an_unknown_model_lists_catalog_names_not_every_alias() -> None:
    with pytest.raises(ValueError) as err:
        get_model("zzz-no-such-model")
    msg = str(err.value)
    assert "phi-4-mini" in msg and "gemma-3-27b" in msg and "kvpd model list" in msg
    assert "microsoft/phi-4-mini-instruct" not in msg.lower()
