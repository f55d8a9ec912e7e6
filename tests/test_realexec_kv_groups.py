"""The real executor with vLLM V1's KV cache groups (`LLM(hybrid_kv_cache=True)`): models that
mix sliding-window and full-attention layers keep only the window on their sliding layers, in
tables of their own from the shared core, and their greedy output still equals HF's
`generate` token for token, across mixed batches, small step budgets, recompute preemption
(prefix caching off and on), shared prefixes and n > 1 forks. Every step reads the sliding layers' blocks through `build_metadata`, which
refuses a block the core freed, so these runs also check the core's window bookkeeping."""

from __future__ import annotations

import pytest

from realexec import LLM, SamplingParams
from realexec.engine.kv_groups import kv_groups
from tests.realexec_reference import (
    assert_pool_whole,
    one_thread,  # noqa: F401  (fixture)
    random_prompts,
    reference,
)

pytestmark = pytest.mark.usefixtures("one_thread")
# gpt-oss: 2 sliding + 2 full layers (one sliding group); Gemma 2: alternating; Gemma 3: 3
# sliding + 1 full (three sliding groups of one layer); windows of 10 tokens. Llama 4: 3
# chunked layers (8-token chunks, kept as a window of 8) + 1 full; OLMo 3, EXAONE 4 and its
# MoE, Command A: 3 sliding + 1 full
MODELS = ["tiny-gpt-oss", "tiny-gemma2", "tiny-gemma3", "tiny-llama4", "tiny-olmo3",
          "tiny-exaone4", "tiny-exaone-moe", "tiny-cohere2"]


def _greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def _llm(name: str, **kw) -> LLM:
    kw.setdefault("enable_prefix_caching", False)
    return LLM(name, block_size=4, hybrid_kv_cache=True, **kw)


def _check(name, llm, prompts, params):
    outs = llm.generate(prompts, params)
    for p, sp, o in zip(prompts, params, outs):
        assert o.token_ids == reference(name, p, sp.max_tokens), f"prompt of {len(p)} tokens"
    assert_pool_whole(llm)
    assert not llm.kv_cache_manager.req_to_window_blocks
    return outs


def test_grouping_follows_vllms_rule():
    assert kv_groups([None, 10, None, 10]).layer_map == ((0, 0), (0, 1), (1, 0), (1, 1))
    gemma3 = kv_groups([10, 10, 10, None])  # 3 sliding, 1 full: groups of one layer
    assert (gemma3.group_layers, gemma3.sliding_groups, gemma3.layer_map) == (
        1, 3, ((0, 1), (0, 2), (0, 3), (0, 0)))
    # 5 sliding, 2 full: groups of 2, the sliding ones as layers[k::3] (the last padded)
    five = kv_groups([10, 10, None, 10, 10, None, 10])
    assert (five.group_layers, five.sliding_groups) == (2, 3)
    assert five.layer_map == ((0, 1), (0, 2), (0, 0), (0, 3), (1, 1), (1, 0), (1, 2))
    for windows in ([None, None], [10, 10], [None, None, 10], [8, None, 10]):
        assert kv_groups(windows) is None


@pytest.mark.parametrize("name", MODELS)
def test_mixed_batch_long_prompts_hold_only_the_window(name):
    lengths = [1, 5, 13, 31, 47, 64, 90]
    prompts = random_prompts(1, lengths)
    params = [_greedy(1 + (7 * i) % 20) for i in range(len(prompts))]
    llm = _llm(name, num_gpu_blocks=512)
    _check(name, llm, prompts, params)
    assert llm.kv_cache_manager.num_slid_out_blocks > 0


@pytest.mark.parametrize("name", MODELS)
def test_tiny_step_budget_chunks_and_mixes(name):
    prompts = random_prompts(2, [3, 9, 22, 40, 7])
    llm = _llm(name, num_gpu_blocks=256, max_num_batched_tokens=8, record_steps=True)
    _check(name, llm, prompts, [_greedy(12) for _ in prompts])
    assert any(s.shape.num_prefill_reqs and s.shape.num_decode_reqs for s in llm.runner.steps)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("caching", [False, True])
def test_tiny_pool_forces_preemption(name, caching):
    prompts = random_prompts(4, [10, 14, 9, 12, 11, 13])
    # (three sliding groups of one layer each take a prompt's blocks while it is prefilled)
    llm = _llm(name, num_gpu_blocks=30 if name in ("tiny-gpt-oss", "tiny-gemma2") else 60,
               enable_prefix_caching=caching)
    outs = _check(name, llm, prompts, [_greedy(20) for _ in prompts])
    assert sum(o.outputs[0].num_preemptions for o in outs) > 0


@pytest.mark.parametrize("name", MODELS)
def test_parallel_sampling_children_copy_the_window(name):
    prompts = random_prompts(5, [6, 13, 16])
    llm = _llm(name, num_gpu_blocks=256)
    outs = llm.generate(prompts, _greedy(9, n=3))
    for p, o in zip(prompts, outs):
        assert [c.token_ids for c in o.outputs] == [reference(name, p, 9)] * 3
    assert_pool_whole(llm)


@pytest.mark.parametrize("name", MODELS)
def test_shared_prefixes_hit_the_cached_window(name):
    """Prompts sharing a 21-token prompt's blocks: each hit revives the sliding groups' cached
    blocks of the window before its end (the full layers' blocks before it as usual), and
    output still equals HF's; a second pass hits whole prompts."""
    (base,) = random_prompts(3, [21])
    aligned = base[:16]
    prompts = [base, aligned, base[:18] + [5, 6, 7], aligned + [9], base[:5]]
    params = [_greedy(10) for _ in prompts]
    llm = _llm(name, num_gpu_blocks=256, enable_prefix_caching=True)
    _check(name, llm, [base], params[:1])
    outs = _check(name, llm, prompts, params)
    assert [o.outputs[0].num_cached_tokens for o in outs] == [20, 12, 16, 16, 4]
    again = _check(name, llm, prompts, params)
    assert again[3].outputs[0].num_cached_tokens == 16


def test_the_groups_refuse_what_they_do_not_serve():
    with pytest.raises(ValueError, match="recompute"):
        LLM("tiny-gpt-oss", hybrid_kv_cache=True, enable_prefix_caching=False,
            num_gpu_blocks=64, preemption_mode="swap")
    with pytest.raises(ValueError, match="do not split"):
        LLM("tiny-llama", hybrid_kv_cache=True, enable_prefix_caching=False, num_gpu_blocks=64)


def test_a_block_holds_one_groups_layers():
    """gpt-oss's 4 layers in groups of 2: the cache keeps 2 tensors, so a block costs half the
    bytes, and a pool sized by bytes holds twice the blocks."""
    one = LLM("tiny-gpt-oss", block_size=4, num_gpu_blocks=64)
    grouped = _llm("tiny-gpt-oss", num_gpu_blocks=64)
    assert one.kv_cache.kv.shape[0] == 4 and grouped.kv_cache.kv.shape[0] == 2
    assert grouped.kv_cache.spec.bytes_per_block * 2 == one.kv_cache.spec.bytes_per_block


def test_a_pool_sized_for_max_num_seqs_holds_a_full_length_request_with_its_windows():
    """The default pool is capped at what max_num_seqs full-length sequences can use; with KV
    cache groups that counts each sequence's sliding groups too, so one sequence of the whole
    context still fits."""
    llm = LLM("tiny-gemma3", hybrid_kv_cache=True, max_num_seqs=1, block_size=4)
    prompt = random_prompts(6, [llm.max_model_len - 8])[0]
    (out,) = llm.generate([prompt], _greedy(4))
    assert out.finish_reason == "length" and len(out.token_ids) == 4
