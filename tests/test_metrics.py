import json

import numpy as np
import pytest

from simulator.core import Request, RequestStatus, SamplingParams
from simulator.metrics import SLO, request_records, summarize, write_records, write_summary


def _req(rid, arrival, sched, times, status=RequestStatus.FINISHED_LENGTH):
    r = Request(rid, num_prompt_tokens=10, sampling_params=SamplingParams(max_tokens=len(times) or 1),
                arrival_time=arrival)
    r.first_scheduled_time = sched
    for t in times:
        r.append_output_token(None, t)
    r.finish(status, times[-1] if times else arrival)
    return r


def test_summary_metrics_by_hand():
    a = _req("a", 0.0, 0.5, [1.0, 1.5, 2.0])  # ttft 1.0, tpot 0.5, e2e 2.0
    b = _req("b", 1.0, 1.0, [1.2, 1.3])  # ttft 0.2, tpot 0.1, e2e 0.3
    c = _req("c", 2.0, 2.0, [], RequestStatus.FINISHED_REJECTED)
    s = summarize([a, b, c], slo=SLO(ttft_s=0.5, tpot_s=0.2), kv_peak_usage=0.7, wall_s=1.0)
    assert s["requests"] == {"total": 3, "finished": 2, "rejected": 1, "aborted": 0, "preempted": 0}
    assert s["ttft_s"]["mean"] == pytest.approx(0.6)
    assert s["tpot_s"]["p50"] == pytest.approx(0.3)
    assert s["e2e_s"]["mean"] == pytest.approx(1.15)
    assert s["queueing_s"]["mean"] == pytest.approx(0.25)
    # span 0.0 .. 2.0 (rejected c arrives at 2.0)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(5 / 2.0)
    assert s["slo"]["attainment"] == pytest.approx(1 / 3)  # only b meets both targets
    assert s["slo"]["goodput_rps"] == pytest.approx(0.5)
    assert s["itl_s"]["max"] == pytest.approx(0.5)
    assert s["kv"]["peak_usage"] == 0.7


def test_records_and_files(tmp_path):
    a = _req("a", 0.0, 0.1, [1.0, 1.5, 3.0])
    rec = request_records([a])
    assert rec["itl_max_s"][0] == pytest.approx(1.5) and rec["tpot_s"][0] == pytest.approx(1.0)
    write_records(rec, tmp_path / "r.parquet")
    write_records(rec, tmp_path / "r.csv")
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "r.parquet")
    assert t.column("request_id").to_pylist() == ["a"]
    assert "ttft_s" in (tmp_path / "r.csv").read_text().splitlines()[0]
    write_summary(summarize([a]), tmp_path / "s.json")
    s = json.loads((tmp_path / "s.json").read_text())
    for key in ("requests", "throughput", "ttft_s", "tpot_s", "e2e_s", "slo", "kv", "wall_s"):
        assert key in s
    assert np.isfinite(s["ttft_s"]["p99"])


def test_vectorised_itl_columns_match_direct_numpy():
    import random

    rng = random.Random(1)
    rows = []
    for i in range(200):
        r = Request(str(i), num_prompt_tokens=5, arrival_time=rng.random())
        t = r.arrival_time
        # short requests, and long ones whose p99 is not one of their two largest gaps
        for _ in range(rng.randint(0, 30) if i % 4 else rng.randint(150, 400)):
            t += rng.random()
            r.append_output_token(None, t)
        rows.append(r)
    rec = request_records(rows)
    for i, r in enumerate(rows):
        tt = np.array(r.token_times)
        if len(tt) > 1:
            g = np.diff(tt)
            assert rec["itl_p99_s"][i] == pytest.approx(np.percentile(g, 99))
            assert rec["itl_max_s"][i] == pytest.approx(g.max())
            assert rec["tpot_s"][i] == pytest.approx(g.mean())
        else:
            assert np.isnan(rec["tpot_s"][i])
        if len(tt):
            assert rec["e2e_s"][i] == pytest.approx(tt[-1] - r.arrival_time)
