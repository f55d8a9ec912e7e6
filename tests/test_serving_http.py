"""The OpenAI-compatible HTTP server, driven by the official `openai` client and raw httpx."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import openai
import pytest

from realexec.serving.client import EngineClient
from realexec.serving.http.server import ServerThread, create_app
from tests.serving_helpers import (
    prompts,
    reference,
    tiny_config,
    wait_for,
    wait_pools_whole,
)

MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tokenizer):
    client = EngineClient(tiny_config()).start()
    srv = ServerThread(create_app(client, MODEL, tokenizer)).start()
    srv.client = client
    yield srv
    srv.stop()
    client.close()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_completions_with_token_ids_plain_and_streamed(oai):
    p1, p2 = prompts(10, [6, 33])
    ref = reference([p1, p2], 10)
    r = oai.completions.create(model=MODEL, prompt=p1, max_tokens=10, temperature=0,
                               extra_body={"ignore_eos": True})
    choice = r.choices[0]
    assert choice.token_ids == ref[0] and choice.finish_reason == "length"
    assert r.usage.prompt_tokens == 6 and r.usage.completion_tokens == 10
    chunks = list(oai.completions.create(model=MODEL, prompt=p2, max_tokens=10, temperature=0,
                                         stream=True, extra_body={"ignore_eos": True}))
    assert len(chunks) == 10  # one server-sent event per generated token
    assert [t for c in chunks for t in c.choices[0].token_ids] == ref[1]
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 9 + ["length"]


def test_chat_with_token_ids_plain_and_streamed(oai):
    (p,) = prompts(11, [21])
    ref = reference([p], 7)[0]
    msgs = [{"role": "user", "content": "ignored: prompt_token_ids win"}]
    extra = {"prompt_token_ids": p, "ignore_eos": True}
    r = oai.chat.completions.create(model=MODEL, messages=msgs, max_tokens=7, temperature=0,
                                    extra_body=extra)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].token_ids == ref and r.choices[0].finish_reason == "length"
    chunks = list(oai.chat.completions.create(model=MODEL, messages=msgs, max_tokens=7,
                                              temperature=0, stream=True, extra_body=extra,
                                              stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    toks = [t for c in chunks if c.choices for t in c.choices[0].token_ids]
    assert toks == ref
    assert chunks[-1].usage.completion_tokens == 7 and chunks[-1].usage.prompt_tokens == 21


def test_text_prompts_and_stop_strings_with_a_tokenizer(oai, tokenizer):
    (p,) = prompts(12, [9])
    text = " ".join(f"t{t}" for t in p)
    ref = reference([p], 8)[0]
    r = oai.completions.create(model=MODEL, prompt=text, max_tokens=8, temperature=0,
                               extra_body={"ignore_eos": True})
    assert r.choices[0].token_ids == ref
    assert r.choices[0].text == tokenizer.decode(ref, skip_special_tokens=True)
    streamed = oai.completions.create(model=MODEL, prompt=text, max_tokens=8, temperature=0,
                                      stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == r.choices[0].text
    stop = f"t{ref[3]}"
    cut = oai.completions.create(model=MODEL, prompt=text, max_tokens=8, temperature=0, stop=stop,
                                 extra_body={"ignore_eos": True})
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == r.choices[0].text[: r.choices[0].text.index(stop)]
    # a stop string over two tokens: the stream holds the first back, then cuts both
    two = f"t{ref[3]} t{ref[4]}"
    kept = r.choices[0].text[: r.choices[0].text.index(two)]
    pieces = [c.choices[0].text for c in oai.completions.create(
        model=MODEL, prompt=text, max_tokens=8, temperature=0, stop=two, stream=True,
        extra_body={"ignore_eos": True}) if c.choices]
    assert "".join(pieces) == kept and all(two not in "".join(pieces[:k + 1])
                                          for k in range(len(pieces)))
    chat = oai.chat.completions.create(model=MODEL, temperature=0, max_tokens=5,
                                       messages=[{"role": "user", "content": text}])
    assert chat.choices[0].message.content == tokenizer.decode(chat.choices[0].token_ids,
                                                               skip_special_tokens=True)


def test_a_batch_of_prompts_gets_n_choices_per_prompt_in_order(oai, tokenizer):
    """OpenAI's batched completions (lm-eval's local-completions sends them): choice i*n + j
    answers prompt i, plain and streamed, token ids or text; usage counts every prompt once
    (before: a 400, "batches of prompts are not supported")."""
    ps = prompts(15, [5, 17, 9])
    ref = reference(ps, 6)
    r = oai.completions.create(model=MODEL, prompt=ps, max_tokens=6, temperature=0, n=2,
                               extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.token_ids for c in r.choices] == [t for t in ref for _ in range(2)]
    assert r.usage.prompt_tokens == 5 + 17 + 9 and r.usage.completion_tokens == 36
    chunks = list(oai.completions.create(model=MODEL, prompt=ps, max_tokens=6, temperature=0,
                                         stream=True, extra_body={"ignore_eos": True},
                                         stream_options={"include_usage": True}))
    got: dict[int, list[int]] = {}
    for c in chunks:
        for ch in c.choices:
            got.setdefault(ch.index, []).extend(ch.token_ids)
    assert got == dict(enumerate(ref)) and chunks[-1].usage.prompt_tokens == 31
    texts = [" ".join(f"t{t}" for t in p) for p in ps[:2]]
    by_text = oai.completions.create(model=MODEL, prompt=texts, max_tokens=6, temperature=0,
                                     extra_body={"ignore_eos": True})
    one_by_one = [oai.completions.create(model=MODEL, prompt=t, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
                  for t in texts]
    assert [c.text for c in by_text.choices] == one_by_one


def test_penalties_logit_bias_and_min_p_reach_the_engine(oai):
    """presence / frequency / logit_bias (OpenAI's), repetition_penalty and min_p (vLLM's
    extensions) give what the in-process engine gives with the same options (before: a 400
    unless neutral)."""
    (p,) = prompts(16, [12])
    pen = {"presence_penalty": -1.5, "frequency_penalty": 0.5}
    r = oai.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0, **pen,
                               extra_body={"ignore_eos": True, "repetition_penalty": 0.8})
    want = reference([p], 10, **pen, repetition_penalty=0.8)[0]
    assert r.choices[0].token_ids == want != reference([p], 10)[0]
    plain = reference([p], 10)[0]
    bias = {str(plain[0]): -100, "77": 2.5}
    r = oai.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0,
                               logit_bias=bias, extra_body={"ignore_eos": True, "min_p": 0.2})
    want = reference([p], 10, logit_bias={int(k): v for k, v in bias.items()}, min_p=0.2)[0]
    assert r.choices[0].token_ids == want and want[0] != plain[0]


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_asks(oai, tokenizer):
    """lm-eval's loglikelihood request (a batch of text prompts, echo, logprobs=1,
    max_tokens=1): each choice's text and logprobs start with its prompt's, the first prompt
    token without a logprob, the rest as the in-process engine's prompt logprobs; streamed
    the same (before: echo was a 400)."""
    from realexec import LLM, SamplingParams
    from tests.serving_helpers import TINY, TINY_KWARGS

    ps = prompts(17, [9, 14])
    texts = [" ".join(f"t{t}" for t in p) for p in ps]
    r = oai.completions.create(model=MODEL, prompt=texts, max_tokens=1, temperature=0,
                               logprobs=1, echo=True)
    engine = LLM(TINY, **TINY_KWARGS).generate(ps, SamplingParams(
        temperature=0, max_tokens=1, logprobs=1, prompt_logprobs=1))
    for p, text, choice, want in zip(ps, texts, r.choices, engine):
        lp = choice.logprobs
        assert choice.text == text + tokenizer.decode(choice.token_ids)
        assert lp.tokens == [f"t{t}" for t in p] + [tokenizer.decode(choice.token_ids)]
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert lp.token_logprobs[1:len(p)] == pytest.approx(
            [e[t] for e, t in zip(want.prompt_logprobs[1:], p[1:])], abs=1e-5)
        assert lp.text_offset[:3] == [0, len(lp.tokens[0]), len(lp.tokens[0]) + len(lp.tokens[1])]
    chunks = list(oai.completions.create(model=MODEL, prompt=texts, max_tokens=3, temperature=0,
                                         logprobs=1, echo=True, stream=True))
    for i, (p, text) in enumerate(zip(ps, texts)):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert "".join(c.text for c in mine).startswith(text)
        tokens = [t for c in mine for t in c.logprobs.tokens]
        offsets = [o for c in mine for o in c.logprobs.text_offset]
        assert len(tokens) == len(p) + 3 and offsets == sorted(offsets)
    for stream in (False, True):  # max_tokens 0: the prompt alone, scored
        r = oai.completions.create(model=MODEL, prompt=texts[1], max_tokens=0, logprobs=0,
                                   echo=True, stream=stream, **(
                                       {"stream_options": {"include_usage": True}} if stream
                                       else {}))
        chunks = list(r) if stream else [r]
        choices = [c.choices[0] for c in chunks if c.choices]
        assert "".join(c.text for c in choices) == texts[1]
        assert [t for c in choices for t in c.token_ids] == []
        assert [t for c in choices for t in c.logprobs.tokens] == [f"t{t}" for t in ps[1]]
        assert chunks[-1].usage.completion_tokens == 0
    plain = oai.completions.create(model=MODEL, prompt=ps[0], max_tokens=2, temperature=0,
                                   echo=True)
    assert plain.choices[0].text == tokenizer.decode(ps[0]) + tokenizer.decode(
        plain.choices[0].token_ids) and plain.choices[0].logprobs is None


def test_prompt_logprobs_in_vllms_shape_match_transformers(oai, tokenizer):
    """vLLM's `prompt_logprobs` field: on each completion choice (at the top of a chat
    response), None for the first prompt token, then {"id": {logprob, rank, decoded_token}} for
    the token and its position's k most likely, equal to log_softmax of HF's logits (rank: the
    tokens at least as likely, as vLLM counts); with echo, one engine pass serves both; streamed,
    a 400 naming the field."""
    import torch

    from tests.realexec_reference import hf_model
    from tests.serving_helpers import TINY

    (p,) = prompts(23, [11])
    with torch.no_grad():
        ref = hf_model(TINY)(torch.tensor([p])).logits[0].float().log_softmax(-1)

    def check(scored: list, k: int) -> None:
        assert len(scored) == len(p) and scored[0] is None
        for pos, row in enumerate(scored[1:]):
            tok, top = p[pos + 1], ref[pos].topk(k).indices.tolist()
            assert set(row) == {str(tok), *map(str, top)}
            for tid, e in row.items():
                assert e["logprob"] == pytest.approx(float(ref[pos, int(tid)]), abs=1e-4)
                assert e["decoded_token"] == tokenizer.decode([int(tid)])
            assert row[str(tok)]["rank"] == int((ref[pos] >= ref[pos, tok]).sum())
            if top:
                assert row[str(top[0])]["rank"] == 1

    r = oai.completions.create(model=MODEL, prompt=p, max_tokens=2, temperature=0, n=2,
                               extra_body={"prompt_logprobs": 2})
    for choice in r.choices:
        check(choice.model_extra["prompt_logprobs"], 2)
    both = oai.completions.create(model=MODEL, prompt=p, max_tokens=1, temperature=0, echo=True,
                                  logprobs=3, extra_body={"prompt_logprobs": 0})
    check(both.choices[0].model_extra["prompt_logprobs"], 0)
    assert len(both.choices[0].logprobs.top_logprobs[1]) == 3  # echo's own k
    chat = oai.chat.completions.create(model=MODEL, max_tokens=2, temperature=0, messages=[
        {"role": "user", "content": "x"}], extra_body={"prompt_token_ids": p, "prompt_logprobs": 1})
    check(chat.model_extra["prompt_logprobs"], 1)
    plain = oai.completions.create(model=MODEL, prompt=p, max_tokens=2, temperature=0)
    assert "prompt_logprobs" not in (plain.choices[0].model_extra or {})
    for bad, message in (({"prompt_logprobs": 1, "stream": True},
                          "'prompt_logprobs' is not available with 'stream': true"),
                         ({"prompt_logprobs": 21}, "prompt_logprobs")):
        with pytest.raises(openai.BadRequestError, match=message):
            oai.completions.create(model=MODEL, prompt=p, max_tokens=2,
                                   stream=bad.pop("stream", False), extra_body=bad)


def test_chat_through_the_tokenizers_chat_template(oai, tokenizer):
    """A tokenizer with a chat template (every real model's): the conversation is rendered
    by it, the assistant's turn opened (before: transformers 5's BatchEncoding was read as
    the token list, and every such chat request failed)."""
    tokenizer.chat_template = ("{% for m in messages %}t3 {{ m['content'] }} {% endfor %}"
                               "{% if add_generation_prompt %}t4{% endif %}")
    msgs = [{"role": "system", "content": "t10 t11"}, {"role": "user", "content": "t12"}]
    try:
        r = oai.chat.completions.create(model=MODEL, max_tokens=5, temperature=0,
                                        extra_body={"ignore_eos": True}, messages=msgs)
        tok = httpx.post(f"{oai.base_url}".removesuffix("/v1/") + "/tokenize",
                         json={"model": MODEL, "messages": msgs}).json()
    finally:
        tokenizer.chat_template = None
    assert tok["tokens"] == [3, 10, 11, 3, 12, 4]
    assert r.usage.prompt_tokens == 6
    assert r.choices[0].token_ids == reference([[3, 10, 11, 3, 12, 4]], 5)[0]


BAD_REQUESTS = [
    ({"model": "gpt-4", "prompt": [1, 2]}, "model", "does not exist"),
    ({"prompt": [1, 2]}, "model", "'model' is required"),
    ({"model": MODEL, "prompt": [1, 256]}, "prompt", "not a token id in [0, 256)"),
    ({"model": MODEL, "prompt": []}, "prompt", "empty"),
    ({"model": MODEL}, "prompt", "'prompt' is required"),
    ({"model": MODEL, "prompt": [[1], []]}, "prompt", "'prompt[1]' is empty"),
    ({"model": MODEL, "prompt": [[1], [2, 999]]}, "prompt", "'prompt[1][1]' = 999 is not a token id"),
    ({"model": MODEL, "prompt": [[1], [1] * 600]}, "prompt", "prompt[1] has 600 tokens"),
    ({"model": MODEL, "prompt": [[1], [1] * 500], "max_tokens": 20}, "max_tokens",
     "prompt[1] (500 tokens) + max_tokens (20) exceeds"),
    ({"model": MODEL, "prompt": [[1], "a"]}, "prompt", "a string or a list of token ids"),
    ({"model": MODEL, "prompt": [1, "a"]}, "prompt", "a string or a list of token ids"),
    ({"model": MODEL, "prompt": [1], "temperature": -0.5}, "temperature", "temperature must be >= 0"),
    ({"model": MODEL, "prompt": [1], "temperature": float("inf")}, "temperature", "finite"),
    ({"model": MODEL, "prompt": [1], "temperature": float("nan")}, "temperature", "finite"),
    ({"model": MODEL, "prompt": [1], "temperature": "0.5"}, "temperature", "must be a number"),
    ({"model": MODEL, "prompt": [1], "top_p": 0}, "top_p", "top_p must be > 0"),
    ({"model": MODEL, "prompt": [1], "top_p": 1.5}, "top_p", "top_p must be <= 1"),
    ({"model": MODEL, "prompt": [1], "top_k": -2}, "top_k", "top_k must be >= -1"),
    ({"model": MODEL, "prompt": [1], "max_tokens": 0}, "max_tokens",
     "max_tokens must be >= 1 (0 only with echo"),
    ({"model": MODEL, "prompt": [1], "max_tokens": "many"}, "max_tokens", "must be an integer"),
    ({"model": MODEL, "prompt": [1], "max_tokens": 5.0}, "max_tokens", "must be an integer"),
    ({"model": MODEL, "prompt": [1], "max_tokens": 600}, "max_tokens", "exceeds this model's context"),
    ({"model": MODEL, "prompt": [1] * 600}, "prompt", "this model's context is 512"),
    ({"model": MODEL, "prompt": [1], "min_tokens": 20, "max_tokens": 5}, "min_tokens", "<= max_tokens"),
    ({"model": MODEL, "prompt": [1], "n": 0}, "n", "n must be >= 1"),
    ({"model": MODEL, "prompt": [1], "logprobs": 21}, "logprobs", "logprobs must be <= 20"),
    ({"model": MODEL, "prompt": [1], "seed": 1180591620717411303424}, "seed", "<= 18446744073709551615"),
    ({"model": MODEL, "prompt": [1], "seed": -1}, "seed", "seed must be >= 0"),
    ({"model": MODEL, "prompt": [1], "stream": "no"}, "stream", "must be true or false"),
    ({"model": MODEL, "prompt": [1], "ignore_eos": "false"}, "ignore_eos", "must be true or false"),
    ({"model": MODEL, "prompt": [1], "stop_token_ids": ["a"]}, "stop_token_ids",
     "stop_token_ids[0] must be an integer"),
    ({"model": MODEL, "prompt": [1], "stop_token_ids": [300]}, "stop_token_ids", "not a token id"),
    ({"model": MODEL, "prompt": [1], "stop": [""]}, "stop", "non-empty strings"),
    ({"model": MODEL, "prompt": [1], "presence_penalty": 2.5}, "presence_penalty",
     "presence_penalty must be <= 2"),
    ({"model": MODEL, "prompt": [1], "frequency_penalty": -3}, "frequency_penalty",
     "frequency_penalty must be >= -2"),
    ({"model": MODEL, "prompt": [1], "repetition_penalty": 0}, "repetition_penalty",
     "repetition_penalty must be > 0"),
    ({"model": MODEL, "prompt": [1], "logit_bias": {"t5": 1}}, "logit_bias",
     "key 't5' is not a token id in [0, 256)"),
    ({"model": MODEL, "prompt": [1], "logit_bias": {"256": 1}}, "logit_bias", "not a token id"),
    ({"model": MODEL, "prompt": [1], "logit_bias": {"5": -101}}, "logit_bias",
     "logit_bias['5'] must be a number in [-100, 100]"),
    ({"model": MODEL, "prompt": [1], "logit_bias": {"5": "x"}}, "logit_bias", "must be a number"),
    ({"model": MODEL, "prompt": [1], "min_p": 1.5}, "min_p", "min_p must be <= 1"),
    ({"model": MODEL, "prompt": [1], "suffix": "x"}, "suffix", "not supported"),
    ({"model": MODEL, "prompt": [1], "stream_options": {"include_usage": 1}}, "stream_options",
     "must be true or false"),
]


@pytest.mark.parametrize("body, param, fragment", BAD_REQUESTS)
def test_bad_requests_get_400_with_an_openai_error_body(server, body, param, fragment):
    r = httpx.post(f"{server.base_url}/v1/completions", content=json.dumps(body),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert fragment in err["message"]


def test_a_top_k_past_the_vocabulary_is_off_however_large(server):
    """As vLLM reads it; (before: past 2^64 it was a 500, "could not send to engine-0")."""
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 6, "temperature": 1.0,
            "seed": 7, "ignore_eos": True}
    got = []
    for top_k in (0, 256, 2**70):
        r = httpx.post(f"{server.base_url}/v1/completions", json={**body, "top_k": top_k},
                       timeout=30)
        assert r.status_code == 200, r.text
        got.append(r.json()["choices"][0]["token_ids"])
    assert got[0] == got[1] == got[2]


def test_malformed_json_and_chat_errors_are_400(server, oai):
    r = httpx.post(f"{server.base_url}/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json={"model": MODEL, "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model="nope", prompt=[1], max_tokens=2)
    assert info.value.status_code == 400 and info.value.body["code"] == "model_not_found"


def test_models_health_and_metrics(server, oai):
    models = oai.models.list()
    assert [m.id for m in models.data] == [MODEL]
    h = httpx.get(f"{server.base_url}/health")
    assert h.status_code == 200 and h.json()["status"] == "ok"
    oai.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=4, temperature=0,
                           extra_body={"ignore_eos": True})
    r = httpx.get(f"{server.base_url}/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    # vLLM's names where vLLM has the metric, kvpd: for kvpd's own
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:time_per_output_token_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "kvpd:worker_up",
                 "kvpd:num_requests_in_flight"):
        assert f"\n{name}" in text, name
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(text)}
    ttft = next(s for s in fams["vllm:time_to_first_token_seconds"].samples
                if s.name.endswith("_count"))
    assert ttft.value >= 1 and ttft.labels == {"model_name": MODEL}
    queries = fams["vllm:prefix_cache_queries"].samples[0]
    assert queries.value >= 3 and queries.labels["worker"] == "engine-0"
    assert 'kvpd:worker_up{model_name="tiny",role="colocated",worker="engine-0"} 1.0' in text


def test_client_disconnect_aborts_and_frees_blocks(server):
    # The engine is paused (SIGSTOP) while the client goes away, so the request cannot finish
    # on its own first; the front end must abort it, and the engine frees it once resumed.
    client = server.client
    pid = client.workers["engine-0"].proc.pid
    (p,) = prompts(13, [40])
    body = {"model": MODEL, "prompt": p, "max_tokens": 450, "temperature": 0, "stream": True,
            "ignore_eos": True}
    aborted = client.metrics.finished["abort"]
    try:  # (paused() cannot span the SIGSTOP sent mid-stream below)
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=30) as r:
            got = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got.append(line)
                if len(got) == 3:
                    os.kill(pid, signal.SIGSTOP)
                    break
        assert len(got) == 3  # the connection closed mid-stream
        wait_for(lambda: not client.requests, 10, "the disconnected stream to be aborted")
        # a non-streaming request whose client gives up is aborted too
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.base_url}/v1/completions", timeout=0.5, json={**body, "stream": False})
        wait_for(lambda: not client.requests, 10, "the timed-out request to be aborted")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert client.metrics.finished["abort"] == aborted + 2
    wait_pools_whole(client)
    assert 'finished_reason="abort"' in httpx.get(f"{server.base_url}/metrics").text


@pytest.mark.slow
def test_dead_engine_gives_503_and_health_down(tokenizer):
    client = EngineClient(tiny_config()).start()
    srv = ServerThread(create_app(client, MODEL, tokenizer)).start()
    try:
        body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 400, "stream": True,
                "ignore_eos": True}
        # the engine is stopped before the request reaches it and killed while the stream is
        # open, so the request cannot finish first (killing it after the stream's second
        # event raced a tiny model's 400 tokens, and lost on a loaded machine)
        pid = client.workers["engine-0"].proc.pid
        os.kill(pid, signal.SIGSTOP)
        killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
        t_kill = time.monotonic() + 0.5
        killer.start()
        with httpx.stream("POST", f"{srv.base_url}/v1/completions", json=body, timeout=30) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        killer.join()
        assert time.monotonic() - t_kill < 10
        assert '"error"' in events[-2] and "engine-0 is down" in events[-2]
        assert events[-1] == "data: [DONE]"
        h = httpx.get(f"{srv.base_url}/health")
        assert h.status_code == 503 and h.json()["workers"]["engine-0"]["alive"] is False
        r = httpx.post(f"{srv.base_url}/v1/completions", json={**body, "stream": False})
        assert r.status_code == 503 and "engine is down" in r.json()["error"]["message"]
    finally:
        srv.stop()
        client.close()


def test_serve_command_rejects_bad_options(capsys):
    from kvpd.cli import main as kvpd_main

    assert kvpd_main(["serve", "--model", "tiny-llama", "--port", "70000"]) == 2
    assert "--port must be in [0, 65535]" in capsys.readouterr().err
    assert kvpd_main(["serve", "--model", "tiny-llama", "--pd", "1-1"]) == 2
    assert "--pd must look like P:D" in capsys.readouterr().err
    assert kvpd_main(["serve", "--model", "tiny-llama", "--tokenizer", "/nonexistent"]) == 2
    capsys.readouterr()
    assert kvpd_main(["serve", "--model", "tiny-llama", "--timeout-keep-alive", "0"]) == 2
    assert "--timeout-keep-alive must be > 0 s" in capsys.readouterr().err


@pytest.mark.slow
def test_kvpd_serve_pd_end_to_end_with_the_openai_client(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(tmp_path / "serve.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvpd.cli", "serve", "--model", "tiny-llama", "--port", str(port),
             "--pd", "1:1", "--num-gpu-blocks", "256", "--block-size", "4",
             "--max-num-batched-tokens", "64", "--served-model-name", MODEL, "--num-threads", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"

            def healthy():
                try:
                    return httpx.get(f"{url}/health", timeout=1).status_code == 200
                except httpx.HTTPError:
                    assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                    return False

            wait_for(healthy, 120, "kvpd serve to come up")
            oai = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            (p,) = prompts(14, [19])
            r = oai.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0,
                                       extra_body={"ignore_eos": True})
            assert r.choices[0].token_ids == reference([p], 6)[0]
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 0, (tmp_path / "serve.log").read_text()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


@pytest.mark.parametrize("content", [b"\xff\xfe\x00", b'{"a": 1}'])
def test_tokenizer_files_that_do_not_load_are_refused_before_any_worker(tmp_path, capsys,
                                                                       content):
    """(before: a bare UnicodeDecodeError, or a KeyError traceback from transformers)"""
    from kvpd.cli import main
    from realexec.engine.tokenizer import load_tokenizer

    (tmp_path / "tokenizer.json").write_bytes(content)
    with pytest.raises(ValueError, match=rf"{tmp_path}: its tokenizer files do not load"):
        load_tokenizer(tmp_path)
    assert main(["serve", "--model", "tiny-llama", "--tokenizer", str(tmp_path)]) == 2
    assert "its tokenizer files do not load" in capsys.readouterr().err
