"""Greedy output of the real engine equals HF `generate(do_sample=False)` token for token
(fp32, CPU, seeded tiny models of every supported family), across batching, chunked
prefill, prefix caching, preemption (recompute and swap) and n > 1."""

from __future__ import annotations

import pytest

from realexec import LLM, SamplingParams
from tests.realexec_reference import (
    FAMILIES,
    LINEAR_FAMILIES,
    assert_pool_whole,
    hf_model,
    one_thread,  # noqa: F401  (fixture)
    random_prompts,
    reference,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def _check(name, llm, prompts, params):
    outs = llm.generate(prompts, params)
    for p, sp, o in zip(prompts, params, outs):
        ref = reference(name, p, sp.max_tokens)
        assert o.token_ids == ref, f"prompt of {len(p)} tokens"
        assert o.finish_reason == ("length" if len(ref) == sp.max_tokens else "stop")
        assert len(o.token_times) == len(o.token_ids)
    assert_pool_whole(llm)
    return outs


@pytest.mark.parametrize("name", FAMILIES)
def test_large_batch_of_mixed_lengths(name):
    lengths = [1, 2, 3, 5, 8, 13, 16, 17, 31, 32, 47, 64, 90]
    prompts = random_prompts(1, lengths)
    params = [_greedy(1 + (7 * i) % 20) for i in range(len(prompts))]
    llm = LLM(name, num_gpu_blocks=256, block_size=4, record_steps=True)
    _check(name, llm, prompts, params)
    # all prompts were prefilled together in the first step
    assert llm.runner.steps[0].shape.num_reqs == len(prompts)


@pytest.mark.parametrize("name", FAMILIES)
def test_tiny_token_budget_chunks_and_mixes(name):
    prompts = random_prompts(2, [3, 9, 22, 40, 7])
    params = [_greedy(12) for _ in prompts]
    llm = LLM(name, num_gpu_blocks=128, block_size=4, max_num_batched_tokens=8,
              record_steps=True)
    _check(name, llm, prompts, params)
    shapes = [s.shape for s in llm.runner.steps]
    assert all(s.num_tokens <= 8 for s in shapes)
    assert any(s.num_prefill_reqs and s.num_decode_reqs for s in shapes)  # mixed steps


@pytest.mark.parametrize("name", FAMILIES)
def test_prompt_steps_of_their_own(name):
    """mixed_batches=False (SGLang's schedule): prompts, chunked in a small budget and
    arriving while others decode, run in steps without decodes; output is unchanged."""
    prompts = random_prompts(5, [3, 9, 22, 40, 7, 1])
    params = [_greedy(6 + i) for i in range(len(prompts))]
    llm = LLM(name, num_gpu_blocks=128, block_size=4, max_num_batched_tokens=16,
              max_num_seqs=3, mixed_batches=False, record_steps=True)
    _check(name, llm, prompts, params)
    shapes = [s.shape for s in llm.runner.steps]
    assert not any(s.num_prefill_reqs and s.num_decode_reqs for s in shapes)
    assert any(s.num_decode_reqs for s in shapes) and any(s.num_prefill_reqs for s in shapes)


@pytest.mark.parametrize("name", FAMILIES)
def test_first_token_from_a_decode_pass(name):
    """first_token_from_decode (TurboMind before v0.1.0a2): every prompt's last token runs in
    a later one-token pass that samples the first token, chunked prompts and a shared prefix
    included; output is unchanged."""
    prompts = random_prompts(6, [2, 9, 22, 40, 7, 1])
    prompts.append(prompts[2][:12] + [3, 4])  # a prefix hit on the third prompt's blocks
    params = [_greedy(5 + i) for i in range(len(prompts))]
    llm = LLM(name, num_gpu_blocks=128, block_size=4, max_num_batched_tokens=16,
              max_num_seqs=4, enable_prefix_caching=True, first_token_from_decode=True)
    sampling_passes = []  # new tokens of every scheduled request whose pass samples
    execute = llm.runner.execute

    def recording(out):
        sampling_passes.extend(n for r, before, n in zip(out.reqs, out.num_computed_before,
                                                         out.num_new_tokens)
                               if before + n == r.num_tokens)
        return execute(out)

    llm.runner.execute = recording
    outs = _check(name, llm, prompts, params)
    assert len(sampling_passes) == sum(len(o.token_ids) for o in outs)
    assert set(sampling_passes) == {1}


@pytest.mark.parametrize("name", FAMILIES)
def test_sglangs_decaying_reservation(name):
    """capacity_policy reserve_ratio (SGLang's admission) in a pool too small for every request
    at once: later requests wait for room beside the running outputs; output is unchanged."""
    prompts = random_prompts(7, [9, 22, 14, 30, 5, 17])
    params = [_greedy(10 + i) for i in range(len(prompts))]
    llm = LLM(name, num_gpu_blocks=24, block_size=4, capacity_policy="reserve_ratio",
              record_steps=True)
    _check(name, llm, prompts, params)
    assert llm.runner.steps[0].shape.num_reqs < len(prompts)  # not everyone was admitted at once


@pytest.mark.parametrize("name", FAMILIES)
def test_v0s_whole_prompt_blocks_and_watermark(name):
    """prompt_allocation whole_prompt with an admission watermark (vLLM V0's block manager) in
    a pool too small for every request, chunked prompts preempted and recomputed: output is
    unchanged."""
    prompts = random_prompts(8, [9, 22, 14, 30, 5, 17])
    params = [_greedy(10 + i) for i in range(len(prompts))]
    llm = LLM(name, num_gpu_blocks=26, block_size=4, max_num_batched_tokens=16,
              prompt_allocation="whole_prompt", admission_watermark=0.1, record_steps=True)
    _check(name, llm, prompts, params)
    assert llm.runner.steps[0].shape.num_reqs < len(prompts)  # not everyone was admitted at once


@pytest.mark.parametrize("name", FAMILIES)
def test_shared_prefixes_and_full_prompt_hits(name):
    bs = 4
    (base,) = random_prompts(3, [21])
    aligned = base[:16]  # exactly 4 blocks
    prompts = [base, aligned, base[:18] + [5, 6, 7], aligned + [9], base[:5]]
    params = [_greedy(10) for _ in prompts]
    llm = LLM(name, num_gpu_blocks=128, block_size=bs, enable_prefix_caching=True)
    _check(name, llm, [base], params[:1])
    outs = _check(name, llm, prompts, params)  # all hit base's cached blocks
    if any(llm.runner.model.linear):  # a linear-attention state is not cached by prefix
        assert llm.kv_cache_manager.state_blocks and not llm.kv_cache_manager.enable_prefix_caching
        assert [o.outputs[0].num_cached_tokens for o in outs] == [0] * len(prompts)
        return
    assert [o.outputs[0].num_cached_tokens for o in outs] == [20, 12, 16, 16, 4]
    again = _check(name, llm, prompts, params)  # full-prompt hits (minus the last token)
    assert again[1].outputs[0].num_cached_tokens == 12  # block-aligned: last block recomputed
    assert again[3].outputs[0].num_cached_tokens == 16


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_tiny_pool_forces_preemption(name, mode):
    prompts = random_prompts(4, [10, 14, 9, 12, 11, 13])
    params = [_greedy(20) for _ in prompts]
    if mode == "swap" and name in LINEAR_FAMILIES:  # its recurrent state is not swapped
        with pytest.raises(ValueError, match="linear-attention state; use 'recompute'"):
            LLM(name, num_gpu_blocks=20, block_size=4, preemption_mode=mode, num_cpu_blocks=40)
        return
    llm = LLM(name, num_gpu_blocks=20, block_size=4, preemption_mode=mode,
              num_cpu_blocks=40 if mode == "swap" else 0, enable_prefix_caching=False)
    outs = _check(name, llm, prompts, params)
    assert sum(o.outputs[0].num_preemptions for o in outs) > 0
    if mode == "swap":
        assert llm.kv_cache_manager.num_swapped_in_blocks > 0


@pytest.mark.parametrize("name", FAMILIES)
def test_parallel_sampling_children(name):
    prompts = random_prompts(5, [6, 13, 16])
    llm = LLM(name, num_gpu_blocks=128, block_size=4)
    outs = llm.generate(prompts, _greedy(9, n=3))
    for p, o in zip(prompts, outs):
        assert len(o.outputs) == 3
        ref = reference(name, p, 9)
        assert [c.token_ids for c in o.outputs] == [ref] * 3
    assert_pool_whole(llm)
    # seeded sampling: child i uses seed + i, like an independent request with that seed
    sp = SamplingParams(temperature=1.0, top_k=50, seed=11, n=3, max_tokens=12, ignore_eos=True)
    forked = llm.generate(prompts, sp)
    for k in range(3):
        alone = LLM(name, num_gpu_blocks=128, block_size=4).generate(
            prompts, SamplingParams(temperature=1.0, top_k=50, seed=11 + k, max_tokens=12,
                                    ignore_eos=True))
        assert [o.outputs[k].token_ids for o in forked] == [o.token_ids for o in alone]
    assert_pool_whole(llm)


def test_llm_returns_log_probabilities_that_match_transformers():
    """`SamplingParams(logprobs=k)`: each output token's {token id: log-probability}, the
    sampled token's and the k most likely, equal to log_softmax of HF's own logits."""
    import torch

    name = "tiny-llama"
    prompt = random_prompts(4, [11])[0]
    out = LLM(name).generate([prompt], SamplingParams(temperature=0.0, max_tokens=5,
                                                      logprobs=3))[0].outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == 5
    with torch.no_grad():
        ids = torch.tensor([prompt + out.token_ids[:-1]])
        ref = hf_model(name)(ids).logits[0, len(prompt) - 1:].float().log_softmax(-1)
    for pos, (token, row) in enumerate(zip(out.token_ids, out.logprobs)):
        top = ref[pos].topk(3)
        assert set(row) == {token, *top.indices.tolist()}
        for tid, lp in row.items():
            assert lp == pytest.approx(float(ref[pos, tid]), abs=1e-4)
    plain = LLM(name).generate([prompt], SamplingParams(temperature=0.0, max_tokens=2))
    assert plain[0].outputs[0].logprobs is None


# (Granite and Granite MoE: the head divides the logits by logits_scaling, Command R's
# multiplies them by logit_scale, which greedy output cannot show)
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral-sw", "tiny-qwen3-moe",
                                  "tiny-granite", "tiny-granitemoe-shared", "tiny-cohere"])
def test_prompt_logprobs_match_transformers_across_chunks_cache_and_preemption(name):
    """`SamplingParams(prompt_logprobs=k)`: None for the first prompt token, then each
    token's log-probability and the k most likely, equal to log_softmax of HF's logits, with
    prompts split into chunks, a cached prefix (not taken: `num_cached_tokens` 0, as vLLM)
    and a pool small enough to preempt and recompute."""
    import torch

    prompts = random_prompts(31, [1, 7, 30, 26])
    prompts[3] = prompts[2][:20] + prompts[3][:6]  # shares a cached prefix with prompts[2]
    llm = LLM(name, num_gpu_blocks=12, block_size=4, max_num_batched_tokens=12)
    llm.generate(prompts[2:3], _greedy(2))  # fills the prefix cache
    outs = llm.generate(prompts, _greedy(14, prompt_logprobs=2, ignore_eos=True))
    assert sum(o.outputs[0].num_preemptions for o in outs) > 0
    for p, o in zip(prompts, outs):
        got = o.prompt_logprobs
        assert got is not None and len(got) == len(p) and got[0] is None
        assert o.outputs[0].num_cached_tokens == 0
        with torch.no_grad():
            ref = hf_model(name)(torch.tensor([p])).logits[0].float().log_softmax(-1)
        for pos, row in enumerate(got[1:]):
            top = ref[pos].topk(2).indices.tolist()
            assert set(row) == {p[pos + 1], *top}
            for tid, lp in row.items():
                assert lp == pytest.approx(float(ref[pos, tid]), abs=1e-4)
    assert_pool_whole(llm)
    again = llm.generate(prompts[2:4], _greedy(2))  # without prompt logprobs, hits are taken
    assert again[1].outputs[0].num_cached_tokens > 0 and again[0].prompt_logprobs is None


def test_a_parent_swapped_out_before_its_fork_point_still_forks():
    """A fuzz found an n = 2 request returning one sequence: swapped out mid-prompt (a
    threshold of 8 tokens per step, a 25-block pool), it resumed with its whole remaining
    prompt in one step, past its fork point. It now resumes up to the fork point, forks, and
    each sequence equals the same sampling without preemption."""
    name = "tiny-gpt2"
    prompts = random_prompts(3, [75, 25, 63, 79, 18])
    params = [SamplingParams(temperature=0.8, top_k=20, seed=100 + i, max_tokens=17,
                             n=2 if i == 3 else 1) for i in range(len(prompts))]
    llm = LLM(name, num_gpu_blocks=25, block_size=4, max_num_seqs=2,
              long_prefill_token_threshold=8, preemption_mode="swap", num_cpu_blocks=64)
    outs = llm.generate(prompts, params)
    assert llm.scheduler.num_preemptions > 0
    assert [len(o.outputs) for o in outs] == [1, 1, 1, 2, 1]
    alone = LLM(name, num_gpu_blocks=1024).generate(prompts, params)
    assert [[c.token_ids for c in o.outputs] for o in outs] == \
        [[c.token_ids for c in o.outputs] for o in alone]
    assert_pool_whole(llm)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_sliding_window_frees_blocks_so_long_sequences_fit(mode):
    """A 10-token window (tiny-mistral-sw), prompts 2-6x longer and a pool of 16 blocks of 4
    tokens: a 57 + 20 token sequence needs 20 blocks whole, so only freeing the blocks that
    slid out of the window lets it run (at most cdiv(9 + 16, 4) + 1 = 8 blocks at once);
    shared prefixes hit the cache, and the executor never reads a freed block."""
    name = "tiny-mistral-sw"
    prefix = random_prompts(8, [24])[0]
    prompts = random_prompts(7, [23, 40, 57, 31]) + [prefix + p for p in random_prompts(9, [5, 17])]
    params = [_greedy(20) for _ in prompts]
    llm = LLM(name, num_gpu_blocks=16, block_size=4, max_num_batched_tokens=16,
              preemption_mode=mode, num_cpu_blocks=16 if mode == "swap" else None)
    kvm = llm.kv_cache_manager
    assert (kvm.sliding_window, kvm.max_blocks_held(77)) == (10, 8)
    _check(name, llm, prompts, params)
    assert kvm.num_slid_out_blocks > 0 and kvm.prefix_hit_tokens > 0


def test_mixed_full_and_sliding_layers_keep_every_block():
    """Qwen2 with sliding layers after the first (`layer_types`): the full layer reads every
    block, so none is freed early; output still equals HF's."""
    cfg = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
           "vocab_size": 256, "max_position_embeddings": 512, "use_sliding_window": True,
           "sliding_window": 6, "layer_types": ["full_attention", "sliding_attention"]}
    llm = LLM(cfg, num_gpu_blocks=64, block_size=4)
    kvm = llm.kv_cache_manager
    assert kvm.sliding_window == 0 and llm.scheduler.cache_config.sliding_window == 6
    prompts = random_prompts(3, [20, 33])
    outs = llm.generate(prompts, [_greedy(8)] * 2)
    hf = llm.loaded.model
    from realexec.engine.hf_reference import hf_greedy
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_greedy(hf, p, 8)
    assert kvm.num_slid_out_blocks == 0
    assert_pool_whole(llm)


def test_arrivals_behind_the_recv_interval():
    """recv_interval (SGLang's --scheduler-recv-interval) in the real engine: a request added
    while another decodes is taken in at the 3rd step after (the checks count 1, 2, 3), and
    both outputs equal transformers' greedy ones."""
    # a's prompt (the check before the next step opens), a decode: from there it counts 1, 2, 3
    llm = LLM("tiny-llama", num_gpu_blocks=64, block_size=4, recv_interval=3)
    assert _second_arrival(llm, 11, steps_before=2) == [False, False, True]


def _second_arrival(llm, seed: int, steps_before: int) -> list[bool]:
    """Add "a", step `steps_before` times, add "b", and return whether each of the next three
    steps admitted "b"; then run both to the end and check their outputs against transformers'
    greedy ones and the pool."""
    name = "tiny-llama"
    a, b = random_prompts(seed, [9, 14])
    ra = llm.add_request("a", a, _greedy(12))
    for _ in range(steps_before):
        llm.step()
    rb = llm.add_request("b", b, _greedy(6))
    admitted = [("b" in llm.step().scheduler_output.new_req_ids) for _ in range(3)]
    while llm.has_unfinished_requests():
        llm.step()
    assert list(ra.output_token_ids) == reference(name, a, 12)
    assert list(rb.output_token_ids) == reference(name, b, 6)
    assert_pool_whole(llm)
    return admitted


def test_batch_waiting_holds_an_arrival_beside_decodes():
    """batch_wait_timeout_iters / batch_wait_max_tokens_ratio (TensorRT-LLM's batch waiting) in
    the real engine: a request added while another decodes waits out the timeout (two held
    steps) and runs at the third, and both outputs equal transformers' greedy ones."""
    llm = LLM("tiny-llama", num_gpu_blocks=64, block_size=4, max_num_batched_tokens=64,
              batch_wait_timeout_iters=2, batch_wait_max_tokens_ratio=0.9)
    assert _second_arrival(llm, 12, steps_before=1) == [False, False, True]  # after a's prompt


def test_the_ladder_refuses_a_linear_attention_model_saying_what_runs_it():
    from realexec.engine.model_loader import load_model
    from realexec.fidelity.ladder_rungs import SingleRequestRunner

    with pytest.raises(ValueError, match="linear-attention layers; the paged engine"):
        SingleRequestRunner(load_model("tiny-qwen3-next", dtype="fp32", device="cpu", seed=0))
