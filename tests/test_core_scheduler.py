from simulator.core import IdealExecutor, RequestStatus, StepResult
from tests.core_helpers import hand_over, make_engine, make_request


def test_running_first_then_waiting_within_budget_and_seq_cap():
    eng = make_engine(num_gpu_blocks=100, block_size=4, max_num_batched_tokens=20, max_num_seqs=3)
    for i in range(5):
        eng.add_request(make_request(f"r{i}", 8, max_tokens=3))
    out = eng.scheduler.schedule(0.0)
    # 20-token budget: two whole prompts + a 4-token chunk of the third
    assert out.num_new_tokens == [8, 8, 4] and len(out.reqs) == 3
    eng.scheduler.update(out, StepResult(0.01), 0.01)
    out2 = eng.scheduler.schedule(0.01)
    # running first: r0, r1 decode; r2 finishes its prompt; r3 is over max_num_seqs
    assert [r.request_id for r in out2.reqs] == ["r0", "r1", "r2"]
    assert out2.num_new_tokens == [1, 1, 4]


def test_chunked_prefill_off_waits_for_a_step_that_fits_the_whole_prompt():
    eng = make_engine(num_gpu_blocks=100, block_size=4, max_num_batched_tokens=16, enable_chunked_prefill=False)
    eng.add_request(make_request("a", 10, max_tokens=2))
    eng.add_request(make_request("b", 10, max_tokens=2))
    out = eng.scheduler.schedule(0.0)
    assert out.num_new_tokens == [10]  # b does not fit whole in the remaining 6 tokens


def test_long_prefill_threshold_caps_chunks():
    eng = make_engine(num_gpu_blocks=100, block_size=4, max_num_batched_tokens=64, long_prefill_token_threshold=8)
    eng.add_request(make_request("a", 30, max_tokens=2))
    eng.add_request(make_request("b", 30, max_tokens=2))
    out = eng.scheduler.schedule(0.0)
    assert out.num_new_tokens == [8, 8]


def test_admission_control_rejects_with_reasons_and_never_livelocks():
    eng = make_engine(num_gpu_blocks=16, block_size=4, max_model_len=128, max_num_batched_tokens=32,
                      enable_chunked_prefill=False)
    too_long = make_request("long", 120, max_tokens=10)
    too_big = make_request("big", 30, max_tokens=40)  # 70 tokens > 64 slots in the whole pool
    no_chunk = make_request("nochunk", 40, max_tokens=1)
    ok = make_request("ok", 6, max_tokens=3)
    for r in (too_long, too_big, no_chunk, ok):
        eng.add_request(r)
    eng.run_until_idle()
    assert too_long.status == RequestStatus.FINISHED_REJECTED and "max_model_len" in too_long.stop_reason
    assert too_big.status == RequestStatus.FINISHED_REJECTED and "whole pool" in too_big.stop_reason
    assert no_chunk.status == RequestStatus.FINISHED_REJECTED and "chunked prefill" in no_chunk.stop_reason
    assert ok.status == RequestStatus.FINISHED_LENGTH and ok.num_output_tokens == 3


def test_rejected_requests_are_reported_by_the_next_step():
    eng = make_engine(max_model_len=16)
    eng.add_request(make_request("x", 20))
    step = eng.step(0.0)
    assert [r.request_id for r in step.finished] == ["x"]


def test_tiny_pool_preempts_by_recompute_and_everyone_finishes():
    eng = make_engine(num_gpu_blocks=6, block_size=4, max_num_batched_tokens=64)
    reqs = [make_request(f"r{i}", 5, max_tokens=10) for i in range(4)]
    for r in reqs:
        eng.add_request(r)
    eng.run_until_idle()
    assert eng.scheduler.num_preemptions > 0
    assert all(r.status == RequestStatus.FINISHED_LENGTH and r.num_output_tokens == 10 for r in reqs)
    assert eng.scheduler.kv_cache_manager.num_free_blocks == 6


def test_swap_preemption_moves_blocks_to_host_and_back():
    eng = make_engine(num_gpu_blocks=6, block_size=4, num_cpu_blocks=16, preemption_mode="swap",
                      block_bytes=100)
    reqs = [make_request(f"r{i}", 5, max_tokens=10) for i in range(4)]
    for r in reqs:
        eng.add_request(r)
    swapped_out = swapped_in = 0
    now = 0.0
    while eng.has_unfinished_requests():
        step = eng.step(now)
        now = step.end_time
        swapped_out += len(step.scheduler_output.blocks_to_swap_out)
        swapped_in += len(step.scheduler_output.blocks_to_swap_in)
        assert step.scheduler_output.swap_out_bytes == 100 * len(step.scheduler_output.blocks_to_swap_out)
    assert swapped_out > 0 and swapped_in == swapped_out
    assert all(r.num_output_tokens == 10 for r in reqs)
    kvm = eng.scheduler.kv_cache_manager
    assert kvm.num_free_blocks == 6 and len(kvm.free_cpu_blocks) == 16


def test_priority_policy_admits_urgent_requests_first():
    eng = make_engine(num_gpu_blocks=100, block_size=4, max_num_seqs=1, policy="priority")
    low = make_request("low", 4, max_tokens=2)
    high = make_request("high", 4, max_tokens=2)
    high.priority = -1
    eng.add_request(low)
    eng.add_request(high)
    out = eng.scheduler.schedule(0.0)
    assert [r.request_id for r in out.reqs] == ["high"]


def test_stop_token_from_executor_finishes_request():
    eng = make_engine(executor=IdealExecutor(token_id=7))
    r = make_request("a", [1, 2, 3], max_tokens=10, stop_token_ids=(7,))
    eng.add_request(r)
    eng.run_until_idle()
    assert r.status == RequestStatus.FINISHED_STOPPED and r.output_token_ids == [7]


def test_abort_frees_blocks_within_one_step():
    eng = make_engine(num_gpu_blocks=10, block_size=4)
    r = make_request("a", 8, max_tokens=20)
    eng.add_request(r)
    eng.step(0.0)
    assert eng.scheduler.kv_cache_manager.num_free_blocks < 10
    assert eng.abort_request("a", 0.5, "client went away")
    assert eng.scheduler.kv_cache_manager.num_free_blocks == 10
    step = eng.step(0.5)
    assert step.finished == [r] and r.status == RequestStatus.FINISHED_ABORTED
    assert "a" in step.scheduler_output.finished_req_ids
    assert not eng.abort_request("nope", 1.0)


def test_parallel_sampling_forks_children_sharing_prompt_blocks():
    eng = make_engine(num_gpu_blocks=64, block_size=4)
    parent = make_request("p", list(range(10)), max_tokens=3, n=3, seed=5)
    eng.add_request(parent)
    out = eng.scheduler.schedule(0.0)
    assert out.num_new_tokens == [9]  # everything before the fork point
    eng.scheduler.update(out, StepResult(0.01), 0.01)
    kvm = eng.scheduler.kv_cache_manager
    children = [r for r in eng.scheduler.running if r.parent_request_id == "p"]
    assert [c.request_id for c in children] == ["1_p", "2_p"]
    assert [c.sampling_params.seed for c in children] == [6, 7]
    assert kvm.get_block_ids("1_p")[:2] == kvm.get_block_ids("p")[:2]
    out2 = eng.scheduler.schedule(0.01)
    assert len(out2.blocks_to_copy) == 2  # the partial third block, once per child
    assert out2.num_new_tokens == [1, 1, 1]
    eng.scheduler.update(out2, StepResult(0.01), 0.02)
    eng.run_until_idle(0.02)
    assert parent.num_output_tokens == 3 and all(c.num_output_tokens == 3 for c in children)
    assert kvm.num_free_blocks == 64


def test_orca_finishes_mixed_lengths_in_fewer_steps_than_static_batching():
    def run(batching):
        eng = make_engine(num_gpu_blocks=1000, block_size=16, max_num_seqs=4,
                          max_num_batched_tokens=2048, batching=batching)
        for i, out_len in enumerate([2, 50, 3, 40, 5, 60, 4, 30]):
            eng.add_request(make_request(f"r{i}", 32, max_tokens=out_len))
        steps = 0
        now = 0.0
        while eng.has_unfinished_requests():
            now = eng.step(now).end_time
            steps += 1
        return steps

    orca, static = run("continuous"), run("static")
    assert orca < static


def test_prefill_and_decode_roles_hand_over_a_request():
    prefill = make_engine(num_gpu_blocks=32, block_size=4, role="prefill")
    decode = make_engine(num_gpu_blocks=8, block_size=4, role="decode")
    reqs = [make_request(f"r{i}", 10, max_tokens=5) for i in range(3)]
    for r in reqs:
        prefill.add_request(r)
    step = prefill.step(0.0)
    ready = step.kv_ready
    assert [r.request_id for r in ready] == ["r0", "r1", "r2"]
    assert all(r.num_output_tokens == 1 and r.status == RequestStatus.WAITING_FOR_REMOTE_KV for r in ready)
    assert prefill.scheduler.kv_cache_manager.num_free_blocks == 32 - 9  # held until released
    for r in ready:
        decode.add_request(r)
    out = decode.scheduler.schedule(0.1)
    # back-pressure: 8 blocks fit two 10-token prompts (3 blocks each), not the third
    assert [r.request_id for r, _ in out.kv_to_receive] == ["r0", "r1"]
    hand_over(prefill, decode, out, 0.1)  # the transfers complete instantly here
    assert prefill.scheduler.kv_cache_manager.num_free_blocks == 32
    assert decode.scheduler.kv_cache_manager.num_free_blocks == 8
    assert reqs[0].status == RequestStatus.FINISHED_LENGTH and reqs[0].num_output_tokens == 5
    assert reqs[2].status == RequestStatus.FINISHED_LENGTH  # admitted once blocks freed


def test_lost_kv_transfer_falls_back_to_recompute():
    decode = make_engine(num_gpu_blocks=16, block_size=4, role="decode")
    r = make_request("r", 10, max_tokens=4)
    r.append_output_token(None, 0.05)
    r.status = RequestStatus.WAITING_FOR_REMOTE_KV
    decode.add_request(r)
    out = decode.scheduler.schedule(0.1)
    assert out.kv_to_receive
    decode.scheduler.on_kv_failed("r")
    decode.scheduler.update(out, StepResult(0.0), 0.1)
    out2 = decode.scheduler.schedule(0.1)
    assert out2.num_new_tokens == [11]  # prompt + first token recomputed locally
    decode.scheduler.update(out2, StepResult(0.01), 0.11)
    decode.run_until_idle(0.11)
    assert r.num_output_tokens == 4 and decode.scheduler.kv_cache_manager.num_free_blocks == 16
