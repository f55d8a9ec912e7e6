"""TensorRT-LLM's batch waiting in the core (`SchedulerConfig.batch_wait_timeout_iters`,
`batch_wait_max_tokens_ratio`): in a step that decodes, waiting requests are held back until
the held steps reach the timeout or their tokens reach the ratio of the step
(`simulator.core.batch_wait`)."""

from __future__ import annotations

import pytest

from simulator.core import SchedulerConfig
from simulator.core.batch_wait import BatchWait
from simulator.engines import apply_engine
from simulator.scenario import scenario_from_dict
from tests.core_helpers import admitted_at as _admitted_at
from tests.core_helpers import make_engine, make_request


def _decoding_engine(timeout: int, ratio: float, budget: int = 64):
    """An engine with one request decoding (its prompt ran) under batch waiting."""
    eng = make_engine(num_gpu_blocks=256, block_size=4, max_num_batched_tokens=budget,
                      batch_wait_timeout_iters=timeout, batch_wait_max_tokens_ratio=ratio)
    eng.add_request(make_request("a", 8, max_tokens=100))
    return eng, eng.step(0.0).end_time


def test_an_arrival_waits_out_the_timeout_beside_decodes():
    eng, now = _decoding_engine(timeout=3, ratio=0.9)
    eng.add_request(make_request("b", 8, max_tokens=2))  # 8 + 1 tokens < 0.9 x 64
    # held at the next three steps (the count reaches 3), let in at the 4th
    assert _admitted_at(eng, "b", now, 10) == 4


def test_enough_tokens_let_the_arrivals_in_at_once():
    eng, now = _decoding_engine(timeout=30, ratio=0.5)
    eng.add_request(make_request("b", 40, max_tokens=2))  # 40 + 1 >= 0.5 x 64
    assert _admitted_at(eng, "b", now, 3) == 1


def test_an_idle_engine_does_not_wait():
    eng = make_engine(batch_wait_timeout_iters=30, batch_wait_max_tokens_ratio=0.9)
    eng.add_request(make_request("a", 8, max_tokens=4))
    assert eng.step(0.0).scheduler_output.new_req_ids == ["a"]


@pytest.mark.parametrize("timeout, ratio", [(0, 0.9), (30, 0.0)])
def test_either_knob_at_zero_waits_for_nothing(timeout, ratio):
    eng, now = _decoding_engine(timeout=timeout, ratio=ratio)
    eng.add_request(make_request("b", 8, max_tokens=2))
    assert _admitted_at(eng, "b", now, 2) == 1


def test_the_count_restarts_when_the_arrivals_run():
    eng, now = _decoding_engine(timeout=2, ratio=0.9)
    eng.add_request(make_request("b", 8, max_tokens=50))
    assert _admitted_at(eng, "b", now, 10) == 3
    eng.add_request(make_request("c", 8, max_tokens=2))
    assert _admitted_at(eng, "c", eng.scheduler.requests["b"].token_times[-1], 10) == 3


def test_a_burst_counts_its_held_steps():
    wait = BatchWait(timeout_iters=10, max_tokens=100.0)
    assert wait.holds(8, 1) and wait.iters == 1
    assert wait.steps_before_release() == 10  # held steps 1..10 (the count reaches 10)
    wait.burst(4, 9)
    assert wait.iters == 4 and wait.steps_before_release() == 7
    assert not wait.holds(200, 1) and wait.iters == 0  # enough tokens: they run
    # a burst after a failed try (the count restarted): its checks hold, try at the timeout
    # and restart, as step by step
    wait.burst(14, 9)
    assert wait.iters == 13 % 11
    wait.burst(5, 200)  # enough tokens at every check: each tries, none counts
    assert wait.iters == 0


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_wait_timeout_iters": -1}, "batch_wait_timeout_iters must be an integer >= 0"),
    ({"batch_wait_max_tokens_ratio": 1.5}, r"batch_wait_max_tokens_ratio must be in \[0, 1\]"),
    ({"batch_wait_timeout_iters": 4, "batch_wait_max_tokens_ratio": 0.5, "mixed_batches": False},
     "steps mix prompts and decodes"),
    ({"batch_wait_timeout_iters": 4, "batch_wait_max_tokens_ratio": 0.5, "role": "decode"},
     "colocated replicas"),
])
def test_bad_config_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**kwargs)


def _scenario(**extra):
    data = {"model": "llama-3.1-8b", "hardware": "h100-sxm",
            "scheduler": {"batch_wait_timeout_iters": 40, "batch_wait_max_tokens_ratio": 0.8},
            "workload": {"synthetic": {"num_requests": 4}}}
    for k, v in extra.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    apply_engine(data)
    return scenario_from_dict(data)


def test_the_scenario_keys_reach_the_scheduler_spec():
    s = _scenario().scheduler
    assert (s.batch_wait_timeout_iters, s.batch_wait_max_tokens_ratio) == (40, 0.8)


@pytest.mark.parametrize("extra, clash", [
    ({"cluster": {"pd": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}}}, "cluster.pd"),
    ({"scheduler": {"mixed_batches": False}}, "scheduler.mixed_batches: false"),
])
def test_the_scenario_refuses_them_where_they_are_not_modelled(extra, clash):
    with pytest.raises(ValueError, match=f"batch waiting.*{clash}"):
        _scenario(**extra)
