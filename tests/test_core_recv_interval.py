"""SGLang's --scheduler-recv-interval in the core (`SchedulerConfig.recv_interval`): a decoding
engine takes arrivals in every N-th step, right after a step with prompt tokens, and at once
when idle (`simulator.core.recv_gate`)."""

from __future__ import annotations

import pytest

from simulator.core import SchedulerConfig
from simulator.core.recv_gate import PROMPT_STEP_WEIGHT, RecvGate
from simulator.engines import apply_engine
from simulator.scenario import scenario_from_dict
from tests.core_helpers import admitted_at as _admitted_at
from tests.core_helpers import make_engine, make_request


def _decoding_engine(interval: int):
    """An engine with one request past its prompt, decoding (its prompt step ran)."""
    eng = make_engine(num_gpu_blocks=256, block_size=4, max_num_batched_tokens=64,
                      recv_interval=interval)
    eng.add_request(make_request("a", 8, max_tokens=100))
    return eng, eng.step(0.0).end_time  # a's prompt: the next check opens (weight 1000)


def test_an_idle_engine_takes_an_arrival_at_once():
    eng = make_engine(recv_interval=30)
    eng.add_request(make_request("a", 8, max_tokens=4))
    assert eng.step(0.0).scheduler_output.new_req_ids == ["a"]


def test_a_decoding_engine_takes_arrivals_every_nth_step():
    eng, now = _decoding_engine(4)
    now = eng.step(now).end_time  # decode 1 (its check opened after the prompt step: 0)
    eng.add_request(make_request("b", 8, max_tokens=2))
    # the checks before the next steps count 1, 2, 3, 4: b is taken in before the 4th
    assert _admitted_at(eng, "b", now, 10) == 4


def test_an_arrival_after_a_prompt_step_is_taken_in_at_the_next_step():
    eng, now = _decoding_engine(30)
    eng.add_request(make_request("b", 8, max_tokens=2))
    assert _admitted_at(eng, "b", now, 3) == 1


def test_interval_one_is_the_default_schedule():
    runs = []
    for interval in (1, None):
        kw = {} if interval is None else {"recv_interval": interval}
        eng = make_engine(num_gpu_blocks=256, block_size=4, max_num_batched_tokens=64, **kw)
        eng.add_request(make_request("a", 8, max_tokens=20))
        now = eng.step(0.0).end_time
        eng.add_request(make_request("b", 8, max_tokens=2))
        runs.append(_admitted_at(eng, "b", now, 5))
    assert runs == [1, 1]


def test_an_aborted_arrival_leaves_the_inbox():
    eng, now = _decoding_engine(8)
    now = eng.step(now).end_time  # a decode: the gate stays shut for the next steps
    eng.add_request(make_request("b", 8, max_tokens=2))
    now = eng.step(now).end_time
    assert eng.scheduler._inbox == [eng.scheduler.requests["b"]]
    assert eng.scheduler.abort_request("b", now)
    assert not eng.scheduler._inbox and "b" not in eng.scheduler.requests
    assert eng.scheduler.get_stats()["num_waiting"] == 0


def test_waiting_arrivals_count_as_unfinished_work():
    eng, now = _decoding_engine(8)
    now = eng.step(now).end_time
    eng.add_request(make_request("b", 8, max_tokens=2))
    now = eng.step(now).end_time
    assert eng.scheduler.get_stats()["num_waiting"] == 1
    eng.run_until_idle(now)
    assert eng.scheduler.requests == {} and not eng.scheduler._inbox


def test_the_gate_counts_a_burst_as_its_steps():
    one, burst = RecvGate(5), RecvGate(5)
    for _ in range(7):  # seven decode steps, one by one
        one.opens(idle=False)
        one.stepped(prompt_work=False)
    burst.opens(idle=False)  # the burst's first step, then its other six inside it
    burst.stepped(prompt_work=False, steps=7)
    assert (one.count, one.last_weight) == (burst.count, burst.last_weight)
    # a burst led by a prompt step: the check before its 2nd step opens, the rest count 1
    lead = RecvGate(5)
    lead.opens(idle=False)
    lead.stepped(prompt_work=True, steps=4)
    assert (lead.count, lead.last_weight) == (2, 1)
    assert lead.steps_before_open(prompt_work=False) == 3
    assert RecvGate(5).steps_before_open(prompt_work=True) == 1
    assert PROMPT_STEP_WEIGHT == 1000


@pytest.mark.parametrize("kwargs, match", [
    ({"recv_interval": 0}, "recv_interval must be an integer >= 1"),
    ({"recv_interval": 2, "role": "prefill"}, "applies to colocated replicas"),
])
def test_bad_config_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**kwargs)


def _scenario(**extra):
    data = {"model": "llama-3.1-8b", "hardware": "h100-sxm",
            "scheduler": {"recv_interval": 10},
            "workload": {"synthetic": {"num_requests": 4}}}
    data.update(extra)
    apply_engine(data)
    return scenario_from_dict(data)


def test_the_scenario_key_reaches_the_replicas():
    assert _scenario().scheduler.recv_interval == 10


@pytest.mark.parametrize("cluster, clash", [
    ({"pd": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}}, "cluster.pd"),
    ({"tp": 2, "dp_attention": True}, "cluster.dp_attention"),
])
def test_the_scenario_refuses_it_where_it_is_not_modelled(cluster, clash):
    model = {"model": "qwen3-30b-a3b"} if "dp_attention" in cluster else {}
    with pytest.raises(ValueError, match=f"scheduler.recv_interval.*{clash}"):
        _scenario(cluster=cluster, **model)
