"""Benchmark-style load in real replays (`kvpd replay --arrival burst --max-concurrency N`) and
`capacity_policy` reaching the real engine: in process, over ZeroMQ and over HTTP."""

from __future__ import annotations

import time

import numpy as np
import pytest

import workloads
from kvpd.cli import main as kvpd_main
from realexec.serving.replay.runner import prepare_trace, replay, synth_prompts
from tests.serving_helpers import TINY, TINY_KWARGS, reference, tiny_config

NO_EVICT = "guaranteed_no_evict"


def burst(n: int = 6, prompt: int = 12, output: int = 20) -> workloads.Trace:
    return workloads.Trace(arrival_s=np.zeros(n), prompt_len=np.full(n, prompt),
                           output_len=np.full(n, output), name="burst")


def in_flight_max(res) -> int:
    """The most requests sent and not answered in full at once, from the client's records
    (a request ends with its last token; one ending frees its slot before a send at that time)."""
    ev = sorted([(r.arrival_time, 1) for r in res.requests]
                + [(r.token_times[-1], -1) for r in res.requests])
    now = peak = 0
    for _, d in ev:
        now += d
        peak = max(peak, now)
    return peak


def _llm(**kw):
    from realexec.engine.llm import LLM

    return LLM(TINY, **{**TINY_KWARGS, **kw})


@pytest.fixture
def one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_guaranteed_no_evict_reaches_the_real_engine(one_thread):
    """The burst that makes a 24-block pool preempt under max_utilization (test_replay) runs
    without a preemption under guaranteed_no_evict, with the same tokens."""
    trace = burst()
    greedy, safe = _llm(num_gpu_blocks=24), _llm(num_gpu_blocks=24, capacity_policy=NO_EVICT)
    assert safe.scheduler.config.capacity_policy == NO_EVICT
    a, b = replay(trace, "inproc", llm=greedy, seed=1), replay(trace, "inproc", llm=safe, seed=1)
    assert greedy.scheduler.num_preemptions > 0
    assert safe.scheduler.num_preemptions == 0 and int(b.records["preemptions"].sum()) == 0
    assert b.summary["requests"]["finished"] == 6
    want = [reference([p], 20)[0] for p in synth_prompts(trace, 256, seed=1)]
    assert a.outputs == want and b.outputs == want
    with pytest.raises(ValueError, match="scheduler.capacity_policy must be one of"):
        _llm(capacity_policy="sometimes")


def test_inproc_closed_loop_sends_when_a_slot_frees(one_thread):
    trace = burst(n=7, output=8)
    res = replay(trace, "inproc", llm=_llm(), seed=1, max_concurrency=2)
    assert res.summary["requests"]["finished"] == 7 and res.summary["backend"]["max_concurrency"] == 2
    assert in_flight_max(res) == 2
    arrival = [r.arrival_time for r in res.requests]
    ends = [r.token_times[-1] for r in res.requests]
    assert arrival[:2] == [0.0, 0.0]
    for k in range(2, 7):  # sent exactly when an earlier request's last token came
        assert arrival[k] in ends[:k]
    # TTFT counts from the send, not from t = 0
    np.testing.assert_allclose(res.records["ttft_s"],
                               [r.token_times[0] - r.arrival_time for r in res.requests])
    want = [reference([p], 8)[0] for p in synth_prompts(trace, 256, seed=1)]
    assert res.outputs == want
    with pytest.raises(ValueError, match="max_concurrency must be a positive integer, got 0"):
        replay(trace, "inproc", llm=_llm(), max_concurrency=0)


def test_prepare_trace_puts_a_burst_at_zero_and_refuses_rate_options():
    t = workloads.Trace(arrival_s=np.array([0.0, 1.0, 2.5]), prompt_len=np.array([4, 5, 6]),
                        output_len=np.array([3, 3, 3]), name="t")
    b = prepare_trace(t, arrival={"process": "burst"})
    assert b.arrival_s.tolist() == [0.0, 0.0, 0.0] and b.prompt_len.tolist() == [4, 5, 6]
    with pytest.raises(ValueError, match="--arrival replaces the trace's arrival times"):
        prepare_trace(t, arrival={"process": "burst"}, target_rate=2.0)


def test_engine_and_http_closed_loops_and_the_policy_in_a_worker():
    """A worker process started with guaranteed_no_evict never preempts the burst that preempts
    under max_utilization; closed loops over ZeroMQ and HTTP keep at most N in flight."""
    from realexec.serving.client import EngineClient
    from realexec.serving.http.server import ServerThread, create_app

    trace = burst()
    cfg = tiny_config(llm_kwargs={**TINY_KWARGS, "num_gpu_blocks": 24, "capacity_policy": NO_EVICT})
    want = [reference([p], 20)[0] for p in synth_prompts(trace, 256, seed=1)]
    with EngineClient(cfg) as client:
        open_burst = replay(trace, "engine", client=client, seed=1)
        loop = replay(trace, "engine", client=client, seed=1, max_concurrency=2)
        srv = ServerThread(create_app(client, "tiny")).start()
        try:
            via_http = replay(trace, srv.base_url, model="tiny", vocab_size=256, seed=1,
                              max_concurrency=2)
        finally:
            srv.stop()
        time.sleep(0.2)  # the stats ride on the last outputs / the next heartbeat
        preempted = int(client.workers_status()["engine-0"]["stats"]["num_preemptions"])
    assert preempted == 0
    for res in (open_burst, loop, via_http):
        assert res.summary["requests"]["finished"] == 6 and res.outputs == want
    assert in_flight_max(loop) == 2 and in_flight_max(via_http) == 2
    assert in_flight_max(open_burst) > 2


def test_cli_closed_loop_and_its_bad_input(tmp_path, capsys):
    path = workloads.write_trace(burst(n=4, prompt=10, output=6), tmp_path / "t.csv")
    common = ["replay", str(path), "--target", "inproc", "--model", TINY, "--block-size", "4",
              "--max-num-batched-tokens", "64"]
    assert kvpd_main(common + ["--num-gpu-blocks", "64", "--arrival", "burst",
                               "--max-concurrency", "2", "--capacity-policy", NO_EVICT,
                               "--out", str(tmp_path / "out")]) == 0
    assert "4 finished" in capsys.readouterr().out
    for bad, message in ((["--max-concurrency", "0"], "expects a positive integer, got '0'"),
                         (["--max-concurrency", "2.5"], "expects a positive integer, got '2.5'"),
                         (["--arrival", "{process: burst, rate: 3}"],
                          "--arrival.rate: unknown key for process burst"),
                         # refused by argparse before the trace loads (a fuzz found --rate -1
                         # reported by an internal function's name, after loading)
                         (["--rate", "-1"], "argument --rate: expects a number > 0, got '-1'"),
                         (["--time-scale", "nan"], "argument --time-scale: expects a number > 0"),
                         (["--limit", "0"], "argument --limit: expects a positive integer")):
        with pytest.raises(SystemExit) as exc:
            kvpd_main(common + bad)
        assert exc.value.code == 2 and message in capsys.readouterr().err
    # 10 + 6 tokens = 4 blocks of 4; a pool of 3 can never hold one
    assert kvpd_main(common + ["--num-gpu-blocks", "3", "--arrival", "burst"]) == 2
    err = capsys.readouterr().err
    assert ("--arrival burst: 4 of 4 requests can never be served, e.g. trace row 0: prompt 10 + "
            "output 6 = 16 tokens need 4 KV blocks of 4 tokens but the engine's pool has 3") in err


def test_servable_check_counts_only_the_window_a_sliding_pool_keeps():
    """A pool that frees blocks outside a sliding window serves requests longer than itself:
    the check counts the window's blocks plus one step's, as the core does, and refuses only
    what even that cannot fit."""
    from realexec.serving.replay.runner import check_servable
    from simulator.core.kv_cache_manager import blocks_held

    trace = burst(n=2, prompt=200, output=50)  # 250 tokens = 63 blocks of 4
    with pytest.raises(ValueError, match="need 63 KV blocks"):
        check_servable(trace, 40, 4, "--arrival burst")
    # window 64, steps of at most 32 tokens: cdiv(63 + 32, 4) + 1 = 25 blocks at once
    assert blocks_held(250, 4, 64, 32) == 25
    check_servable(trace, 40, 4, "--arrival burst", sliding_window=64, max_step_tokens=32)
    with pytest.raises(ValueError, match="need 25 KV blocks"):
        check_servable(trace, 24, 4, "--arrival burst", sliding_window=64, max_step_tokens=32)


def _drained(res, warm: int) -> tuple[float, float]:
    """(when the last warm-up request ended, when the first measured one was sent)."""
    ends = max(r.token_times[-1] for r in res.requests[:warm])
    return ends, min(r.arrival_time for r in res.requests[warm:])


def test_inproc_warmup_drain_sends_the_measured_wave_after_the_warmups(one_thread):
    """--warmup-drain: the measured requests go once the last warm-up one has finished, as a
    fresh wave of max_concurrency; without it they overlap the warm-ups."""
    trace = workloads.Trace(arrival_s=np.zeros(8), prompt_len=np.full(8, 12),
                            output_len=np.array([2, 6, 6, 6, 6, 6, 6, 6]), name="burst")
    res = replay(trace, "inproc", llm=_llm(), seed=1, max_concurrency=3, warmup_requests=3,
                 warmup_drain=True)
    warm_end, first = _drained(res, 3)
    assert first >= warm_end
    assert sum(r.arrival_time == first for r in res.requests[3:]) == 3
    assert res.summary["requests"]["warmup"] == 3 and res.summary["backend"]["warmup_drain"]
    assert res.outputs == [reference([p], n)[0] for p, n in
                           zip(synth_prompts(trace, 256, seed=1), trace.output_len.tolist())]
    plain = replay(trace, "inproc", llm=_llm(), seed=1, max_concurrency=3, warmup_requests=3)
    warm_end, first = _drained(plain, 3)  # request 0 ends early: request 3 takes its slot
    assert first < warm_end and "warmup_drain" not in plain.summary["backend"]
    with pytest.raises(ValueError, match="warmup_drain waits for the warm-up requests"):
        replay(trace, "inproc", llm=_llm(), warmup_drain=True)


def test_engine_and_http_warmup_drains():
    from realexec.serving.client import EngineClient
    from realexec.serving.http.server import ServerThread, create_app

    trace = burst(n=6, output=8)
    want = [reference([p], 8)[0] for p in synth_prompts(trace, 256, seed=1)]
    with EngineClient(tiny_config()) as client:
        over_zmq = replay(trace, "engine", client=client, seed=1, warmup_requests=2,
                          warmup_drain=True)
        srv = ServerThread(create_app(client, "tiny")).start()
        try:
            over_http = replay(trace, srv.base_url, model="tiny", vocab_size=256, seed=1,
                               max_concurrency=2, warmup_requests=2, warmup_drain=True)
        finally:
            srv.stop()
    for res in (over_zmq, over_http):
        warm_end, first = _drained(res, 2)
        assert first >= warm_end and res.outputs == want
        assert res.summary["requests"]["warmup"] == 2


def test_cli_warmup_drain_needs_warmup_requests(tmp_path, capsys):
    path = workloads.write_trace(burst(n=4, prompt=10, output=6), tmp_path / "t.csv")
    common = ["replay", str(path), "--target", "inproc", "--model", TINY, "--block-size", "4",
              "--num-gpu-blocks", "64", "--arrival", "burst"]
    assert kvpd_main(common + ["--warmup-drain"]) == 2
    assert "--warmup-drain waits for the warm-up requests: give --warmup-requests N" in \
        capsys.readouterr().err
    assert kvpd_main(common + ["--warmup-requests", "1", "--warmup-drain",
                               "--max-concurrency", "2"]) == 0
    assert "3 finished" in capsys.readouterr().out
