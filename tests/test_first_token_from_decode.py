"""`scheduler.first_token_from_decode` (LMDeploy TurboMind before v0.1.0a2): a prompt's
prefill stops one token short; the last token runs as a decode in the next step, which
samples the first token. The first token then costs a prefill of L - 1 tokens plus a decode
pass; later tokens are unchanged."""

from __future__ import annotations

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.core.config import CacheConfig, SchedulerConfig
from simulator.core.request import Request, SamplingParams
from simulator.core.scheduler import Scheduler
from simulator.core.scheduler_output import StepResult
from simulator.cost.costmodel import CostModel
from simulator.run import run_scenario
from simulator.scenario import scenario_from_dict

PROMPT, OUT = 128, 4


def one_request(first_token_from_decode: bool, engine: dict | None = None):
    data = {"model": "llama-2-7b", "hardware": "a100-80gb-sxm", "dtype": "fp16",
            "scheduler": {"first_token_from_decode": first_token_from_decode},
            "workload": {"synthetic": {
                "num_requests": 1, "arrival": {"process": "burst"},
                "prompt_len": {"dist": "fixed", "value": PROMPT},
                "output_len": {"dist": "fixed", "value": OUT}}}}
    if engine is not None:
        data["engine"] = engine
        del data["scheduler"]
    return run_scenario(scenario_from_dict(data))


def test_the_first_token_costs_a_short_prefill_and_a_decode_pass() -> None:
    cm = CostModel("llama-2-7b", "a100-80gb-sxm", "fp16")
    plain, turbomind = one_request(False), one_request(True)
    prefill = cm.step_time(BatchShape.from_lists([PROMPT], [0]))
    short = cm.step_time(BatchShape.from_lists([PROMPT - 1], [0]))
    last = cm.step_time(BatchShape.from_lists([1], [PROMPT - 1]))
    assert plain.summary["ttft_s"]["mean"] == pytest.approx(prefill, rel=1e-9)
    assert turbomind.summary["ttft_s"]["mean"] == pytest.approx(short + last, rel=1e-9)
    # the tokens after the first come exactly as before
    assert turbomind.summary["tpot_s"]["mean"] == pytest.approx(plain.summary["tpot_s"]["mean"],
                                                                rel=1e-9)


def test_the_engine_preset_sets_it_for_turbomind_before_its_unified_pass() -> None:
    old = one_request(False, {"name": "lmdeploy-turbomind", "version": "v0.1.0a1"})
    new = one_request(False, {"name": "lmdeploy-turbomind", "version": "0.1.0"})
    assert old.scenario.scheduler.first_token_from_decode
    assert not new.scenario.scheduler.first_token_from_decode
    assert old.summary["ttft_s"]["mean"] > new.summary["ttft_s"]["mean"]


def test_the_last_prompt_token_joins_the_running_decodes() -> None:
    """Step 1: request a's prompt but its last token. Step 2: a's last token as a decode,
    with b's prompt (but its last token) mixed in. Step 3: both decode."""
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                          first_token_from_decode=True)
    sched = Scheduler(cfg, CacheConfig(num_gpu_blocks=32, block_size=4))
    a = Request("a", list(range(10)), SamplingParams(max_tokens=3), arrival_time=0.0)
    b = Request("b", list(range(100, 107)), SamplingParams(max_tokens=3), arrival_time=0.0)
    sched.add_request(a, 0.0)
    out = sched.schedule(0.0)
    assert out.num_new_tokens == [9]
    sched.update(out, StepResult(0.01, None), 0.01)
    assert a.num_output_tokens == 0 and a.first_token_time is None
    sched.add_request(b, 0.01)
    out = sched.schedule(0.01)
    assert [r.request_id for r in out.reqs] == ["a", "b"] and out.num_new_tokens == [1, 6]
    assert out.shape.num_decode_reqs == 1 and out.shape.num_prefill_reqs == 1
    sched.update(out, StepResult(0.01, None), 0.02)
    assert a.num_output_tokens == 1 and a.first_token_time == 0.02 and b.num_output_tokens == 0
    out = sched.schedule(0.02)
    assert out.num_new_tokens == [1, 1]
