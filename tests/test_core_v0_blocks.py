"""vLLM V0's block manager in the core (`SchedulerConfig.prompt_allocation: whole_prompt`,
`admission_watermark`): a waiting request is admitted only when the blocks of all its tokens
fit with the watermark left free, and takes them at once."""

from __future__ import annotations

import pytest

from simulator.core import RequestStatus, SchedulerConfig
from simulator.engines import apply_engine
from simulator.scenario import scenario_from_dict
from tests.core_helpers import make_engine, make_request

V0 = {"prompt_allocation": "whole_prompt"}


def test_a_chunked_prompt_takes_all_its_blocks_at_admission():
    # 40-token prompt, 4-token blocks, 8-token steps: 10 blocks at once, then none per chunk
    eng = make_engine(num_gpu_blocks=64, block_size=4, max_num_batched_tokens=8, **V0)
    kvm = eng.scheduler.kv_cache_manager
    eng.add_request(make_request("a", 40, max_tokens=2))
    eng.step(0.0)
    assert len(kvm.req_to_blocks["a"]) == 10
    eng.step(0.01)
    assert len(kvm.req_to_blocks["a"]) == 10
    per_chunk = make_engine(num_gpu_blocks=64, block_size=4, max_num_batched_tokens=8)
    per_chunk.add_request(make_request("a", 40, max_tokens=2))
    per_chunk.step(0.0)
    assert len(per_chunk.scheduler.kv_cache_manager.req_to_blocks["a"]) == 2


def test_a_prompt_waits_until_its_whole_length_fits():
    # 12 blocks of 4, 8-token steps: "a" (24 tokens, 6 blocks) decodes into a 7th; "b" (40
    # tokens, 10 blocks) has a first chunk of 7 tokens (2 blocks) but not its whole length
    for alloc, admitted in (("per_chunk", True), ("whole_prompt", False)):
        eng = make_engine(num_gpu_blocks=12, block_size=4, max_num_batched_tokens=8,
                          prompt_allocation=alloc)
        eng.add_request(make_request("a", 24, max_tokens=8))
        now = 0.0
        for _ in range(3):  # a's prompt, in three chunks
            now = eng.step(now).end_time
        eng.add_request(make_request("b", 40, max_tokens=1))
        out = eng.step(now).scheduler_output
        assert ("b" in out.new_req_ids) == admitted, alloc


def test_admission_leaves_the_watermark_free():
    # 20 blocks, watermark 0.25 -> 5 kept free: a 14-block prompt waits, a 15th block runs out
    eng = make_engine(num_gpu_blocks=20, block_size=4, max_num_batched_tokens=64,
                      admission_watermark=0.25, **V0)
    kvm = eng.scheduler.kv_cache_manager
    eng.add_request(make_request("a", 24, max_tokens=4))  # 6 blocks
    eng.add_request(make_request("b", 40, max_tokens=4))  # 10 blocks: 20 - 6 - 10 < 5
    out = eng.step(0.0)
    assert out.scheduler_output.new_req_ids == ["a"]
    assert kvm.num_free_blocks == 14
    eng.run_until_idle(0.01)
    assert eng.scheduler.requests == {} and kvm.num_free_blocks == 20


def test_a_request_that_only_fits_into_the_watermark_is_rejected_on_arrival():
    eng = make_engine(num_gpu_blocks=20, block_size=4, max_num_batched_tokens=128,
                      admission_watermark=0.25, **V0)
    big = make_request("big", 60, max_tokens=8)  # 17 blocks: more than 20 - 5
    eng.add_request(big)
    assert big.status == RequestStatus.FINISHED_REJECTED
    assert "whole pool has 20, 5 of them kept free (admission_watermark" in big.stop_reason


def test_a_running_prompt_never_preempts_under_whole_prompt():
    # six 30-token prompts (8 blocks each) growing to 42 tokens (11 blocks) in an 18-block
    # pool: decodes preempt, prompt chunks never do (their blocks were taken at admission)
    eng = make_engine(num_gpu_blocks=18, block_size=4, max_num_batched_tokens=8, **V0)
    reqs = [make_request(str(i), 30, max_tokens=12) for i in range(6)]
    for r in reqs:
        eng.add_request(r)
    now, preempted = 0.0, 0
    while eng.has_unfinished_requests():
        step = eng.step(now)
        out = step.scheduler_output
        if out.preempted_req_ids:
            preempted += len(out.preempted_req_ids)
            chunks = [r for r, n in zip(out.reqs, out.num_new_tokens) if n > 1]
            assert not chunks or all(r.num_computed_tokens < r.num_prompt_tokens for r in chunks)
        now = step.end_time
    assert preempted > 0
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in reqs)
    assert eng.scheduler.kv_cache_manager.num_free_blocks == 18


def test_with_none_free_a_running_request_preempts_before_it_appends():
    # V0's can_append_slots: in 5 blocks of 4, "a" (8 tokens) takes a 3rd block for its first
    # decode, leaving none free; "b" (7 tokens) has room in its 2nd block, but with no block
    # free it is preempted (the newest) rather than appended to
    for reserve, preempted in ((False, []), (True, ["b"])):
        eng = make_engine(num_gpu_blocks=5, block_size=4, max_num_batched_tokens=64,
                          append_needs_free_block=reserve)
        eng.add_request(make_request("a", 8, max_tokens=3))
        eng.add_request(make_request("b", 7, max_tokens=3))
        step = eng.step(0.0)
        assert step.scheduler_output.new_req_ids == ["a", "b"]
        out = eng.step(step.end_time).scheduler_output
        assert out.preempted_req_ids == preempted, reserve
        assert eng.scheduler.kv_cache_manager.num_free_blocks == (0 if not reserve else 2)


def test_a_request_that_would_fill_the_pool_is_rejected_when_appends_want_a_free_block():
    eng = make_engine(num_gpu_blocks=4, block_size=4, append_needs_free_block=True)
    full = make_request("full", 12, max_tokens=4)  # 16 tokens: all 4 blocks
    eng.add_request(full)
    assert full.status == RequestStatus.FINISHED_REJECTED
    assert "1 of them kept free" in full.stop_reason


@pytest.mark.parametrize("bad,match", [
    ({"prompt_allocation": "all"}, r"scheduler.prompt_allocation must be one of"),
    ({"admission_watermark": 1.0}, r"scheduler.admission_watermark must be in \[0, 1\)"),
    ({"admission_watermark": -0.1}, r"scheduler.admission_watermark must be in \[0, 1\)"),
])
def test_bad_knobs_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**bad)


@pytest.mark.parametrize("bad", [{"prompt_allocation": "all"}, {"admission_watermark": 1.5}])
def test_bad_scenario_keys_are_refused(bad):
    with pytest.raises(ValueError, match="scheduler"):
        scenario_from_dict({"scheduler": bad})


@pytest.mark.parametrize("version,v0", [("0.5.4", True), ("0.7.3", True), ("0.7.4.dev181", True),
                                        ("0.8.0", False), ("0.11.0", False)])
def test_the_vllm_preset_runs_v0s_block_manager_before_0_8(version, v0):
    data = {"model": "llama-3-8b", "engine": {"name": "vllm", "version": version}}
    notes = apply_engine(data)
    sched = data.get("scheduler", {})
    assert (sched.get("prompt_allocation"), sched.get("admission_watermark"),
            sched.get("append_needs_free_block")) == (
        ("whole_prompt", 0.01, True) if v0 else (None, None, None))
    assert any("V0 engine) admits" in n for n in notes) == v0


def test_a_set_value_wins_over_the_preset():
    data = {"model": "llama-3-8b", "engine": {"name": "vllm", "version": "0.7.3"},
            "scheduler": {"admission_watermark": 0.0}}
    apply_engine(data)
    assert data["scheduler"] == {**data["scheduler"], "admission_watermark": 0.0,
                                 "prompt_allocation": "whole_prompt",
                                 "append_needs_free_block": True}
