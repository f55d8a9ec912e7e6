"""What clients use, and what hostile or careless ones send: body limits, strict requests that
leak nothing, OpenAI error shapes for every error, the API key, /version, /tokenize,
/detokenize, `n` choices, logprobs checked against transformers, the access log."""

from __future__ import annotations

import json
import logging
import os
import signal

import httpx
import openai
import pytest
import torch

from realexec.serving.client import EngineClient
from realexec.serving.http.server import ServerOptions, ServerThread, create_app
from tests.serving_helpers import (
    TINY,
    TINY_KWARGS,
    prompts,
    reference,
    tiny_config,
    wait_for,
    wait_pools_whole,
)
from tests.test_serving_http import BAD_REQUESTS

MODEL = "tiny"
LIMIT = 20_000  # --max-request-bytes of the test server


@pytest.fixture(scope="module")
def client():
    c = EngineClient(tiny_config()).start()
    yield c
    c.close()


@pytest.fixture(scope="module")
def server(client, tokenizer):
    srv = ServerThread(create_app(client, MODEL, tokenizer,
                                  ServerOptions(max_request_bytes=LIMIT))).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _err(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_bodies_over_the_limit_get_413_without_being_read(server, oai):
    big = json.dumps({"model": MODEL, "prompt": [5] * 10_000, "max_tokens": 1}).encode()
    assert len(big) > LIMIT
    err = _err(httpx.post(f"{server.base_url}/v1/completions", content=big,
                          headers={"content-type": "application/json"}), 413)
    assert err["code"] == "request_too_large" and str(LIMIT) in err["message"]

    def chunked():  # no Content-Length: refused once LIMIT bytes arrived
        for i in range(0, len(big), 4096):
            yield big[i:i + 4096]

    err = _err(httpx.post(f"{server.base_url}/v1/completions", content=chunked(),
                          headers={"content-type": "application/json"}), 413)
    assert err["code"] == "request_too_large"
    r = oai.completions.create(model=MODEL, prompt=[5, 6], max_tokens=2)  # still serving
    assert len(r.choices[0].token_ids) == 2


def test_unknown_routes_and_methods_answer_in_openai_shape(server):
    err = _err(httpx.get(f"{server.base_url}/v1/nope"), 404)
    assert "Invalid URL (GET /v1/nope)" in err["message"] and err["param"] is None
    err = _err(httpx.get(f"{server.base_url}/v1/completions"), 405)
    assert "GET" in err["message"]
    err = _err(httpx.post(f"{server.base_url}/v1/completions", content=b"{nope",
                          headers={"content-type": "application/json"}), 400)
    assert "not valid JSON" in err["message"]
    err = _err(httpx.post(f"{server.base_url}/v1/completions", json=[1, 2]), 400)
    assert "JSON object" in err["message"]


def test_every_class_of_bad_input_leaks_nothing(server, client):
    """Bad bodies, oversized ones, wrong routes, valid requests whose clients vanish
    mid-stream, and choices cut by stop strings: afterwards nothing is in flight and every
    worker's pool is whole (KV usage 0)."""
    url = server.base_url
    for body, param, fragment in BAD_REQUESTS:
        r = httpx.post(f"{url}/v1/completions", content=json.dumps(body),
                       headers={"content-type": "application/json"})
        assert r.status_code == 400
        if param in ("prompt", "suffix", "logprobs") or "prompt[" in fragment:
            continue  # completions-only fields, batches of prompts
        r = httpx.post(f"{url}/v1/chat/completions", content=json.dumps(
            {**body, "messages": [{"role": "user", "content": "t5"}]}),
            headers={"content-type": "application/json"})
        assert r.status_code == 400
    httpx.post(f"{url}/v1/completions", content=b"x" * (LIMIT + 1))
    httpx.post(f"{url}/v1/completions", content=b"\xff\xfe")
    httpx.delete(f"{url}/v1/completions")
    (p,) = prompts(40, [12])
    body = {"model": MODEL, "prompt": p, "max_tokens": 400, "ignore_eos": True, "n": 2}
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as r:
        for i, _ in enumerate(r.iter_lines()):  # a streaming client that leaves
            if i == 3:
                break
    # a waiting client that gives up: 2 x 500 tokens (the tiny model's 512-token context less
    # the prompt) take the engine 500 steps, 0.35 s on a fast host, 7x the client's 50 ms; at
    # 2 x 400 tokens and 0.3 s that host finished first (0.28 s)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 500}, timeout=0.05)
    for n in (1, 3):  # stop strings end choices early; the largest seed wraps for siblings
        r = httpx.post(f"{url}/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": "t5 t6", "max_tokens": 30, "n": n, "seed": 2**64 - 1,
            "stop": ["t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9"]})
        assert r.status_code == 200 and len(r.json()["choices"]) == n
    wait_for(lambda: not client.requests, 20, "every request to end")
    metrics = httpx.get(f"{url}/metrics").text
    assert 'kvpd:num_requests_in_flight{model_name="tiny"} 0.0' in metrics
    status = wait_pools_whole(client)
    assert all(w["stats"]["kv_usage"] == 0 for w in status.values())


def test_api_key_guards_all_but_health_metrics_and_version(client):
    srv = ServerThread(create_app(client, MODEL, options=ServerOptions(api_key="s3cret"))).start()
    try:
        url = srv.base_url
        err = _err(httpx.get(f"{url}/v1/models"), 401)
        assert err["code"] == "invalid_api_key"
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        for path in ("/health", "/metrics", "/version"):
            assert httpx.get(url + path).status_code == 200
        ok = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0)
        assert [m.id for m in ok.models.list().data] == [MODEL]
        bad = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model=MODEL, prompt=[5], max_tokens=1)
    finally:
        srv.stop()


def test_version_tokenize_and_detokenize(server, tokenizer):
    from kvpd import __version__

    assert httpx.get(f"{server.base_url}/version").json() == {"version": __version__}
    r = httpx.post(f"{server.base_url}/tokenize", json={"model": MODEL, "prompt": "t7 t9 t11"})
    assert r.json() == {"count": 3, "max_model_len": 512, "tokens": [7, 9, 11]}
    r = httpx.post(f"{server.base_url}/tokenize",
                   json={"messages": [{"role": "user", "content": "t7"}]})
    assert r.json()["tokens"] == tokenizer.encode("<|user|>\nt7\n<|assistant|>\n",
                                                  add_special_tokens=False)
    r = httpx.post(f"{server.base_url}/detokenize", json={"tokens": [7, 9, 11]})
    assert r.json() == {"prompt": "t7 t9 t11"}
    err = _err(httpx.post(f"{server.base_url}/detokenize", json={"tokens": [1, 999]}), 400)
    assert err["param"] == "tokens"
    err = _err(httpx.post(f"{server.base_url}/tokenize", json={"prompt": 5}), 400)
    assert err["param"] == "prompt"


def test_routes_without_a_tokenizer(client):
    srv = ServerThread(create_app(client, MODEL)).start()
    try:
        _err(httpx.post(f"{srv.base_url}/tokenize", json={"prompt": "t5"}), 404)
    finally:
        srv.stop()


def test_n_choices_plain_and_streamed(oai):
    (p,) = prompts(41, [7])
    ref = reference([p], 6)[0]
    r = oai.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0, n=3,
                               extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.token_ids == ref for c in r.choices)  # greedy: the same three times
    assert r.usage.completion_tokens == 18
    seeded = oai.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=1.0, n=2,
                                    seed=7, extra_body={"ignore_eos": True})
    again = oai.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=1.0, n=2,
                                   seed=7, extra_body={"ignore_eos": True})
    assert [c.token_ids for c in seeded.choices] == [c.token_ids for c in again.choices]
    assert seeded.choices[0].token_ids != seeded.choices[1].token_ids  # seed, seed + 1
    chunks = list(oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=6, temperature=0,
        n=2, stream=True, extra_body={"prompt_token_ids": p, "ignore_eos": True}))
    got: dict[int, list[int]] = {0: [], 1: []}
    for c in chunks:
        for ch in c.choices:
            got[ch.index].extend(ch.token_ids)
    assert got == {0: ref, 1: ref}
    finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert finishes == ["length", "length"]


def _hf_logprobs(prompt: list[int], out: list[int]) -> torch.Tensor:
    """transformers' log-softmax of the same tiny model at each generated position."""
    from realexec.engine.llm import LLM

    model = LLM(TINY, **TINY_KWARGS).loaded.model
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + out])).logits[0].float()
    return logits.log_softmax(-1)[len(prompt) - 1: len(prompt) - 1 + len(out)]


def test_logprobs_match_transformers_in_completions_and_chat(oai, server):
    (p,) = prompts(42, [9])
    r = oai.completions.create(model=MODEL, prompt=p, max_tokens=5, temperature=0, logprobs=3,
                               extra_body={"ignore_eos": True})
    toks = r.choices[0].token_ids
    want = _hf_logprobs(p, toks)
    lp = r.choices[0].logprobs
    assert lp.tokens == [f"t{t}" for t in toks]
    for j, t in enumerate(toks):
        assert lp.token_logprobs[j] == pytest.approx(float(want[j, t]), abs=1e-4)
        top = want[j].topk(3)
        assert list(lp.top_logprobs[j]) == [f"t{i}" for i in top.indices.tolist()]
        assert list(lp.top_logprobs[j].values()) == pytest.approx(top.values.tolist(), abs=1e-4)
        assert float(want[j, t]) == pytest.approx(float(top.values[0]), abs=1e-6)  # greedy
    chat = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5, temperature=1.0,
        seed=3, logprobs=True, top_logprobs=2, extra_body={"prompt_token_ids": p, "ignore_eos": True})
    toks = chat.choices[0].token_ids
    want = _hf_logprobs(p, toks)
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content] == [f"t{t}" for t in toks]
    for j, (c, t) in enumerate(zip(content, toks)):
        assert c.logprob == pytest.approx(float(want[j, t]), abs=1e-4)  # raw, before temperature
        assert [x.logprob for x in c.top_logprobs] == pytest.approx(want[j].topk(2).values.tolist(), abs=1e-4)
    streamed = list(oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5, temperature=1.0,
        seed=3, logprobs=True, top_logprobs=2, stream=True,
        extra_body={"prompt_token_ids": p, "ignore_eos": True}))
    assert [x.logprob for c in streamed if c.choices and c.choices[0].logprobs
            for x in c.choices[0].logprobs.content] == pytest.approx([c.logprob for c in content])
    plain = oai.completions.create(model=MODEL, prompt=p, max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_an_access_log_line_per_request(server, caplog):
    caplog.set_level(logging.INFO, logger="kvpd.access")
    httpx.get(f"{server.base_url}/v1/models")
    httpx.post(f"{server.base_url}/v1/completions", json={"model": "x", "prompt": [1]})
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json={
            "model": MODEL, "prompt": [5], "max_tokens": 3, "stream": True}) as r:
        r.read()
    want = ['"GET /v1/models" 200', '"POST /v1/completions" 400', '"POST /v1/completions" 200']

    def in_order() -> bool:  # a line of an earlier test's request may land first: skip it
        lines = iter(x.getMessage() for x in caplog.records if x.name == "kvpd.access")
        return all(any(w in line for line in lines) for w in want)

    wait_for(in_order, 5, "the three requests' access-log lines, in order")


def test_the_advertised_context_is_what_fits_the_pool(client):
    from realexec.serving.startup import fit_max_model_len

    info = {"engine-0": {"max_model_len": 512, "num_gpu_blocks": 40, "block_size": 4}}
    assert fit_max_model_len(info, None)[0] == 160 and "lowered" in fit_max_model_len(info, None)[1]
    with pytest.raises(ValueError, match="--max-model-len 512 is larger than the 160 tokens"):
        fit_max_model_len(info, 512)
    assert fit_max_model_len({"e": {**info["engine-0"], "num_gpu_blocks": 128}}, None) == (512, None)
    srv = ServerThread(create_app(client, MODEL, options=ServerOptions(max_model_len=160))).start()
    try:
        assert httpx.get(f"{srv.base_url}/v1/models").json()["data"][0]["max_model_len"] == 160
        err = _err(httpx.post(f"{srv.base_url}/v1/completions",
                              json={"model": MODEL, "prompt": [5] * 200}), 400)
        assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    finally:
        srv.stop()


def test_stale_socket_folders_of_dead_front_ends_are_removed(tmp_path):
    import subprocess
    import sys

    from realexec.serving.ipc_dir import remove_stale

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"kvpd-{gone.pid}-abc123"
    live = tmp_path / f"kvpd-{os.getpid()}-def456"
    other = tmp_path / "kvpd-prof-xyz"
    for d in (stale, live, other):
        d.mkdir()
        (d / "engine-0-in").write_text("")
    assert remove_stale(str(tmp_path)) == [stale]
    assert not stale.exists() and live.exists() and other.exists()


def test_a_stalled_worker_is_unhealthy_then_taken_back(tokenizer):
    cfg = tiny_config(heartbeat_timeout_s=1.0, worker_kill_timeout_s=120.0)
    with EngineClient(cfg) as c:
        srv = ServerThread(create_app(c, MODEL, tokenizer)).start()
        try:
            pid = c.workers["engine-0"].proc.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                wait_for(lambda: httpx.get(f"{srv.base_url}/health").status_code == 503, 10,
                         "/health to say 503")
                assert httpx.get(f"{srv.base_url}/health").json()["workers"]["engine-0"]["stalled"]
                r = httpx.post(f"{srv.base_url}/v1/completions",
                               json={"model": MODEL, "prompt": [5], "max_tokens": 2})
                assert r.status_code == 503
            finally:
                os.kill(pid, signal.SIGCONT)
            wait_for(lambda: httpx.get(f"{srv.base_url}/health").status_code == 200, 10,
                     "the worker to be taken back")
            r = httpx.post(f"{srv.base_url}/v1/completions", timeout=60,
                           json={"model": MODEL, "prompt": [5], "max_tokens": 2})
            assert r.status_code == 200 and c.workers["engine-0"].proc.pid == pid
        finally:
            srv.stop()
