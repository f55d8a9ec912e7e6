"""MoE, MLA and sliding-window model specs from HF configs: parameter counts equal the
`transformers` implementation's, KV bytes follow from the latent, bad configs are refused."""

from __future__ import annotations

import pytest

from simulator.cost.models import ModelSpec, get_model

NEW = ["mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b",
       "deepseek-v2-lite", "deepseek-v3", "mistral-7b", "glm-4.5-air", "glm-4.6"]
# and entries whose small parameters are their family's own (gpt-oss's biases and sink logits,
# MiniMax-M2's q/k norms across the heads)
COUNTED = [*NEW, "gpt-oss-120b", "gpt-oss-20b", "minimax-m2.5", "glm-4.7-flash",
           "ernie-4.5-21b-a3b", "phi-3.5-moe", "glm-4.5"]


def _catalog_config(name: str) -> dict:
    from simulator.cost.models import _catalog
    return dict(_catalog()[name]["config"])


@pytest.mark.parametrize("name", COUNTED)
def test_param_count_equals_transformers(name):
    """Built on the meta device (no memory) from the catalog's config: every parameter HF
    creates is counted, and no other."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = _catalog_config(name)
    cfg.pop("quantization_config", None)  # counted as parameters, however they are stored
    arch = cfg.pop("architectures")[0]
    model_type = {"MixtralForCausalLM": "mixtral", "Qwen3MoeForCausalLM": "qwen3_moe",
                  "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
                  "MistralForCausalLM": "mistral", "Glm4MoeForCausalLM": "glm4_moe",
                  "GptOssForCausalLM": "gpt_oss", "MiniMaxM2ForCausalLM": "minimax_m2",
                  "Glm4MoeLiteForCausalLM": "glm4_moe_lite",
                  "Ernie4_5_MoeForCausalLM": "ernie4_5_moe", "PhimoeForCausalLM": "phimoe"}[arch]
    hf_cfg = transformers.AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    assert get_model(name).num_params == sum(p.numel() for p in hf.parameters())


def test_published_sizes():
    # totals the model cards state: Qwen3-30B-A3B 30.5B / 3.3B active, DeepSeek-V3 671B / 37B
    q = get_model("qwen3-30b-a3b")
    assert round(q.num_params / 1e9, 1) == 30.5 and round(q.num_active_params / 1e9, 1) == 3.4
    v3 = get_model("deepseek-v3")
    assert round(v3.num_params / 1e9) == 671 and 37 <= v3.num_active_params / 1e9 < 38
    assert v3.num_dense_layers == 3 and v3.num_moe_layers == 58
    assert v3.num_shared_experts == 1 and v3.shared_expert_ffn_size == 2048
    # Moonshot's Kimi K2 card: 1T total, 32B activated (DeepSeek-V3's architecture with 384
    # experts and 64 heads); Qwen3-Coder-480B-A35B: 480B total, 35B activated
    k2 = get_model("moonshotai/Kimi-K2-Instruct")
    assert 1.00e12 < k2.num_params < 1.05e12 and round(k2.num_active_params / 1e9) in (32, 33)
    assert (k2.num_dense_layers, k2.num_experts) == (1, 384)
    assert k2.kv_bytes_per_token("bf16") == 61 * 576 * 2
    assert get_model("kimi-k2-0905").max_position_embeddings == 262144
    coder = get_model("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8")
    assert round(coder.num_params / 1e9) == 480 and round(coder.num_active_params / 1e9) == 35


def test_mla_kv_bytes_are_the_latent():
    v3 = get_model("deepseek-v3")
    assert v3.is_mla and v3.head_dim == 192
    # 61 layers x (512 latent + 64 rope) x 2 bytes = 70,272 bytes/token, vs 2 x 128 heads x
    # 192 x 61 x 2 = 5.99 MB had K and V of every head been cached
    assert v3.kv_bytes_per_token("bf16") == 61 * 576 * 2
    assert get_model("deepseek-v2-lite").kv_bytes_per_token("fp8") == 27 * 576


def test_sliding_window_layers_and_attention_flops():
    m = get_model("mistral-7b")
    assert (m.sliding_window, m.num_sliding_layers) == (4096, 32)
    assert m.attention_flops_per_token(10_000) == m.attention_flops_per_token(4096)
    assert m.attention_flops_per_token(100) < m.attention_flops_per_token(4096)
    mixed = {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 4, "hidden_size": 64,
             "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
             "use_sliding_window": True, "sliding_window": 8,
             "layer_types": ["sliding_attention", "full_attention"] * 2}
    s = ModelSpec.from_hf_config(mixed)
    assert (s.sliding_window, s.num_sliding_layers) == (8, 2)
    assert ModelSpec.from_hf_config({**mixed, "use_sliding_window": False}).sliding_window == 0


@pytest.mark.parametrize("name,field", [("qwen3-30b-a3b", "moe_intermediate_size"),
                                        ("qwen3-30b-a3b", "num_experts"),
                                        ("deepseek-v3", "n_routed_experts"),
                                        ("deepseek-v3", "kv_lora_rank"),
                                        ("glm-4.6", "head_dim"),
                                        ("glm-4.5-air", "n_routed_experts"),
                                        ("mixtral-8x22b", "num_experts_per_tok")])
def test_moe_config_missing_a_field_is_refused_naming_it(name, field):
    cfg = _catalog_config(name)
    del cfg[field]
    with pytest.raises(ValueError, match=f"missing field '{field}'"):
        ModelSpec.from_hf_config(cfg)


def test_more_experts_per_token_than_experts_is_refused():
    cfg = {**_catalog_config("qwen3-30b-a3b"), "num_experts_per_tok": 200}
    with pytest.raises(ValueError, match="num_experts_per_tok=200 exceeds the 128 experts"):
        ModelSpec.from_hf_config(cfg)


def test_every_new_entry_names_its_config_source():
    from simulator.cost.models import _catalog
    for name in NEW:
        entry = _catalog()[name]
        assert entry["source"] == f"https://huggingface.co/{entry['hf_id']}/blob/main/config.json"
