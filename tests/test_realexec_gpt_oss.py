"""gpt-oss in the real paged executor: what differs from Mixtral (attention sinks, sliding and
full layers in one model, q/k/v/o and expert biases, the biased top-k router, YaRN rope) gives
HF's own output. The correctness matrix (mixed batch, shared prefix, small token budget,
preemption, n > 1) runs `tiny-gpt-oss` with the other families (test_realexec_correctness.py)."""

from __future__ import annotations

import json

import pytest
import torch

from realexec import LLM, SamplingParams
from realexec.engine.configs import builtin_config
from realexec.engine.hf_reference import hf_greedy
from realexec.engine.model_loader import REQUIRED_FIELDS, load_model
from realexec.engine.paged_model import PagedCausalLM
from realexec.engine.simple_attention import ContiguousKVAttention, NoCacheAttention
from realexec.engine.sinks import sdpa_with_sinks
from tests.realexec_reference import (
    assert_pool_whole,
    one_thread,  # noqa: F401  (fixture)
    random_prompts,
)

pytestmark = pytest.mark.usefixtures("one_thread")
NAME = "tiny-gpt-oss"


def _with_random_biases(dtype: str = "fp32"):
    """tiny-gpt-oss with every bias (q/k/v/o, router, experts' gate_up and down) seeded random:
    HF initialises the attention and expert biases to zero, which would hide a dropped one."""
    loaded = load_model(NAME, dtype=dtype, device="cpu", seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in loaded.model.named_parameters():
            if name.endswith("bias"):
                p.copy_((torch.randn(p.shape, generator=g) * 0.3).to(p.dtype))
    return loaded


def test_layers_alternate_windows_and_keep_every_block():
    """Sliding layers (window 10) alternate with full ones; the full layers read every block,
    so none is freed although prompts are up to 9x the window, and output equals HF's."""
    loaded = _with_random_biases()
    llm = LLM(loaded, num_gpu_blocks=96, block_size=4, max_num_batched_tokens=16)
    assert llm.model.windows == [10, None, 10, None]
    kvm = llm.kv_cache_manager
    assert kvm.sliding_window == 0 and llm.scheduler.cache_config.sliding_window == 10
    assert not llm.scheduler.cache_config.free_outside_window
    prompts = random_prompts(11, [7, 23, 57, 90])
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=14))
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_greedy(loaded.model, p, 14), f"prompt of {len(p)} tokens"
    assert kvm.num_slid_out_blocks == 0
    assert_pool_whole(llm)


def test_biases_router_and_yarn_are_the_models_own():
    """The config's rope_scaling (YaRN) drives the rotary; every bias is non-zero and used."""
    loaded = _with_random_biases()
    rot = loaded.model.model.rotary_emb
    assert rot.rope_type == "yarn" and rot.attention_scaling != 1.0
    sa = loaded.model.model.layers[0].self_attn
    assert all(m.bias is not None and m.bias.abs().sum() > 0
               for m in (sa.q_proj, sa.k_proj, sa.v_proj, sa.o_proj))
    experts = loaded.model.model.layers[0].mlp.experts
    assert experts.gate_up_proj_bias.abs().sum() > 0 and experts.down_proj_bias.abs().sum() > 0
    assert loaded.model.model.layers[0].mlp.router.bias.abs().sum() > 0
    pm = PagedCausalLM(loaded.model)
    (ids,) = random_prompts(12, [40])
    with torch.inference_mode():
        ref = loaded.model(torch.tensor([ids])).logits[0]
    got = pm.compute_logits(pm.forward(torch.tensor(ids), torch.arange(40), NoCacheAttention()))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_contiguous_cache_backend_matches_hf():
    """The ladder's contiguous per-request cache also applies sinks and per-layer windows:
    a prefill of 25 tokens then 15 single-token decodes give HF's logits."""
    loaded = _with_random_biases()
    pm = PagedCausalLM(loaded.model)
    (ids,) = random_prompts(13, [40])
    with torch.inference_mode():
        ref = loaded.model(torch.tensor([ids])).logits[0]
    attn = ContiguousKVAttention(pm.num_layers, pm.num_kv_heads, pm.head_dim, 64,
                                 torch.float32, torch.device("cpu"))
    got, start = [], 0
    for n in [25] + [1] * 15:
        chunk = torch.tensor(ids[start:start + n])
        got.append(pm.compute_logits(pm.forward(chunk, torch.arange(start, start + n), attn)))
        attn.advance()
        start += n
    torch.testing.assert_close(torch.cat(got), ref, rtol=1e-4, atol=1e-4)


def test_sinks_join_the_softmax_denominator():
    """SDPA with a zero key biased by the sink equals HF's eager formula (scores and sink
    concatenated, softmax, sink column dropped), with GQA and a mask."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=g) for s in ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)))
    sinks = torch.randn(4, generator=g) * 2
    mask = torch.rand(5, 7, generator=g) > 0.3
    mask[:, 0] = True
    got = sdpa_with_sinks(q, k, v, mask, 0.3, sinks.view(1, 4, 1, 1), enable_gqa=True)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ kk.transpose(-1, -2) * 0.3).masked_fill(~mask, float("-inf"))
    probs = torch.cat([scores, sinks.view(1, 4, 1, 1).expand(2, 4, 5, 1)], -1).softmax(-1)
    torch.testing.assert_close(got, probs[..., :-1] @ vv)
    assert (got.norm(dim=-1) > 0).all()


def test_bf16_weights_run():
    """bf16 weights build and serve; the first greedy token (prefill only) equals HF's. Later
    tokens may differ: bf16 noise can flip a top-k routing choice, as for every MoE family."""
    loaded = _with_random_biases("bf16")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    llm = LLM(loaded, num_gpu_blocks=64, block_size=4)
    prompts = random_prompts(1, [5, 13, 31, 47])
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4))
    for p, o in zip(prompts, outs):
        assert len(o.token_ids) == 4 and o.token_ids[0] == hf_greedy(loaded.model, p, 1)[0]
    assert_pool_whole(llm)


def test_saved_directory_serves_the_same_tokens(tmp_path):
    """A saved checkpoint directory (config.json with every field + safetensors, eager
    attention) serves HF's greedy tokens of the model it was saved from."""
    src = _with_random_biases()
    src.model.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), num_gpu_blocks=64, block_size=4)
    assert not llm.loaded.random_weights
    assert llm.loaded.config._attn_implementation == "eager"
    prompts = random_prompts(14, [9, 33])
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=10))
    assert [o.token_ids for o in outs] == [hf_greedy(src.model, p, 10) for p in prompts]


def test_default_layer_types_alternate_sliding_first():
    """Without `layer_types` HF alternates sliding and full layers, sliding first (the released
    checkpoints' pattern); the executor reads the same."""
    cfg = builtin_config(NAME)
    del cfg["layer_types"]
    pm = PagedCausalLM(load_model(cfg, dtype="fp32", device="cpu").model)
    assert pm.windows == [10, None, 10, None]


@pytest.mark.parametrize("field", [*REQUIRED_FIELDS["gpt_oss"], "sliding_window"])
def test_missing_field_is_refused_naming_it(field, tmp_path):
    cfg = builtin_config(NAME)
    del cfg[field]
    with pytest.raises(ValueError, match=f"gpt-oss config is missing field '{field}'"):
        load_model(cfg)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"{path}: gpt-oss config is missing field '{field}'"):
        LLM(str(path), num_gpu_blocks=8)


def test_full_layers_alone_need_no_window():
    cfg = builtin_config(NAME)
    del cfg["sliding_window"]
    cfg["layer_types"] = ["full_attention"] * 4
    assert PagedCausalLM(load_model(cfg, dtype="fp32", device="cpu").model).windows == [None] * 4


@pytest.mark.parametrize("key,value,match", [
    ("layer_types", ["sliding_attention", "chunked_attention"] * 2, "'layer_types' must list"),
    ("layer_types", ["full_attention"] * 3, r"per layer \(4\)"),
    ("num_local_experts", 0, "'num_local_experts' must be a positive integer, got 0"),
    ("sliding_window", -4, "'sliding_window' must be a positive integer, got -4"),
])
def test_bad_values_are_refused(key, value, match):
    cfg = builtin_config(NAME)
    cfg[key] = value
    with pytest.raises(ValueError, match=match):
        load_model(cfg)

