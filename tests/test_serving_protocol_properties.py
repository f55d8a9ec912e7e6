"""Property-based tests of the OpenAI request parser (`realexec.serving.http.protocol`): any
JSON body a client sends is either refused as a 400 naming its field, or becomes a request the
engine takes: options `SamplingParams` accepts and that the ZeroMQ wire format can carry."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from realexec.serving.http.protocol import ApiError, child_sampling, parse_request
from realexec.serving.transport import decode, encode
from simulator.core.request import SamplingParams

VOCAB, MAX_LEN, SERVED = 256, 512, "tiny"
FIELDS = ["model", "prompt", "messages", "prompt_token_ids", "max_tokens",
          "max_completion_tokens", "temperature", "top_p", "top_k", "min_tokens", "seed", "n",
          "ignore_eos", "stop", "stop_token_ids", "logprobs", "top_logprobs", "stream",
          "stream_options", "presence_penalty", "frequency_penalty", "logit_bias", "best_of",
          "echo", "suffix", "user"]
# numbers at the edges the parser and the wire must both handle
EDGES = [0, 1, -1, 2, 20, 21, 128, 129, 255, 256, 511, 512, 2**31, 2**63 - 1, 2**63, 2**64 - 1,
         2**64, 2**70, -2**63 - 1, 0.5, -0.5, 1.5, 1e308, 1e-320]
scalars = (st.none() | st.booleans() | st.sampled_from(EDGES) | st.integers()
           | st.floats(allow_nan=False) | st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(["role", "content", "text", "type",
                                                         "include_usage", "x"]), inner,
                                        max_size=3), max_leaves=12)
bodies = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)


def _check(body: dict, chat: bool) -> None:
    raw = json.dumps(body).encode()
    try:
        parsed = parse_request(raw, chat=chat, served=SERVED, tokenizer=None, vocab_size=VOCAB,
                               max_model_len=MAX_LEN)
    except ApiError as exc:
        assert exc.status == 400 and exc.message
        assert set(exc.body()["error"]) == {"message", "type", "param", "code"}
        return
    assert parsed.prompts and (chat is False or len(parsed.prompts) == 1)
    for prompt in parsed.prompts:
        assert 1 <= len(prompt) <= MAX_LEN - 1
        assert all(0 <= t < VOCAB for t in prompt)
        for i in range(parsed.n):  # what each choice's engine request carries over the wire
            options = child_sampling(parsed, i)
            sp = SamplingParams.from_dict(options, "request")
            assert len(prompt) + sp.max_tokens <= MAX_LEN
            frames = encode("add", {"request_id": "r", "prompt_token_ids": prompt,
                                    "sampling": options})
            assert decode(frames).body["sampling"] == options


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, chat=st.booleans(), good=st.booleans())
@example(body={"top_k": 2**64}, chat=False, good=True)  # was a 500: msgpack cannot carry it
@example(body={"seed": 2**64 - 1, "n": 3}, chat=True, good=True)
def test_any_body_is_a_400_or_a_request_the_engine_takes(body: dict, chat: bool, good: bool):
    if good:  # a valid request with some fields replaced, so most reach the later checks
        base = ({"model": SERVED, "prompt_token_ids": [1, 2, 3]} if chat
                else {"model": SERVED, "prompt": [1, 2, 3]})
        body = {**base, "max_tokens": 4, **body}
    _check(body, chat)


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b"3", b'"x"', b"\xff\xfe",
                                 b'{"model": "tiny", "prompt": [1], "n": 1e999}'])
def test_bodies_that_are_not_json_objects_are_400s(raw):
    for chat in (False, True):
        with pytest.raises(ApiError) as info:
            parse_request(raw, chat=chat, served=SERVED, tokenizer=None, vocab_size=VOCAB,
                          max_model_len=MAX_LEN)
        assert info.value.status == 400
