"""Trace replay: synthetic prompts, transforms, targets, and the simulator's output files."""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

import workloads
from kvpd.cli import main as kvpd_main
from realexec.serving.replay.runner import parse_target, prepare_trace, replay, synth_prompts
from simulator.metrics import request_records, summarize
from tests.serving_helpers import TINY, TINY_KWARGS, reference, tiny_config


def _trace(with_hashes: bool = True) -> workloads.Trace:
    hashes = workloads.Ragged.from_lists([[1, 2, 3], [1, 2, 9], [4], [1, 2, 3, 5, 6], [7, 8]])
    return workloads.Trace(
        arrival_s=np.array([0.0, 0.05, 0.1, 0.3, 0.35]),
        prompt_len=np.array([10, 12, 3, 17, 6]),
        output_len=np.array([4, 6, 3, 5, 7]),
        name="small",
        hash_ids=hashes if with_hashes else None,
        hash_block_size=4 if with_hashes else None,
    )


def test_parse_target():
    assert parse_target("inproc") == ("inproc", None)
    assert parse_target("engine") == ("engine", None)
    assert parse_target("pd:2:1") == ("pd", (2, 1))
    assert parse_target("http://127.0.0.1:8000/") == ("http", "http://127.0.0.1:8000")
    with pytest.raises(ValueError, match="--target must be"):
        parse_target("gpu")
    with pytest.raises(ValueError, match="P:D"):
        parse_target("pd:x")


def test_synthetic_prompts_share_prefixes_where_the_trace_shares_hash_ids():
    t = _trace()
    a, b = synth_prompts(t, 256, seed=3), synth_prompts(t, 256, seed=3)
    assert a == b  # seeded
    assert [len(p) for p in a] == t.prompt_len.tolist()
    assert a[0][:8] == a[1][:8] and a[0][8:10] != a[1][8:10]  # blocks 1, 2 shared; 3 vs 9 not
    assert a[3][:10] == a[0][:10]  # the same hash ids 1, 2, 3
    assert all(0 <= x < 256 for p in a for x in p)
    assert synth_prompts(t, 256, seed=4)[0] != a[0]
    plain = synth_prompts(_trace(with_hashes=False), 256, seed=3)
    assert plain[0][:8] != plain[1][:8]
    ids = workloads.Ragged.from_lists([[5] * n for n in t.prompt_len.tolist()])
    own = synth_prompts(t.replace(prompt_token_ids=ids), 256)
    assert own[2] == [5, 5, 5]
    bad = workloads.Ragged.from_lists([[300] * n for n in t.prompt_len.tolist()])
    with pytest.raises(ValueError, match="trace row 0: prompt token id 300"):
        synth_prompts(t.replace(prompt_token_ids=bad), 256)


def test_prepare_trace_applies_transforms_and_fits_the_context():
    t = prepare_trace(_trace(), time_scale=2.0, max_model_len=12)
    assert t.arrival_s[-1] == pytest.approx(0.7)
    assert (t.prompt_len + t.output_len <= 12).all() and (t.output_len >= 1).all()
    assert t.prompt_len.max() == 11
    t = prepare_trace(_trace(), window_s=(0.0, 0.2), scale_output=2.0)
    assert len(t) == 3 and t.output_len.tolist() == [8, 12, 6]
    with pytest.raises(ValueError, match="no requests left"):
        prepare_trace(_trace(), window_s=(5.0, 6.0))


def test_inproc_replay_writes_the_simulators_files(tmp_path):
    import torch

    from realexec.engine.llm import LLM

    trace = _trace()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = replay(trace, "inproc", llm=LLM(TINY, **TINY_KWARGS), seed=1)
    finally:
        torch.set_num_threads(threads)
    ps = synth_prompts(trace, 256, seed=1)
    assert res.outputs == [reference([p], n)[0] for p, n in zip(ps, trace.output_len.tolist())]
    s = res.summary
    assert s["requests"]["finished"] == 5 and s["tokens"]["output"] == int(trace.output_len.sum())
    assert s["backend"]["kind"] == "real-serving" and s["backend"]["target"] == "inproc"
    assert s["ttft_s"]["mean"] > 0 and s["e2e_s"]["max"] >= s["ttft_s"]["max"]
    assert s["kv"]["prefix_hit_rate"] > 0  # rows 0, 1 and 3 share hash-id blocks
    sim_keys = set(summarize(res.requests))
    assert sim_keys <= set(s)
    paths = res.write(tmp_path)
    assert [p.name for p in paths] == ["summary.json", "requests.parquet"]
    assert json.loads((tmp_path / "summary.json").read_text())["requests"]["total"] == 5
    cols = pq.read_table(tmp_path / "requests.parquet").column_names
    assert set(request_records(res.requests)) <= set(cols)
    assert res.records["arrival_s"].tolist() == pytest.approx(trace.arrival_s.tolist(), abs=0.05)


def test_inproc_replay_keeps_each_requests_preemptions():
    """A pool too small for the burst preempts (recompute); the per-request records add up to
    the scheduler's own counter."""
    import torch

    from realexec.engine.llm import LLM

    trace = workloads.Trace(arrival_s=np.zeros(6), prompt_len=np.full(6, 12),
                            output_len=np.full(6, 20), name="burst")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = LLM(TINY, **{**TINY_KWARGS, "num_gpu_blocks": 24})
        res = replay(trace, "inproc", llm=llm, seed=1)
    finally:
        torch.set_num_threads(threads)
    assert res.summary["requests"]["finished"] == 6
    assert llm.scheduler.num_preemptions > 0
    assert int(res.records["preemptions"].sum()) == llm.scheduler.num_preemptions
    assert res.summary["preemptions"] == llm.scheduler.num_preemptions


def test_engine_and_http_replays_keep_each_requests_preemptions():
    """Through the ZMQ front end, then over HTTP (the finishing chunk's `kvpd` field): the
    worker reports each request's preemptions when it finishes, and they add up to the
    worker's own counter."""
    import httpx

    from realexec.serving.client import EngineClient
    from realexec.serving.http.server import ServerThread, create_app

    trace = workloads.Trace(arrival_s=np.zeros(6), prompt_len=np.full(6, 12),
                            output_len=np.full(6, 20), name="burst")
    cfg = tiny_config(llm_kwargs={**TINY_KWARGS, "num_gpu_blocks": 24})

    def counted(client) -> int:
        time.sleep(0.2)  # the stats ride on the last outputs / the next heartbeat
        return int(client.workers_status()["engine-0"]["stats"]["num_preemptions"])

    with EngineClient(cfg) as client:
        res = replay(trace, "engine", client=client, seed=1)
        after_engine = counted(client)
        srv = ServerThread(create_app(client, "tiny")).start()
        try:
            via_http = replay(trace, srv.base_url, model="tiny", vocab_size=256, seed=1)
            after_http = counted(client)
            plain = httpx.post(f"{srv.base_url}/v1/completions", timeout=60, json={
                "model": "tiny", "prompt": [5, 6, 7], "max_tokens": 3}).json()
        finally:
            srv.stop()
    assert res.summary["requests"]["finished"] == 6
    assert after_engine > 0 and int(res.records["preemptions"].sum()) == after_engine
    assert via_http.summary["requests"]["finished"] == 6
    assert after_http > after_engine
    assert int(via_http.records["preemptions"].sum()) == after_http - after_engine
    assert plain["kvpd"]["num_preemptions"] == 0  # alone in the pool: never preempted
    assert 0 <= plain["kvpd"]["queueing_s"] < 60  # and it says how long it waited


def test_engine_replay_records_the_wait_in_the_workers_queue():
    """Through the ZMQ front end a request's `queueing_s` runs from its submission to the
    worker's first step on it (the worker says with the first tokens how long ago that step
    began), and over HTTP kvpd's extension field carries it: with room for two sequences, a
    burst of six runs two at a time, so the last ones wait for earlier ones to finish."""
    from realexec.serving.client import EngineClient
    from realexec.serving.http.server import ServerThread, create_app

    trace = workloads.Trace(arrival_s=np.zeros(6), prompt_len=np.full(6, 12),
                            output_len=np.full(6, 16), name="burst")
    cfg = tiny_config(llm_kwargs={**TINY_KWARGS, "max_num_seqs": 2})
    with EngineClient(cfg) as client:
        res = replay(trace, "engine", client=client, seed=1)
        srv = ServerThread(create_app(client, "tiny")).start()
        try:
            via_http = replay(trace, srv.base_url, model="tiny", vocab_size=256, seed=1)
        finally:
            srv.stop()
    for r in (res, via_http):
        q, ttft, e2e = (r.records[k] for k in ("queueing_s", "ttft_s", "e2e_s"))
        assert r.summary["requests"]["finished"] == 6
        assert np.isfinite(q).all() and (q >= 0).all()
        assert (q <= ttft).all()  # queued, then the prompt step, then the first token
        # the last two waited for a slot: two requests' whole runs at least, each longer than
        # the shortest decode span (first token to last) of any request. Spans, not e2e: an
        # e2e also holds the client's own delay in sending, which the worker never sees
        assert np.sort(q)[-2:].min() >= 0.5 * (e2e - ttft).min()
        assert r.summary["queueing_s"]["p50"] is not None


def test_a_request_the_engine_can_never_serve_is_counted_rejected_on_every_target(capsys):
    """As the simulator counts it, with the engine's reason and a warning naming the flags
    that change it (before: through the ZMQ front end it was a failed request, and no target
    said why)."""
    from kvpd.commands.replay import rejected_note
    from realexec.engine.llm import LLM
    from realexec.serving.client import EngineClient
    from realexec.serving.http.server import ServerThread, create_app

    # 8 blocks of 4 tokens: the 40-token request never fits, the others do
    trace = workloads.Trace(arrival_s=np.array([0.0, 0.01, 0.02]), prompt_len=np.array([6, 36, 5]),
                            output_len=np.array([3, 4, 3]), name="one-too-long")
    kwargs = {**TINY_KWARGS, "num_gpu_blocks": 8}
    llm = LLM(TINY, **kwargs)
    results = {"inproc": replay(trace, "inproc", llm=llm, seed=1)}
    with EngineClient(tiny_config(llm_kwargs=kwargs)) as client:
        results["engine"] = replay(trace, "engine", client=client, seed=1)
        srv = ServerThread(create_app(client, "tiny")).start()
        try:
            results["http"] = replay(trace, srv.base_url, model="tiny", vocab_size=256, seed=1)
        finally:
            srv.stop()
    for target, res in results.items():
        counts = res.summary["requests"]
        assert (counts["finished"], counts["rejected"], counts["aborted"]) == (2, 1, 0), target
        assert list(res.records["finish_reason"]) == ["length", "rejected", "length"], target
        assert list(res.records["error"]) == ["", "", ""], target
        note = rejected_note(res)
        assert note.startswith("WARNING: 1 of 3 requests were rejected by the engine"), target
        assert "--num-gpu-blocks" in note
        if target != "http":  # the server's 400 words it as the context it advertises
            assert "needs 10 KV blocks for 40 tokens but the whole pool has 8" in note, target


def test_cli_rejects_bad_targets_and_traces(tmp_path, capsys):
    path = workloads.write_trace(_trace(), tmp_path / "t.csv")
    assert kvpd_main(["replay", str(path), "--target", "tpu"]) == 2
    assert "--target must be" in capsys.readouterr().err
    assert kvpd_main(["replay", str(tmp_path / "missing.csv"), "--target", "inproc"]) == 2
    assert kvpd_main(["replay", str(path), "--target", "pd:0:1"]) == 2
    assert "at least one prefill" in capsys.readouterr().err


@pytest.mark.slow
def test_replay_over_engine_pd_and_http_gives_the_inproc_tokens(tmp_path):
    from realexec.serving.client import EngineClient
    from realexec.serving.http.server import ServerThread, create_app

    trace = _trace()
    ps = synth_prompts(trace, 256, seed=2)
    want = [reference([p], n)[0] for p, n in zip(ps, trace.output_len.tolist())]
    with EngineClient(tiny_config()) as client:
        res = replay(trace, "engine", client=client, seed=2)
        assert res.outputs == want
        srv = ServerThread(create_app(client, "tiny")).start()
        try:
            via_http = replay(trace, srv.base_url, model="tiny", vocab_size=256, seed=2)
        finally:
            srv.stop()
        assert via_http.outputs == want and via_http.summary["requests"]["finished"] == 5
    with EngineClient(tiny_config(pd=(1, 1))) as client:
        res = replay(trace, "pd:1:1", client=client, seed=2)
    assert res.outputs == want
    assert res.summary["kv_transfer"]["count"] == 5 and res.summary["kv_transfer"]["lost"] == 0
    assert np.isfinite(res.records["queueing_s"]).all()  # the prefill worker's queue
    assert np.isfinite(res.records["kv_transfer_s"]).all()
    assert (res.records["kv_transfer_bytes"] > 0).all()
    res.write(tmp_path, records="csv")
    assert (tmp_path / "requests.csv").read_text().startswith("\"request_id\"")
