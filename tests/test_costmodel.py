"""CostModel API: explain() agrees with step_time(), decode_run_times() with repeated
step_time(), the ring all-reduce formula, parallelism errors, calibration profiles."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_link
from simulator.cost.models import get_model
from simulator.cost.op_cost import BOUNDS
from simulator.cost.params import CostParams

CONFIGS = [  # (model, hardware, dtype, tp, pp)
    ("llama-3-8b", "h100-sxm", "bf16", 1, 1),
    ("llama-3-8b", "l4", "fp8", 2, 1),
    ("llama-3-70b", "h100-sxm", "bf16", 4, 2),
    ("llama-3-70b", "h200-sxm", "fp8", 8, 1),  # prefills past NCCL's large-message crossover
    ("mixtral-8x7b", "a100-80gb-sxm", "int4", 2, 1),
    ("mixtral-8x7b", "mi300x", "fp8", 1, 2),
    ("qwen2.5-7b", "b200", "bf16", 4, 1),
    ("gpt2", "cpu", "fp32", 1, 1),
    ("opt-13b", "a10g", "bf16", 2, 3),
]

def _shape(news: list[int], ctxs: list[int]) -> BatchShape:
    return BatchShape.from_lists(news, ctxs[: len(news)])


@settings(max_examples=80, deadline=None)
@given(news=st.lists(st.one_of(st.just(1), st.integers(1, 600)), min_size=1, max_size=40),
       ctxs=st.lists(st.integers(0, 9000), min_size=40, max_size=40),
       cfg=st.sampled_from(CONFIGS))
def test_explain_total_equals_step_time(news: list[int], ctxs: list[int], cfg: tuple) -> None:
    model, hw, dtype, tp, pp = cfg
    cm = CostModel(model, hw, dtype=dtype, tp=tp, pp=pp)
    shape = _shape(news, ctxs)
    br = cm.explain(shape)
    assert br.total_s == pytest.approx(cm.step_time(shape), rel=1e-12)
    assert br.total_s == pytest.approx(sum(op.time_s for op in br.ops), rel=1e-12)
    assert sum(br.by_bound.values()) == pytest.approx(br.total_s, rel=1e-12)
    assert br.bound in BOUNDS and all(op.bound in BOUNDS for op in br.ops)
    assert br.dominant_op.time_s == max(op.time_s for op in br.ops)
    for op in br.ops:
        assert op.time_s >= 0 and op.flops >= 0 and op.bytes >= 0
        if op.bound in ("compute", "memory"):
            assert op.time_s == max(op.compute_s, op.memory_s)
            assert op.bound == ("compute" if op.compute_s > op.memory_s else "memory")


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 300), ctx=st.integers(1, 9000), steps=st.integers(1, 300),
       cfg=st.sampled_from(CONFIGS))
def test_decode_run_times_equal_repeated_step_time(batch: int, ctx: int, steps: int,
                                                   cfg: tuple) -> None:
    model, hw, dtype, tp, pp = cfg
    cm = CostModel(model, hw, dtype=dtype, tp=tp, pp=pp)
    shape = BatchShape.from_lists([1] * batch, [ctx + i % 7 for i in range(batch)])
    run = cm.decode_run_times(shape, steps)
    expected = np.array([cm.step_time(shape.advanced(k)) for k in range(steps)])
    assert run.shape == (steps,)
    np.testing.assert_allclose(run, expected, rtol=1e-12, atol=0)
    assert np.all(np.diff(run) >= 0)  # contexts only grow


def test_decode_run_times_rejects_prefills_and_bad_counts() -> None:
    cm = CostModel("llama-3-8b", "h100-sxm")
    with pytest.raises(ValueError, match="all-decode"):
        cm.decode_run_times(BatchShape.from_lists([1, 100], [10, 0]), 5)
    with pytest.raises(ValueError, match="num_steps"):
        cm.decode_run_times(BatchShape.from_lists([1], [10]), -1)
    assert cm.decode_run_times(BatchShape.from_lists([1], [10]), 0).shape == (0,)


def test_empty_step_costs_nothing() -> None:
    cm = CostModel("llama-3-8b", "h100-sxm")
    assert cm.step_time(BatchShape()) == 0.0 and cm.explain(BatchShape()).total_s == 0.0


def test_explain_names_the_bound_of_typical_steps() -> None:
    cm = CostModel("llama-3-8b", "h100-sxm")
    pre = cm.explain(BatchShape.from_lists([4096], [0]))
    assert pre.bound == "compute" and pre.dominant_op.name == "mlp"
    dec = cm.explain(BatchShape.from_lists([1], [100]))
    assert dec.bound == "memory" and dec.dominant_op.name == "mlp"
    tiny = CostModel("gpt2", "h100-sxm").explain(BatchShape.from_lists([1], [10]))
    assert tiny.bound == "overhead"  # 250 MB of weights read in ~0.1 ms: launch/CPU dominate
    comm = CostModel("llama-3-70b", {"base": "h100-sxm", "scale_up_link": "pcie4"}, tp=8)
    assert comm.explain(BatchShape.from_lists([2048], [0])).bound == "communication"


def test_tp_allreduce_is_the_ring_formula() -> None:
    """Two all-reduces of the hidden state per layer, each moving 2 (tp-1)/tp x T x d x 2
    bytes at bw x eff: over NVLink with its fitted per-call time and efficiency
    (call + (tp-1) x rank), over a link without a fit a ring of 2 (tp-1) x latency."""
    model = get_model("llama-3-70b")
    T = 300
    for tp in (2, 4, 8):
        for hw, link_name in (("h100-sxm", "nvlink4"),
                              ({"base": "h100-sxm", "scale_up_link": "pcie5"}, "pcie5")):
            link = get_link(link_name)
            cm = CostModel(model, hw, tp=tp)
            op = next(o for o in cm.explain(BatchShape.from_lists([T], [0])).ops
                      if o.name == "tp_allreduce")
            msg = T * model.hidden_size * 2
            if link.allreduce_call_s is None:
                fixed, eff = 2 * (tp - 1) * link.latency_s, cm.params.comm_efficiency
            else:
                fixed = link.allreduce_call_s + (tp - 1) * link.allreduce_rank_s
                eff = link.allreduce_efficiency
            per = 2 * (tp - 1) / tp * msg / (link.bandwidth_bytes_per_s * eff) + fixed
            assert op.time_s == pytest.approx(2 * model.num_layers * per, rel=1e-12)
            assert op.bytes == pytest.approx(2 * model.num_layers * 2 * (tp - 1) / tp * msg)
    assert all(o.name != "tp_allreduce" for o in CostModel(model, "h100-sxm", tp=1)
               .explain(BatchShape.from_lists([T], [0])).ops)


def test_kv_transfer_bytes() -> None:
    cm = CostModel("llama-3-8b", "h100-sxm")
    assert cm.kv_transfer_bytes(1000) == 1000 * 131_072
    assert CostModel("llama-3-8b", "h100-sxm", kv_cache_dtype="fp8").kv_transfer_bytes(10) == 655_360
    assert CostModel("llama-3-70b", "h100-sxm", tp=4).kv_transfer_bytes(1) == 327_680
    assert CostModel("llama-3-8b", "h100-sxm", dtype="int4").kv_cache_dtype == "fp16"


TOY = {"architectures": ["LlamaForCausalLM"], "hidden_size": 3072, "num_hidden_layers": 4,
       "num_attention_heads": 24, "num_key_value_heads": 12, "intermediate_size": 8000,
       "vocab_size": 1000}


@pytest.mark.parametrize("model, tp, message", [
    ("llama-3-8b", 3, r"tp=3 does not divide num_heads=32 of llama-3-8b: each tensor-parallel "
                      r"rank must hold whole attention heads \(valid tp: \[1, 2, 4, 8, 16, 32\]\)"),
    ("qwen2.5-7b", 8, r"tp=8 does not divide num_heads=28"),
    ("qwen2.5-7b", 7, r"tp=7 is not a multiple of num_kv_heads=4"),
    (TOY, 8, r"tp=8 does not divide num_kv_heads=12"),
    ({**TOY, "num_key_value_heads": 24}, 3, r"tp=3 does not divide ffn_size=8000"),
    ("gpt2", 0, r"positive integer"),
])
def test_invalid_tensor_parallel_degrees_are_rejected_with_the_reason(model, tp: int,
                                                                      message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CostModel(model, "h100-sxm", tp=tp)


def test_replicated_kv_heads_and_too_many_stages() -> None:
    assert CostModel("qwen2.5-7b", "h100-sxm", tp=4).shard.kv_heads == 1
    assert CostModel("llama-3-70b", "h100-sxm", tp=16).shard.kv_heads == 1  # replicated x2
    with pytest.raises(ValueError, match="pp=13 exceeds the 12 layers of gpt2"):
        CostModel("gpt2", "h100-sxm", pp=13)


def test_fp32_needs_an_fp32_figure() -> None:
    with pytest.raises(ValueError, match="fp32_tflops"):
        CostModel("gpt2", {"base": "b200", "name": "b200-nofp32", "fp32_tflops": None},
                  dtype="fp32")


def test_catalog_matmul_efficiency_becomes_the_default() -> None:
    assert CostModel("gpt2", "h100-sxm").params.gemm_compute_efficiency == 0.803
    assert CostModel("gpt2", "l4").params.gemm_compute_efficiency == CostParams().gemm_compute_efficiency


# ---- calibration profiles ----------------------------------------------------------------

def test_params_roundtrip_and_refuse_another_device_or_model(tmp_path) -> None:
    fitted = dataclasses.replace(CostParams().from_vector(
        [0.7, 0.8, 0.4, 0.6, 0.9, 0.75, 1e-3, 2e-6, 5e-8, 3e-5, 2e-4, 0.3, 0.6], device="h100-sxm",
        model="llama-3-8b", source="fit"), gemm_row_passes_below=4)
    path = tmp_path / "profile.yaml"
    fitted.save(str(path))
    loaded = CostParams.load(str(path), device="h100-sxm", model="llama-3-8b")
    assert loaded.to_vector() == fitted.to_vector()
    assert (loaded.decode_padding, loaded.overlap, loaded.gemm_row_passes_below) == (0.3, 0.6, 4)
    assert loaded.gemv_memory_efficiency == 0.75
    assert loaded.request_overhead_s == 3e-5
    assert (loaded.device, loaded.model) == ("h100-sxm", "llama-3-8b")
    with pytest.raises(ValueError, match="profile is for device 'h100-sxm', not 'a100-80gb-sxm'"):
        CostParams.load(str(path), device="a100-80gb-sxm")
    with pytest.raises(ValueError, match="profile is for model 'llama-3-8b'"):
        CostModel("mistral-7b", "h100-sxm", params=loaded)
    cm = CostModel("llama-3-8b", "h100-sxm", params=loaded)
    slower = CostModel("llama-3-8b", "h100-sxm", params=dataclasses.replace(
        loaded, step_overhead_s=loaded.step_overhead_s + 1e-3))
    shape = BatchShape.from_lists([1] * 8, [500] * 8)
    assert slower.step_time(shape) == pytest.approx(cm.step_time(shape) + 1e-3)


@pytest.mark.parametrize("text, message", [
    ("params: {gemm_compute_efficiency: 1.5}", "gemm_compute_efficiency must be a fraction"),
    ("params: {step_overhead_s: -1}", "step_overhead_s must be seconds >= 0"),
    ("params: {step_overhead_s: .inf}", "step_overhead_s must be seconds >= 0, got inf"),
    ("params: {decode_padding: 1.5}", r"decode_padding must be a fraction in \[0, 1\]"),
    ("params: {overlap: -0.1}", r"overlap must be a fraction in \[0, 1\]"),
    ("params: {gemm_row_passes_below: 2.5}", "gemm_row_passes_below must be an integer >= 0"),
    ("params: {warp_speed: 9}", r"unknown parameter\(s\) \['warp_speed'\]"),
    ("device: h100\n", "'params' mapping"),
    ("params: {}\nowner: me", r"unknown top-level field\(s\) \['owner'\]"),
])
def test_bad_profiles_name_the_file_and_field(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as exc:
        CostParams.load(str(path))
    assert "bad.yaml" in str(exc.value)


def test_fit_helpers_are_consistent() -> None:
    p = CostParams()
    lo, hi = CostParams.fit_bounds()
    assert len(lo) == len(hi) == len(p.to_vector()) == len(CostParams.FIT_FIELDS)
    assert all(a <= v <= b for a, v, b in zip(lo, p.to_vector(), hi))
    with pytest.raises(ValueError, match="expected 13 values"):
        p.from_vector([0.5])


def test_scheduler_host_time_adds_or_hides_behind_the_step():
    """cluster.host_request_s: added to every step with synchronous scheduling; with async
    scheduling the longer of the step and the scheduler counts. The breakdown's
    `scheduler_host` operator carries what shows, and the decode fast path agrees."""
    from simulator.cost.decode_steps import decode_terms

    small = BatchShape()
    for _ in range(4):
        small.add(1, 100)
    big = BatchShape()
    for _ in range(4000):
        big.add(1, 100)
    base = CostModel("llama-3.2-1b", "b200")
    sync = CostModel("llama-3.2-1b", "b200", host_request_s=5e-6)
    hidden = CostModel("llama-3.2-1b", "b200", host_request_s=5e-6, async_scheduling=True)
    for shape in (small, big):
        t = base.step_time(shape)
        h = shape.num_reqs * 5e-6
        assert sync.step_time(shape) == pytest.approx(t + h, rel=1e-12)
        assert hidden.step_time(shape) == pytest.approx(max(t, h), rel=1e-12)
        for cm in (sync, hidden):
            br = cm.explain(shape)
            assert br.total_s == pytest.approx(cm.step_time(shape), rel=1e-12)
            op = next(o for o in br.ops if o.name == "scheduler_host")
            assert op.time_s == pytest.approx(cm.step_time(shape) - t, rel=1e-9, abs=1e-15)
            terms = decode_terms(cm, shape)
            assert terms.step(shape.decode_context_tokens, 0) == pytest.approx(
                cm.step_time(shape), rel=1e-12)
    assert hidden.step_time(small) == pytest.approx(base.step_time(small), rel=1e-12)  # hidden
    assert hidden.step_time(big) == pytest.approx(4000 * 5e-6, rel=1e-12)  # host-bound
    with pytest.raises(ValueError, match="host_request_s"):
        CostModel("llama-3.2-1b", "b200", host_request_s=-1.0)
