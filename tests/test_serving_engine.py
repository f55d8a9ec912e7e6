"""The engine-core process over ZeroMQ and the front-end client: streaming, abort, bad input,
garbled messages and a killed engine."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time

import msgpack
import pytest
import zmq

from realexec.serving.client import AsyncEngineClient, EngineClient, EngineDeadError, RequestFailed
from realexec.serving.transport import PROTOCOL_VERSION, encode
from tests.serving_helpers import (
    GREEDY,
    RawEngine,
    paused,
    prompts,
    reference,
    tiny_config,
    wait_for,
    wait_pools_whole,
)


@pytest.fixture(scope="module")
def engine():
    client = EngineClient(tiny_config()).start()
    yield client
    client.close()


@pytest.fixture(scope="module")
def raw():
    eng = RawEngine()
    yield eng
    eng.close()


def test_streaming_through_engine_process_equals_in_process_greedy(engine):
    ps = prompts(1, [5, 17, 40, 3, 64])
    ref = reference(ps, 12)
    deltas: dict[str, list] = {}
    lock = threading.Lock()

    def sink(d):
        with lock:
            deltas.setdefault(d.request_id, []).append(d)

    reqs = [engine.submit(p, {**GREEDY, "max_tokens": 12}, request_id=f"s{i}", sink=sink)
            for i, p in enumerate(ps)]
    for r in reqs:
        assert r.done.wait(60), r.request_id
    assert [r.token_ids for r in reqs] == ref
    for r in reqs:
        assert r.finish_reason == "length" and r.error is None
        got = deltas[r.request_id]
        assert got[-1].finished and sum(len(d.token_ids) for d in got) == 12
        assert len(got) >= 12  # streamed one step at a time, not in one piece at the end
        times = r.token_times
        assert len(times) == 12 and times[0] > r.t_submit
        assert all(a <= b for a, b in zip(times, times[1:]))
    wait_pools_whole(engine)


def test_sync_stream_iterator_closed_early_aborts(engine):
    aborted = engine.metrics.finished["abort"]
    it = engine.stream(prompts(2, [9])[0], {**GREEDY, "max_tokens": 400})
    got = [next(it) for _ in range(3)]
    assert all(len(d.token_ids) == 1 and not d.finished for d in got)
    with paused(engine.workers["engine-0"].proc.pid):
        it.close()
        assert not engine.requests and engine.metrics.finished["abort"] == aborted + 1
    wait_pools_whole(engine)


def test_async_client_streams_and_cancelling_aborts(engine):
    aclient = AsyncEngineClient(engine)
    (p,) = prompts(3, [11])
    pid = engine.workers["engine-0"].proc.pid
    aborted = engine.metrics.finished["abort"]

    async def main():
        whole = await aclient.generate(p, {**GREEDY, "max_tokens": 6})
        seen = []
        async for d in aclient.stream(p, {**GREEDY, "max_tokens": 400}):
            seen.append(d)
            if len(seen) == 2:
                os.kill(pid, signal.SIGSTOP)
                break  # the dropped generator is closed by the loop, which aborts the request
        while engine.requests:
            await asyncio.sleep(0.01)
        os.kill(pid, signal.SIGCONT)
        task = asyncio.ensure_future(aclient.generate(p, {**GREEDY, "max_tokens": 400}, "c"))
        while not (engine.requests.get("c") and engine.requests["c"].token_ids):
            await asyncio.sleep(0.01)
        os.kill(pid, signal.SIGSTOP)
        task.cancel()
        try:
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            os.kill(pid, signal.SIGCONT)
        return whole, seen

    whole, seen = asyncio.run(main())
    assert whole.token_ids == reference([p], 6)[0]
    assert [d.token_ids[0] for d in seen] == whole.token_ids[:2]
    assert engine.metrics.finished["abort"] == aborted + 2
    wait_pools_whole(engine)
    assert not engine.requests


def test_invalid_requests_fail_with_a_clear_error(engine):
    with pytest.raises(RequestFailed, match=r"prompt_token_ids\[1\] = 999 is outside the vocabulary"):
        engine.generate([5, 999], {"max_tokens": 3}, timeout_s=30)
    with pytest.raises(RequestFailed, match="temperature must be >= 0"):
        engine.generate([5, 6], {"temperature": -1.0}, timeout_s=30)
    with pytest.raises(RequestFailed, match="n must be 1"):
        engine.generate([5, 6], {"n": 2}, timeout_s=30)
    ok = engine.generate([5, 6], {**GREEDY, "max_tokens": 3}, timeout_s=30)
    assert len(ok.token_ids) == 3


def test_frontend_rejects_garbled_worker_messages(engine, caplog):
    sock = engine.ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(engine.output_addr)
    before = engine.num_bad_messages
    with caplog.at_level(logging.WARNING, logger="kvpd.client"):
        sock.send_multipart([b"\x00\xffnot msgpack"])
        sock.send_multipart(encode("heartbeat", {"worker": "nobody", "t_wall": 0.0, "stats": {}}))
        r = engine.generate(prompts(4, [7])[0], {**GREEDY, "max_tokens": 5}, timeout_s=30)
    sock.close()
    assert len(r.token_ids) == 5
    wait_for(lambda: engine.num_bad_messages == before + 2, 5, "both bad messages to be counted")
    assert "rejected a message" in caplog.text and "unknown worker 'nobody'" in caplog.text


def test_engine_rejects_garbled_and_truncated_messages_and_keeps_serving(raw):
    (p,) = prompts(5, [13])
    raw.send("add", {"request_id": "a", "prompt_token_ids": p, "sampling": {**GREEDY, "max_tokens": 20}})
    good = encode("add", {"request_id": "b", "prompt_token_ids": p, "sampling": {**GREEDY, "max_tokens": 4}})
    raw.send_frames([b"\x93\x01\x02"])  # msgpack of a list, not a map
    raw.send_frames([bytes(good[0])[:10]])  # truncated header
    raw.send_frames([bytes(encode("add", {"request_id": "c", "prompt_token_ids": [1],
                                          "sampling": {}}, [])[0]), b"\x00" * 12])  # stray frame
    raw.send_frames([msgpack.packb({"v": PROTOCOL_VERSION, "type": "add", "body": {"request_id": 7},
                                    "tensors": []})])  # wrong field type
    raw.send_frames([bytes(b) for b in good])
    toks_a, fin_a, _ = raw.items_until("a", 60)
    toks_b, fin_b, msg = raw.items_until("b", 60)
    ref = reference([p], 20)[0]
    assert toks_a == ref and fin_a["fin"] == "length"
    assert toks_b == ref[:4] and fin_b["fin"] == "length"
    hb = raw.recv(5, lambda m: m.type == "heartbeat")
    assert hb.body["stats"]["num_bad_messages"] == 4
    assert hb.body["stats"]["num_free_blocks"] == hb.body["stats"]["num_gpu_blocks"]


def test_a_request_the_worker_cannot_decode_is_ended_with_the_reason(raw, engine):
    """An add message whose fields are wrong but whose request id is readable gets an error
    item for that id (before: the worker only logged it, and the front end's request waited
    forever); the front end refuses such prompts before sending."""
    raw.send_frames([msgpack.packb({"v": PROTOCOL_VERSION, "type": "add", "body": {
        "request_id": "d", "prompt_token_ids": ["input_ids"], "sampling": {}}, "tensors": []})])
    msg = raw.recv(30, lambda m: m.type == "outputs" and any(
        it["id"] == "d" for it in m.body["items"]))
    (item,) = [it for it in msg.body["items"] if it["id"] == "d"]
    assert "the worker rejected the request" in item["err"]
    assert "prompt_token_ids" in item["err"]
    with pytest.raises(ValueError, match="prompt_token_ids must be a non-empty list of integers"):
        engine.submit(["input_ids", "attention_mask"], {"max_tokens": 2})
    with pytest.raises(ValueError, match="non-empty list of integers"):
        engine.submit([5, True], {"max_tokens": 2})


def test_abort_frees_blocks_before_the_next_step(raw):
    p1, p2 = prompts(6, [30, 12])
    sp = {**GREEDY, "max_tokens": 300}
    raw.send("add", {"request_id": "long", "prompt_token_ids": p1, "sampling": sp})
    raw.send("add", {"request_id": "other", "prompt_token_ids": p2, "sampling": {**GREEDY, "max_tokens": 40}})
    got = 0
    while got < 3:
        msg = raw.recv(60, lambda m: m.type == "outputs")
        got += sum(len(it["tok"]) for it in msg.body["items"] if it["id"] == "long")
    blocks_other = -(-(len(p2) + 40) // raw.model["block_size"])
    raw.send("abort", {"request_ids": ["long"]})
    msg = raw.recv(30, lambda m: m.type == "outputs" and any(
        it["id"] == "long" and it["fin"] for it in m.body["items"]))
    item = next(it for it in msg.body["items"] if it["id"] == "long")
    assert item["fin"] == "abort"
    # the message that reports the abort carries the stats after at most one more step: by
    # then only the other request's blocks are in use
    stats = msg.body["stats"]
    assert stats["num_gpu_blocks"] - stats["num_free_blocks"] <= blocks_other
    toks, fin, _ = raw.items_until("other", 60)
    assert fin["fin"] == "length"


@pytest.mark.slow
def test_killed_engine_fails_its_requests_and_is_reported_down():
    client = EngineClient(tiny_config()).start()
    try:
        reqs = [client.submit(p, {**GREEDY, "max_tokens": 450}) for p in prompts(7, [8, 20, 5])]
        wait_for(lambda: all(r.token_ids for r in reqs), 60, "first tokens")
        t_kill = time.monotonic()
        os.kill(client.workers["engine-0"].proc.pid, signal.SIGKILL)
        for r in reqs:
            assert r.done.wait(10), "a request hung after its engine died"
        assert time.monotonic() - t_kill < 10
        for r in reqs:
            assert r.finish_reason == "error"
            assert "engine-0 is down" in r.error and "code -9" in r.error
        status = client.workers_status()["engine-0"]
        assert not status["alive"] and "code -9" in status["down"]
        assert not client.is_healthy()
        with pytest.raises(EngineDeadError, match="no colocated worker is up"):
            client.submit([1, 2, 3], {"max_tokens": 2})
    finally:
        client.close()


@pytest.mark.parametrize("model", ["tiny-qwen3-next", "tiny-nemotron-h"])
def test_a_linear_attention_model_serves_through_the_engine_process(model):
    """Qwen3-Next's Gated DeltaNet states, and Nemotron-H's Mamba-2 states, live in the engine
    process's runner: streamed greedy outputs equal the in-process engine's, and the pool is
    whole afterwards."""
    ps = prompts(3, [6, 19, 33])
    with EngineClient(tiny_config(model=model)) as client:
        reqs = [client.submit(p, {**GREEDY, "max_tokens": 8}) for p in ps]
        for r in reqs:
            assert r.done.wait(60) and r.error is None, r.error
        assert [r.token_ids for r in reqs] == reference(ps, 8, model=model)
        wait_pools_whole(client)  # (each request's state blocks returned with its KV)
