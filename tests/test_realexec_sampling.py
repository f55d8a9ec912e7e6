"""Sampling: seeds make runs reproducible and independent of the batch; top-k/top-p,
min_tokens and stop ids behave as documented; the pool is whole after each generate."""

from __future__ import annotations

import re

import pytest
import torch

from realexec import LLM, SamplingParams
from realexec.engine.hf_reference import hf_greedy
from realexec.engine.sampler import (
    Sampler,
    SamplingRow,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
)
from tests.realexec_reference import (
    assert_pool_whole,
    hf_model,
    one_thread,  # noqa: F401  (fixture)
    random_prompts,
    reference,
)

pytestmark = pytest.mark.usefixtures("one_thread")

NAME = "tiny-llama"


def _llm(**kw) -> LLM:
    return LLM(NAME, num_gpu_blocks=128, block_size=4, **kw)


def test_seeded_sampling_is_reproducible_and_batch_independent():
    prompts = random_prompts(10, [5, 12, 30])
    sp = SamplingParams(temperature=0.9, top_p=0.95, seed=123, max_tokens=15, ignore_eos=True)
    a = [o.token_ids for o in _llm().generate(prompts, sp)]
    b = [o.token_ids for o in _llm(seed=999).generate(prompts, sp)]  # engine seed irrelevant
    assert a == b
    alone = _llm().generate(prompts[1:2], sp)[0].token_ids  # different batch company
    assert alone == a[1]
    other = _llm().generate(prompts, SamplingParams(temperature=0.9, top_p=0.95, seed=124,
                                                     max_tokens=15, ignore_eos=True))
    assert [o.token_ids for o in other] != a


def test_unseeded_sampling_follows_the_engine_seed():
    prompts = random_prompts(11, [6, 9])
    sp = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    run = lambda seed: [o.token_ids for o in _llm(seed=seed).generate(prompts, sp)]  # noqa: E731
    assert run(5) == run(5)
    assert run(5) != run(6)


def test_top_k_one_and_tiny_top_p_are_greedy():
    prompts = random_prompts(12, [7, 20])
    llm = _llm()
    refs = [reference(NAME, p, 8) for p in prompts]
    for sp in (SamplingParams(temperature=1.5, top_k=1, seed=1, max_tokens=8),
               SamplingParams(temperature=1.5, top_p=1e-6, seed=1, max_tokens=8)):
        assert [o.token_ids for o in llm.generate(prompts, sp)] == refs
    assert_pool_whole(llm)


def test_top_k_top_p_masks():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0, 0.0]])
    out = apply_top_k_top_p(logits.clone(), torch.tensor([2, 5]), None)
    assert torch.isinf(out[0, :3]).all() and torch.isfinite(out[0, 3:]).all()
    assert torch.isfinite(out[1]).all()
    # probs of [4,3,2,1,0]: 0.636, 0.234, 0.086, ...: top_p 0.8 keeps the first two
    out = apply_top_k_top_p(logits.clone(), None, torch.tensor([0.8, 0.8]))
    assert torch.isfinite(out[1, :2]).all() and torch.isinf(out[1, 2:]).all()
    assert torch.isfinite(out[0, 3:]).all() and torch.isinf(out[0, :3]).all()


def test_sampler_draws_only_allowed_tokens():
    sampler = Sampler(torch.device("cpu"), seed=0)
    logits = torch.zeros(200, 10)
    rows = [SamplingRow(temperature=1.0, top_k=3, generator=sampler.make_generator(i))
            for i in range(200)]
    logits[:, 7:] = 5.0  # tokens 7, 8, 9 are the top 3
    toks = sampler.sample(logits, rows)
    assert set(toks) == {7, 8, 9}


def test_min_tokens_hides_eos_and_stop_ids():
    (prompt,) = random_prompts(13, [9])
    ref = reference(NAME, prompt, 30)
    llm = _llm()
    stop = ref[3]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=30,
                                                 stop_token_ids=(stop,)))[0]
    assert out.token_ids == ref[: ref.index(stop) + 1] and out.finish_reason == "stop"
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=30, min_tokens=8,
                                                 stop_token_ids=(stop,)))[0]
    assert len(out.token_ids) >= 8 and stop not in out.token_ids[:8]
    assert_pool_whole(llm)


def test_token_times_are_increasing_engine_times():
    prompts = random_prompts(14, [4, 10])
    llm = _llm()
    for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)):
        t = o.token_times
        assert len(t) == 6 and all(b > a for a, b in zip(t, t[1:]))
        assert o.arrival_time <= o.outputs[0].first_token_time == t[0]
        assert o.outputs[0].finish_time == t[-1]


def test_penalties_follow_openais_formula_and_transformers_repetition_penalty():
    """Presence / frequency as OpenAI documents them (mu[j] - c[j]*a_freq - [c[j] > 0]*a_pres,
    c = counts in the output only); repetition as `transformers`' own logits processor
    (over prompt and output); a row without penalties is left as it was."""
    from transformers import RepetitionPenaltyLogitsProcessor

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 40, generator=g) * 3
    rows = [SamplingRow(temperature=0, presence_penalty=0.5, frequency_penalty=-0.3,
                        prompt_ids=[1, 2, 9], output_ids=[4, 4, 7, 4]),
            SamplingRow(temperature=0.8),
            SamplingRow(temperature=0, repetition_penalty=1.7, prompt_ids=[3, 3, 11],
                        output_ids=[5, 12])]
    want = logits.clone()
    counts = {4: 3, 7: 1}
    for j, c in counts.items():
        want[0, j] -= c * -0.3 + 0.5
    want[2] = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([[3, 3, 11, 5, 12]]),
                                                    logits[2:3].clone())[0]
    got = logits.clone()
    apply_penalties(got, rows)
    assert torch.allclose(got, want)
    assert not torch.equal(got[2], logits[2])


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_greedy_with_a_repetition_penalty_matches_transformers_generate(penalty):
    """Token for token against HF `generate(repetition_penalty=...)`, in one batch with an
    unpenalized request and a prompt long enough to be chunked."""
    ps = random_prompts(21, [7, 40])
    sp = SamplingParams(temperature=0, max_tokens=12, repetition_penalty=penalty)
    llm = _llm(max_num_batched_tokens=16)
    plain, *penalized = llm.generate([ps[0], *ps], [SamplingParams(temperature=0, max_tokens=12),
                                                    sp, sp])
    assert plain.token_ids == reference(NAME, ps[0], 12)
    want = [hf_greedy(hf_model(NAME), p, 12, repetition_penalty=penalty) for p in ps]
    assert [o.token_ids for o in penalized] == want
    assert want != [reference(NAME, p, 12) for p in ps]  # the penalty changed something
    assert_pool_whole(llm)


def test_presence_and_frequency_penalties_steer_away_from_repeats():
    """Greedy decoding of a tiny random model repeats itself; a presence penalty of 2 (the
    most OpenAI allows) makes fewer repeats, a negative frequency penalty more."""
    ps = random_prompts(22, [8, 8, 8])

    def repeats(**pen) -> int:
        outs = _llm().generate(ps, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                                  **pen))
        return sum(len(o.token_ids) - len(set(o.token_ids)) for o in outs)

    base = repeats()
    assert repeats(presence_penalty=2.0) < base < repeats(frequency_penalty=-2.0)


@pytest.mark.parametrize("field, value, fragment", [
    ("presence_penalty", 2.5, "presence_penalty must be in [-2, 2]"),
    ("frequency_penalty", float("nan"), "frequency_penalty must be a finite number"),
    ("repetition_penalty", 0.0, "repetition_penalty must be > 0"),
])
def test_out_of_range_penalties_are_refused_naming_the_field(field, value, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        SamplingParams.from_dict({field: value})


def test_min_p_matches_transformers_warper_and_keeps_the_top_token():
    from transformers import MinPLogitsWarper

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 50, generator=g) * 2
    for p in (0.05, 0.3, 1.0):
        want = MinPLogitsWarper(p)(None, logits.clone())
        got = apply_min_p(logits.clone(), torch.full((4,), p))
        assert torch.equal(got.isinf(), want.isinf())
        assert torch.equal(got.argmax(-1), logits.argmax(-1))


def test_greedy_with_a_logit_bias_matches_transformers_sequence_bias():
    """OpenAI's logit_bias as transformers' own single-token `sequence_bias`: a strong bias
    forces or bans a token, token for token against HF `generate`."""
    ps = random_prompts(23, [9, 17])
    plain = [reference(NAME, p, 8) for p in ps]
    bias = {plain[0][1]: -100.0, 77: 5.0, plain[1][0]: -3.0}
    llm = _llm()
    outs = llm.generate(ps, SamplingParams(temperature=0, max_tokens=8, logit_bias=bias))
    want = [hf_greedy(hf_model(NAME), p, 8, sequence_bias={(t,): b for t, b in bias.items()})
            for p in ps]
    assert [o.token_ids for o in outs] == want != plain
    with pytest.raises(ValueError, match=r"logit_bias: 300 is outside the vocabulary \[0, 256\)"):
        llm.generate(ps, SamplingParams(logit_bias={300: 1.0}))


def test_min_p_sampling_only_draws_tokens_above_the_floor():
    """At temperature 1 with min_p 0.8, every drawn token is at least 0.8 x as likely as the
    most likely one (read from the raw logprobs); without min_p, some draws are not."""
    import math

    ps = random_prompts(24, [6, 11, 15])

    def ratios(min_p: float) -> list[float]:
        outs = _llm().generate(ps, SamplingParams(temperature=1.0, min_p=min_p, seed=5,
                                                  max_tokens=30, ignore_eos=True, logprobs=1))
        return [math.exp(row[t] - max(row.values())) for o in outs
                for t, row in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]

    assert min(ratios(0.8)) >= 0.8 - 1e-6
    assert min(ratios(0.0)) < 0.8
