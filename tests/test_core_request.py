import pytest

from simulator.core import Request, RequestStatus, SamplingParams


def test_sampling_params_reject_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=-3)
    with pytest.raises(ValueError, match="n must"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match="unknown sampling option.*beam_width"):
        SamplingParams.from_dict({"beam_width": 4})
    assert SamplingParams.from_dict({"temperature": 0.0}).greedy


def test_request_prompt_forms_and_validation():
    r = Request("a", prompt_token_ids=[5, 6, 7])
    assert r.num_prompt_tokens == 3 and r.num_tokens == 3
    r2 = Request("b", num_prompt_tokens=100, prompt_hash_ids=[1], hash_block_size=512)
    assert r2.num_prompt_tokens == 100 and not r2.has_token_ids
    with pytest.raises(ValueError, match="at least 1 token"):
        Request("c", prompt_token_ids=[])
    with pytest.raises(ValueError, match="at least 1 token"):
        Request("d", num_prompt_tokens=-5)
    with pytest.raises(ValueError, match="disagrees"):
        Request("e", prompt_token_ids=[1, 2], num_prompt_tokens=3)
    with pytest.raises(ValueError, match="hash_block_size"):
        Request("f", num_prompt_tokens=10, prompt_hash_ids=[1])


def test_token_ids_slice_spans_prompt_and_output():
    r = Request("a", prompt_token_ids=[1, 2, 3])
    r.append_output_token(9, now=1.0)
    r.append_output_token(8, now=2.0)
    assert r.token_ids_slice(0, 5) == [1, 2, 3, 9, 8]
    assert r.token_ids_slice(2, 4) == [3, 9]
    assert r.token_ids_slice(3, 5) == [9, 8]
    assert r.first_token_time == 1.0 and list(r.token_times) == [1.0, 2.0]


def test_stop_conditions():
    sp = SamplingParams(max_tokens=5, stop_token_ids=(7,), min_tokens=2)
    r = Request("a", prompt_token_ids=[1], sampling_params=sp, eos_token_id=0)
    r.append_output_token(0, 0.0)
    assert r.check_stop(0) is None  # min_tokens not reached yet
    r.append_output_token(0, 0.0)
    assert r.check_stop(0) == RequestStatus.FINISHED_STOPPED
    r2 = Request("b", prompt_token_ids=[1], sampling_params=SamplingParams(ignore_eos=True), eos_token_id=0)
    r2.append_output_token(0, 0.0)
    assert r2.check_stop(0) is None
    r3 = Request("c", prompt_token_ids=[1], sampling_params=SamplingParams(max_tokens=1))
    r3.append_output_token(3, 0.0)
    assert r3.check_stop(3) == RequestStatus.FINISHED_LENGTH


def test_status_order_and_finish_reason():
    assert RequestStatus.WAITING < RequestStatus.WAITING_FOR_REMOTE_KV < RequestStatus.RUNNING
    assert RequestStatus.RUNNING < RequestStatus.PREEMPTED < RequestStatus.FINISHED_STOPPED
    assert not RequestStatus.PREEMPTED.is_finished and RequestStatus.FINISHED_REJECTED.is_finished
    r = Request("a", num_prompt_tokens=4)
    r.finish(RequestStatus.FINISHED_REJECTED, 3.0, "too long")
    assert r.finish_reason == "rejected" and r.stop_reason == "too long" and r.finish_time == 3.0


def test_sampling_params_pickle_as_they_are():
    # multi-process runs ship kept requests back by pickle; the compiled core's frozen
    # instances cannot be restored field by field
    import pickle

    sp = SamplingParams(temperature=0.5, top_k=3, stop_token_ids=[7, 9], max_tokens=12, seed=4)
    back = pickle.loads(pickle.dumps(sp))
    assert back == sp and back.stop_token_ids == (7, 9)
    req = Request("r", prompt_token_ids=[1, 2, 3], sampling_params=sp)
    assert pickle.loads(pickle.dumps(req)).sampling_params == sp
