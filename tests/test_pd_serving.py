"""Prefill/decode disaggregation across processes: KV transfer over ZeroMQ, greedy equality with
the colocated engine, lost transfers, back-pressure, bad KV messages and a killed decode worker."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import zmq

from realexec.serving.client import EngineClient, EngineDeadError
from realexec.serving.transport import encode
from tests.serving_helpers import (
    GREEDY,
    TINY,
    TINY_KWARGS,
    paused,
    prompts,
    reference,
    tiny_config,
    wait_for,
    wait_pools_whole,
)


def _mixed_prompts() -> list[list[int]]:
    base = prompts(20, [37])[0]
    # lengths across block boundaries, plus two prompts sharing base's prefix (decode-side
    # prefix-cache hits skip those tokens when writing the received KV)
    return [*prompts(21, [1, 4, 9, 16, 23, 64]), base, base[:32] + [7, 8, 9], base[:20]]


def _run(client: EngineClient, ps: list[list[int]], max_tokens: int) -> list:
    reqs = []
    for i, p in enumerate(ps):
        reqs.append(client.submit(p, {**GREEDY, "max_tokens": max_tokens}))
        if i == 6:  # base's KV lands (and is cached) before the prompts sharing its prefix
            assert reqs[-1].done.wait(60)
    for r in reqs:
        assert r.done.wait(60), f"{r.request_id} unfinished"
        assert r.error is None, r.error
    return reqs


def _check_equal_and_clean(client: EngineClient, ps, reqs, max_tokens: int) -> None:
    assert [r.token_ids for r in reqs] == reference(ps, max_tokens)
    wait_pools_whole(client)


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    client = EngineClient(tiny_config(pd=(1, 1), step_log_dir=str(tmp_path_factory.mktemp("steps"))))
    client.start()
    yield client
    client.close()


def test_workers_log_their_steps(pd):
    from realexec.serving.step_log import read_step_log

    logs = {w.role: os.path.join(pd.config.step_log_dir, f"{w.name}.steps.jsonl")
            for w in pd.workers.values()}
    offsets = {role: read_step_log(path)[1] for role, path in logs.items()}  # earlier tests'
    ps = prompts(22, [5, 17, 40])
    _run(pd, ps, 9)
    time.sleep(0.3)  # idle workers flush their logs
    pre = read_step_log(logs["prefill"], offsets["prefill"])[0]
    dec = read_step_log(logs["decode"], offsets["decode"])[0]
    # the prefill worker computed every prompt token (no shared prefixes) and no decodes;
    # the decode worker decoded every output token after the first and computed no prompt
    assert sum(s.shape.num_prefill_tokens for s in pre) == sum(map(len, ps))
    assert sum(s.shape.num_decode_reqs for s in pre) == 0
    assert sum(s.shape.num_decode_reqs for s in dec) == len(ps) * 8
    assert sum(s.shape.num_prefill_tokens for s in dec) == 0
    for steps in (pre, dec):  # one engine thread: steps follow one another
        assert all(s.duration_s > 0 for s in steps)
        assert all(a.t_end <= b.t_start + 1e-6 for a, b in zip(steps, steps[1:]))
        # the loop's host time before each step: measured, and (waits and idle iterations
        # excluded) never more than the gap since the previous step
        assert all(s.loop_s is not None and s.loop_s >= 0 for s in steps[1:])
        assert all(b.loop_s <= b.t_start - a.t_end + 2e-3 for a, b in zip(steps, steps[1:]))
    for role, path in logs.items():  # the loop's CPU time: there, and within its wall time
        with open(path, "rb") as f:
            f.seek(offsets[role])
            lines = [json.loads(x) for x in f.read().splitlines() if x.strip()]
        assert all("lc" in d and 0 <= d["lc"] <= d["l"] + 1e-3 for d in lines[1:] if "l" in d)
        assert sum("lc" in d for d in lines) >= len(lines) - 1
    # every prompt's KV was handed off by the prefill worker, in the step that finished it
    assert sum(s.handoffs for s in pre) == len(ps)
    assert sum(s.handoff_tokens for s in pre) == sum(map(len, ps))
    assert all(s.handoffs <= s.shape.num_prefill_reqs for s in pre)
    assert sum(s.handoffs for s in dec) == 0
    # and the decode worker wrote every prompt's KV into its pool before a step
    assert sum(s.landings for s in dec) == len(ps)
    assert sum(s.landing_tokens for s in dec) == sum(map(len, ps))
    assert sum(s.landings for s in pre) == 0


def test_pd_greedy_output_equals_colocated(pd):
    ps = _mixed_prompts()
    reqs = _run(pd, ps, 9)
    _check_equal_and_clean(pd, ps, reqs, 9)
    spec_bytes = pd.model_info["kv_bytes_per_token"]
    for r, p in zip(reqs[:8], ps):
        assert r.prefill_worker == "prefill-0" and r.decode_worker == "decode-0"
        kv = r.kv
        assert kv["bytes"] >= len(p) * spec_bytes and kv["transfer_s"] > 0 and kv["gbps"] > 0
        assert not kv.get("lost")
    # decode-side prefix hits: 8 whole blocks of base; all of base[:20] (the decode side
    # already has the first output token, so the whole prompt may come from its cache)
    assert reqs[7].kv["cached_tokens"] == 32 and reqs[8].kv["cached_tokens"] == 20
    stats = pd.workers_status()
    assert stats["prefill-0"]["stats"]["kv_acked"] >= len(ps), stats
    assert stats["decode-0"]["stats"]["kv_received"] >= len(ps), stats


def test_pd_penalties_equal_colocated(pd):
    """The decode worker penalizes with the whole history: the prompt and the first token,
    which the prefill worker sampled."""
    ps = prompts(16, [12, 30])
    pen = {"presence_penalty": -1.5, "frequency_penalty": 0.5, "repetition_penalty": 0.8}
    reqs = [pd.submit(p, {**GREEDY, "max_tokens": 10, **pen}) for p in ps]
    for r in reqs:
        assert r.done.wait(60) and r.error is None, r.error
    assert [r.token_ids for r in reqs] == reference(ps, 10, **pen) != reference(ps, 10)
    wait_pools_whole(pd)


def test_pd_prompt_logprobs_come_from_the_prefill_worker_once(pd):
    ps = prompts(18, [1, 13, 29])
    opts = {**GREEDY, "max_tokens": 4, "prompt_logprobs": 1, "logprobs": 0}
    reqs = [pd.submit(p, opts) for p in ps]
    for r in reqs:
        assert r.done.wait(60) and r.error is None, r.error
    from realexec import LLM
    want = LLM(TINY, **TINY_KWARGS).generate(ps, opts)
    for p, r, w in zip(ps, reqs, want):
        assert r.decode_worker == "decode-0" and len(r.prompt_logprobs) == len(p) - 1
        assert [e[0] for e in r.prompt_logprobs] == pytest.approx(
            [e[t] for e, t in zip(w.prompt_logprobs[1:], p[1:])], abs=1e-5)
        assert r.token_ids == w.token_ids and len(r.logprobs) == 4
    wait_pools_whole(pd)


def test_request_finishing_on_the_prefill_worker_is_never_handed_off(pd):
    r = pd.generate(prompts(22, [12])[0], {**GREEDY, "max_tokens": 1}, timeout_s=60)
    assert len(r.token_ids) == 1 and r.finish_reason == "length" and not r.kv
    wait_pools_whole(pd)


def test_abort_while_decoding_frees_both_pools(pd):
    aborted = pd.metrics.finished["abort"]
    it = pd.stream(prompts(23, [30])[0], {**GREEDY, "max_tokens": 400})
    assert [len(next(it).token_ids) for _ in range(4)] == [1, 1, 1, 1]  # 1st from prefill
    with paused(pd.workers["decode-0"].proc.pid):
        it.close()
    assert pd.metrics.finished["abort"] == aborted + 1
    wait_pools_whole(pd)
    assert not pd.requests


def test_garbled_kv_messages_are_rejected_and_serving_goes_on(pd):
    sock = pd.ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"intruder")
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(pd.workers["decode-0"].endpoints["kv"])
    bad_shape = encode("kv", {"request_id": "x", "num_tokens": 4, "block_size": 4,
                              "runs": [[0, 0, 0, 4]], "last": True, "t_send": 0.0,
                              "prefill_worker": "intruder"}, [__import__("torch").zeros(4, 3)])
    before = pd.workers_status()["decode-0"]["stats"]["num_bad_messages"]
    sock.send_multipart([b"\x00garbage"])
    sock.send_multipart([bytes(bad_shape[0])[:9]])  # truncated
    sock.send_multipart([bytes(memoryview(f)) for f in bad_shape])  # frame shape mismatch
    ps = prompts(24, [14, 27])
    reqs = _run(pd, ps, 6)
    sock.close()
    _check_equal_and_clean(pd, ps, reqs, 6)
    wait_for(lambda: pd.workers_status()["decode-0"]["stats"]["num_bad_messages"] == before + 3,
             5, "the decode worker to count three bad KV messages")


@pytest.mark.slow
def test_layerwise_transfer_with_two_prefill_workers_equals_colocated():
    with EngineClient(tiny_config(pd=(2, 1), kv_mode="layerwise")) as client:
        ps = _mixed_prompts()
        reqs = _run(client, ps, 9)
        _check_equal_and_clean(client, ps, reqs, 9)
        assert {r.prefill_worker for r in reqs} == {"prefill-0", "prefill-1"}
        assert all(r.kv["bytes"] > 0 and not r.kv.get("lost") for r in reqs)


@pytest.mark.parametrize("kv_mode", ["full", "layerwise"])
def test_an_mla_model_moves_its_latent_pool_and_equals_colocated(kv_mode):
    """DeepSeek's MLA caches one plane per layer (its latents; V3.2's indexer keys ride in the
    same row), not K and V: the prefill worker sends that plane, in one message or layer by
    layer as each layer's attention writes it. (Before, either mode killed the prefill worker.)"""
    model = "tiny-deepseek-v32"
    with EngineClient(tiny_config(model=model, pd=(1, 1), kv_mode=kv_mode)) as client:
        ps = prompts(26, [1, 9, 23, 40])  # past the indexer's 8 keys: sparse attention
        reqs = _run(client, ps, 7)
        assert [r.token_ids for r in reqs] == reference(ps, 7, model=model)
        wait_pools_whole(client)
        assert all(r.kv["bytes"] > 0 and not r.kv.get("lost") for r in reqs)


@pytest.mark.slow
def test_lost_kv_transfer_is_recomputed_on_the_decode_side():
    with EngineClient(tiny_config(pd=(1, 1), fault_drop_kv=True, kv_timeout_s=0.5)) as client:
        ps = prompts(25, [5, 18, 40])
        reqs = _run(client, ps, 8)
        _check_equal_and_clean(client, ps, reqs, 8)
        for r, p in zip(reqs, ps):
            assert r.kv["lost"] and r.kv["recomputed_tokens"] == len(p)
        stats = client.workers_status()
        assert stats["decode-0"]["stats"]["kv_lost"] == 3
        assert stats["prefill-0"]["stats"]["kv_nacked"] == 3  # the prefill side freed its copy
        # a prompt the decode side has cached whole needs no transfer: no timeout, no loss
        r = client.generate(ps[2][:20], {**GREEDY, "max_tokens": 8}, timeout_s=30)
        assert not r.kv.get("lost") and r.kv["cached_tokens"] == 20
        assert r.token_ids == reference([ps[2][:20]], 8)[0]
        wait_pools_whole(client)
        assert client.workers_status()["decode-0"]["stats"]["kv_lost"] == 3


@pytest.mark.slow
def test_full_decode_pool_back_pressures_and_every_request_completes():
    # 24 decode blocks of 4 tokens: a 40 + 20 token request needs 15, so at most one fits
    # whole; the prefill side must hold the rest of the KV until the decode side takes it
    cfg = tiny_config(pd=(1, 1), role_llm_kwargs={"decode": {"num_gpu_blocks": 24}})
    with EngineClient(cfg) as client:
        ps = prompts(26, [40, 40, 40, 40])
        with paused(client.workers["decode-0"].proc.pid):
            reqs = [client.submit(p, {**GREEDY, "max_tokens": 20}) for p in ps]
            since = time.perf_counter()
            wait_for(lambda: client.workers["prefill-0"].stats_at > since
                     and client.workers["prefill-0"].stats.get("kv_held") == 4, 30,
                     "the prefill worker to hold all four requests' KV")
        for r in reqs:
            assert r.done.wait(60) and r.error is None, r.error
        _check_equal_and_clean(client, ps, reqs, 20)
        stats = client.workers_status()
        assert stats["prefill-0"]["stats"]["kv_acked"] == 4
        assert stats["prefill-0"]["stats"]["kv_hold_timeouts"] == 0


@pytest.mark.slow
def test_killed_decode_worker_fails_its_requests_and_leaks_no_prefill_blocks():
    client = EngineClient(tiny_config(pd=(1, 1))).start()
    try:
        reqs = [client.submit(p, {**GREEDY, "max_tokens": 400}) for p in prompts(27, [10, 30])]
        wait_for(lambda: all(len(r.token_ids) > 2 for r in reqs), 60, "decoding to start")
        os.kill(client.workers["decode-0"].proc.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        for r in reqs:
            assert r.done.wait(10), "a request hung after its decode worker died"
        assert time.monotonic() - t_kill < 10
        assert all(r.finish_reason == "error" and "decode-0 is down" in r.error for r in reqs)
        status = client.workers_status()
        assert not status["decode-0"]["alive"] and "code -9" in status["decode-0"]["down"]
        assert status["prefill-0"]["alive"]
        wait_pools_whole(client)
        with pytest.raises(EngineDeadError, match="no decode worker is up"):
            client.submit([1, 2, 3], {"max_tokens": 2})
        assert not client.requests
    finally:
        client.close()


def test_tiny_kwargs_fit_the_mixed_prompts():
    # guard for the tests above: every prompt + output fits one worker's pool
    blocks = TINY_KWARGS["num_gpu_blocks"] * TINY_KWARGS["block_size"]
    assert sum(len(p) + 9 for p in _mixed_prompts()) < blocks


def test_llm_builds_a_prefill_or_decode_scheduler_and_names_a_bad_role():
    """A PD worker's engine is an `LLM` built with its role; a bad role is refused by name."""
    from realexec import LLM

    for role in ("prefill", "decode"):
        assert LLM(TINY, **{**TINY_KWARGS, "role": role}).scheduler.config.role == role
    with pytest.raises(ValueError, match="scheduler.role must be one of"):
        LLM(TINY, **{**TINY_KWARGS, "role": "both"})


def test_request_the_decode_pool_refuses_is_rejected_and_frees_the_prefill_blocks():
    # 24 decode blocks of 4 tokens (96 tokens): a 90 + 20 token request fits the prefill pool
    # but never the decode pool; the decode worker rejects it and releases the prefill KV at
    # once (not after the stale-KV timeout), and the next request is served
    cfg = tiny_config(pd=(1, 1), role_llm_kwargs={"decode": {"num_gpu_blocks": 24}})
    with EngineClient(cfg) as client:
        big, small = prompts(28, [90, 10])
        r = client.submit(big, {**GREEDY, "max_tokens": 20})
        assert r.done.wait(30)
        assert "decode-0 can never serve it" in (r.error or ""), (r.finish_reason, r.error)
        t0 = time.monotonic()
        wait_pools_whole(client)
        assert time.monotonic() - t0 < 5
        ok = client.submit(small, {**GREEDY, "max_tokens": 5})
        assert ok.done.wait(30) and ok.error is None and len(ok.token_ids) == 5
