"""All-decode pricing (`simulator.cost.decode_steps`): the loop the native build runs and the
numpy form the interpreter runs give bit-identical seconds, and a run equals its steps priced
one at a time, across models (dense, MoE, MLA, sliding layers, sparse attention), pipeline
stages, decode padding, overlap and the added per-step seconds."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.core.batch_shape import BatchShape
from simulator.cost import decode_steps
from simulator.cost.costmodel import CostModel
from simulator.cost.models import get_model
from simulator.cost.params import CostParams

MODELS = {  # name: (model spec, the window its shapes track: 0 for none)
    "llama-3-8b": (get_model("llama-3-8b"), 0),
    "mixtral-8x7b": (get_model("mixtral-8x7b"), 0),
    "deepseek-v2-lite": (get_model("deepseek-v2-lite"), 0),
    "mistral-7b": (get_model("mistral-7b"), 4096),
    "mistral-7b half sliding": (dataclasses.replace(
        get_model("mistral-7b"), num_sliding_layers=get_model("mistral-7b").num_layers // 2),
        4096),
    # sparse attention: top-k capped sums plus the indexer's share of the uncapped ones
    "deepseek-v3.2": (get_model("deepseek-v3.2"), 2048),
    "deepseek-v2-lite sparse": (dataclasses.replace(
        get_model("deepseek-v2-lite"), index_topk=1024, index_n_heads=16, index_head_dim=128),
        1024),
}


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(MODELS)), pp=st.sampled_from([1, 2, 3]),
       padding=st.sampled_from([0.0, 0.5, 1.0]), overlap=st.sampled_from([0.0, 0.3, 1.0]),
       contexts=st.lists(st.integers(1, 12_000), min_size=1, max_size=40),
       steps=st.integers(0, 60), extra_s=st.sampled_from([0.0, 1.5e-4]))
def test_loop_and_numpy_runs_are_bit_identical_and_equal_single_steps(
        name: str, pp: int, padding: float, overlap: float, contexts: list[int], steps: int,
        extra_s: float) -> None:
    model, window = MODELS[name]
    params = dataclasses.replace(CostParams(), decode_padding=padding, overlap=overlap)
    cm = CostModel(model, "h100-sxm", params=params, tp=2, pp=pp)
    shape = BatchShape.from_lists([1] * len(contexts), contexts, window)
    if window and shape.num_decodes_below_window:  # a run stops where a context reaches it
        steps = min(steps, shape.min_window_gap)
    loop = decode_steps._loop_run(cm, shape, steps, extra_s)
    vectorised = decode_steps._numpy_run(cm, shape, steps) + extra_s if extra_s else (
        decode_steps._numpy_run(cm, shape, steps))
    assert loop == vectorised.tolist()
    assert cm.decode_run_list(shape, steps, extra_s) == loop
    singles = [cm.decode_step_time(shape.advanced(j)) for j in range(steps)]
    assert loop == ([t + extra_s for t in singles] if extra_s else singles)
    assert cm.decode_run_times(shape, steps).tolist() == singles
    for j in range(steps):
        assert singles[j] == pytest.approx(cm.step_time(shape.advanced(j)), rel=1e-12)


def test_terms_are_memoised_per_token_request_and_decode_counts() -> None:
    cm = CostModel("llama-3-8b", "h100-sxm")
    a = BatchShape.from_lists([1, 1], [100, 200])
    b = BatchShape.from_lists([1, 1], [5000, 7])
    assert decode_steps.decode_terms(cm, a) is decode_steps.decode_terms(cm, b)
    assert decode_steps.decode_terms(cm, a) is not decode_steps.decode_terms(
        cm, BatchShape.from_lists([1, 1, 1], [100, 200, 300]))


def test_empty_and_mixed_batches() -> None:
    cm = CostModel("llama-3-8b", "h100-sxm")
    assert cm.decode_run_list(BatchShape.from_lists([1], [10]), 0) == []
    assert cm.decode_run_list(BatchShape.from_lists([], []), 3, 0.25) == [0.25] * 3
    assert cm.decode_step_time(BatchShape.from_lists([], [])) == 0.0
    with pytest.raises(ValueError, match="all-decode batch .* 1 prefill"):
        cm.decode_run_list(BatchShape.from_lists([1, 100], [10, 0]), 2)
    with pytest.raises(ValueError, match="all-decode batch .* 1 prefill"):
        cm.decode_step_time(BatchShape.from_lists([1, 100], [10, 0]))
