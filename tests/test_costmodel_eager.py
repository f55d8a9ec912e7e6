"""Steps outside CUDA graphs (`cluster.prefill_graph_max_tokens`, simulator/cost/eager_dispatch.py):
a step with prompt tokens and more tokens than the limit adds its layers' host dispatch; a
decode-only step or a step within the limit does not, and `explain` accounts for it."""

from __future__ import annotations

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.eager_dispatch import SGLANG_EAGER_LAYER_S, EagerDispatch

MODEL, HW = "qwen3-30b-a3b", "h100-sxm"


def model(eager: EagerDispatch | None) -> CostModel:
    return CostModel(MODEL, HW, "bf16", tp=2, eager=eager)


PROMPT = BatchShape.from_lists([1000], [0])
MIXED = BatchShape.from_lists([1000, 1, 1], [0, 500, 700])
DECODE = BatchShape.from_lists([1, 1, 1, 1], [100, 200, 300, 400])


def test_the_price_is_sglangs_eager_minus_graphed_forward_per_layer():
    assert pytest.approx((82.6 - 23.1) / 61 * 1e-3) == SGLANG_EAGER_LAYER_S


@pytest.mark.parametrize("shape", [PROMPT, MIXED])
def test_a_prompt_step_over_the_limit_adds_every_layers_dispatch(shape):
    base = model(None)
    layers = base.model.num_layers
    eager = model(EagerDispatch(0))
    assert eager.step_time(shape) == pytest.approx(base.step_time(shape)
                                                   + layers * SGLANG_EAGER_LAYER_S)
    within = model(EagerDispatch(shape.num_tokens))  # graphed up to the step's own size
    assert within.step_time(shape) == base.step_time(shape)
    just_over = model(EagerDispatch(shape.num_tokens - 1))
    assert just_over.step_time(shape) > base.step_time(shape)


def test_decode_steps_and_their_fast_paths_are_untouched():
    base, eager = model(None), model(EagerDispatch(0, layer_s=1e-3))
    assert eager.step_time(DECODE) == base.step_time(DECODE)
    assert eager.decode_step_time(DECODE) == base.decode_step_time(DECODE)
    assert list(eager.decode_run_times(DECODE, 5)) == list(base.decode_run_times(DECODE, 5))


def test_explain_names_the_dispatch_and_sums_to_the_step_time():
    cm = model(EagerDispatch(512))
    br = cm.explain(PROMPT)
    ops = {op.name: op for op in br.ops}
    assert "eager_dispatch" in ops and "PR #12160" in ops["eager_dispatch"].source
    assert ops["eager_dispatch"].time_s == pytest.approx(cm.model.num_layers * SGLANG_EAGER_LAYER_S)
    assert br.total_s == pytest.approx(cm.step_time(PROMPT))
    assert "eager_dispatch" not in {op.name for op in cm.explain(DECODE).ops}
    assert cm.describe()["prefill_graph_max_tokens"] == 512


def test_pipeline_stages_take_it_once_per_step():
    base = CostModel(MODEL, HW, "bf16", tp=1, pp=2)
    eager = CostModel(MODEL, HW, "bf16", tp=1, pp=2, eager=EagerDispatch(0, layer_s=1e-3))
    assert eager.step_time(PROMPT) == pytest.approx(base.step_time(PROMPT)
                                                    + base.model.num_layers * 1e-3)


@pytest.mark.parametrize("kwargs, says", [
    ({"max_graph_tokens": -1}, "prefill_graph_max_tokens must be an integer >= 0"),
    ({"max_graph_tokens": 1.5}, "prefill_graph_max_tokens must be an integer >= 0"),
    ({"max_graph_tokens": 0, "layer_s": -1e-3}, "eager_layer_s must be >= 0 s"),
])
def test_bad_values_are_refused(kwargs, says):
    with pytest.raises(ValueError, match=says):
        EagerDispatch(**kwargs)
