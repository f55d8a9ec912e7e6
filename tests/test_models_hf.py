"""`ModelSpec.from_hf_config` against the `transformers` implementations themselves: the
parameter count of each supported family equals `model.num_parameters()` of the model that
transformers builds from the same config.json (on the meta device: no memory, no weights)."""

from __future__ import annotations

import pytest

from simulator.cost.models import ModelSpec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 8,
         "intermediate_size": 96, "vocab_size": 320, "max_position_embeddings": 128}
CONFIGS = [
    {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **SMALL,
     "num_key_value_heads": 2, "tie_word_embeddings": False},
    {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **SMALL,
     "num_key_value_heads": 4, "tie_word_embeddings": True, "attention_bias": True,
     "mlp_bias": True},
    {"architectures": ["MistralForCausalLM"], "model_type": "mistral", **SMALL,
     "num_key_value_heads": 2, "tie_word_embeddings": False},
    {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **SMALL,
     "num_key_value_heads": 2, "tie_word_embeddings": True},
    {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", **SMALL,
     "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
     "tie_word_embeddings": False},
    {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 3, "n_embd": 64,
     "n_head": 8, "n_inner": None, "vocab_size": 320, "n_positions": 128},
    {"architectures": ["OPTForCausalLM"], "model_type": "opt", "num_hidden_layers": 3,
     "hidden_size": 64, "num_attention_heads": 8, "ffn_dim": 96, "vocab_size": 320,
     "max_position_embeddings": 128, "word_embed_proj_dim": 64},
    {"architectures": ["OPTForCausalLM"], "model_type": "opt", "num_hidden_layers": 3,
     "hidden_size": 64, "num_attention_heads": 8, "ffn_dim": 96, "vocab_size": 320,
     "max_position_embeddings": 128, "word_embed_proj_dim": 32},  # OPT-350m-style projections
    {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", **SMALL,
     "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 16},  # tied, sandwich norms
    {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", **SMALL,
     "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 16},  # tied, sandwich norms
    {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", **SMALL,  # fused projections
     "num_key_value_heads": 2, "partial_rotary_factor": 0.75, "tie_word_embeddings": True,
     "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c["architectures"][0] + str(len(c)))
def test_param_count_equals_transformers(cfg: dict) -> None:
    hf_cfg = transformers.AutoConfig.for_model(cfg["model_type"], **{
        k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    spec = ModelSpec.from_hf_config(cfg)
    assert spec.num_params == model.num_parameters()
    assert spec.kv_bytes_per_token("bf16") == (
        2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2)
