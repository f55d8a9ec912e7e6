"""The TP all-reduce implementation (`cluster.allreduce`): NCCL's per-call extra on top of
the ring model, per all-reduce call of the step (simulator/cost/collectives.py)."""

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.collectives import NCCL_EXTRA_PER_CALL_S
from simulator.cost.costmodel import CostModel
from simulator.scenario import load_scenario


def _decode(n: int = 8, ctx: int = 512) -> BatchShape:
    return BatchShape.from_lists([1] * n, [ctx] * n)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_nccl_adds_its_per_call_extra_for_each_allreduce(tp):
    custom = CostModel("llama-2-70b", "a100-80gb-sxm", "fp16", tp=tp)
    nccl = CostModel("llama-2-70b", "a100-80gb-sxm", "fp16", tp=tp, allreduce="nccl")
    calls = 2 * custom.model.num_layers  # after attention and after the MLP, every layer
    for shape in (_decode(1), _decode(64), BatchShape.from_lists([2048], [0])):
        extra = nccl.step_time(shape) - custom.step_time(shape)
        assert extra == pytest.approx(calls * NCCL_EXTRA_PER_CALL_S, rel=1e-9)
        assert nccl.explain(shape).total_s == pytest.approx(nccl.step_time(shape), rel=1e-9)


def test_one_gpu_has_no_allreduce_to_pay_for():
    a = CostModel("llama-2-7b", "a100-80gb-sxm", "fp16", tp=1)
    b = CostModel("llama-2-7b", "a100-80gb-sxm", "fp16", tp=1, allreduce="nccl")
    assert a.step_time(_decode()) == b.step_time(_decode())


def test_unknown_allreduce_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match="custom, nccl"):
        CostModel("llama-2-7b", "a100-80gb-sxm", "fp16", tp=2, allreduce="gloo")


def test_scenario_key_refuses_unknown_value(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("model: llama-2-7b\nhardware: a100-80gb-sxm\ncluster: {tp: 2, allreduce: mpi}\n"
                 "workload: {synthetic: {num_requests: 2}}\n")
    with pytest.raises(ValueError, match="allreduce"):
        load_scenario(p)
