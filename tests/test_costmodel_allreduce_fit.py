"""The TP all-reduce fit: the links' fits against the published communicator tables they were
fitted to (bench/diagnostics/allreduce.py), the cost model pricing exactly that per call,
NCCL's large-message line above its crossover, full-mesh bandwidth, the ring model kept for
links without a fit, and bad link entries."""

from __future__ import annotations

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.collectives import (
    allreduce_seconds,
    large_allreduce_crossover,
    large_allreduce_seconds,
)
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_link
from tests.bench_helpers import load_diagnostic


def _tables():
    mod = load_diagnostic("allreduce")
    return mod.TABLES[:mod.FITTED]


@pytest.mark.parametrize("table", _tables(), ids=lambda t: t[1])
def test_fit_matches_the_published_tables(table):
    _, name, _, rows = table
    link = get_link(name)
    ratios = [allreduce_seconds(link, tp, nbytes, 0.8) * 1e6 / us for tp, nbytes, us in rows]
    assert all(0.8 <= r <= 1.3 for r in ratios), ratios
    assert sorted(ratios)[len(ratios) // 2] == pytest.approx(1.0, abs=0.05)


def test_cost_model_prices_each_call_as_allreduce_seconds():
    cm = CostModel("llama-3-70b", "h100-sxm", "bf16", tp=4)
    m = 32  # requests: one hidden state each, 32 x 8192 x 2 bytes per call
    ops = {op.name: op for op in explain_step(cm, BatchShape.from_lists([1] * m, [512] * m)).ops}
    calls = 2 * cm.model.num_layers
    per_call = allreduce_seconds(cm.link, 4, m * cm.model.hidden_size * 2, cm.params.comm_efficiency)
    assert ops["tp_allreduce"].time_s == pytest.approx(calls * per_call, rel=1e-9)
    assert ops["tp_allreduce"].efficiency == cm.link.allreduce_efficiency
    assert "links.yaml nvlink4" in ops["tp_allreduce"].source


def test_large_messages_take_nccls_line_above_the_crossover():
    link = get_link("nvlink4")
    ring = 2 * 7 / 8

    def fit(nbytes: float) -> float:  # the 0.5-4 MiB fit
        return (link.allreduce_fixed_s(8)
                + ring * nbytes / (link.group_bandwidth(8) * link.allreduce_efficiency))

    cross = large_allreduce_crossover(link, 8, 0.8)[0]
    assert 20e6 < cross < 60e6  # tens of MB: decode's messages never reach it
    for nbytes in (cross / 4, cross / 2):  # below: the fit as before
        assert allreduce_seconds(link, 8, nbytes, 0.8) == pytest.approx(fit(nbytes))
    for nbytes in (2 * cross, 128 * 2**20):  # above: NCCL's call + bytes at NVLS's algbw
        assert allreduce_seconds(link, 8, nbytes, 0.8) == pytest.approx(
            link.large_allreduce_call_s + nbytes / link.large_allreduce_nvls_bytes_per_s)
        assert allreduce_seconds(link, 8, nbytes, 0.8) < fit(nbytes)
    # below 8 GPUs (NVLS's figure is for 8) a ring: bus bandwidth over 2 (tp - 1)/tp
    assert link.large_allreduce_nvls_min_tp == 8
    for tp in (2, 4):
        assert link.large_allreduce_seconds_per_byte(tp) == pytest.approx(
            2 * (tp - 1) / tp / link.large_allreduce_ring_bytes_per_s)
        assert large_allreduce_crossover(link, tp, 0.8)[0] > 3 * cross
    # an engine that pays NCCL's extra per call on every call crosses over sooner
    assert large_allreduce_crossover(link, 8, 0.8, "nccl")[0] < cross
    for name in ("nvlink5", "pcie5", "infinity-fabric-mi300"):  # no table: no second line
        assert large_allreduce_seconds(get_link(name), 8, 1e9) is None
        assert large_allreduce_crossover(get_link(name), 8, 0.8)[0] == float("inf")


def test_cost_model_prices_a_long_prefill_on_nccls_line():
    cm = CostModel("llama-3-70b", "h100-sxm", "fp8", tp=8)
    T = 8192  # one prefill chunk: 8192 x 8192 x 2 bytes = 134 MB per call
    shape = BatchShape.from_lists([T], [0])
    ops = {op.name: op for op in explain_step(cm, shape).ops}
    per_call = allreduce_seconds(cm.link, 8, T * cm.model.hidden_size * 2, cm.params.comm_efficiency)
    assert per_call == large_allreduce_seconds(cm.link, 8, T * cm.model.hidden_size * 2)
    assert ops["tp_allreduce"].time_s == pytest.approx(2 * cm.model.num_layers * per_call,
                                                       rel=1e-9)
    assert "large_allreduce" in ops["tp_allreduce"].source
    assert "NVLink SHARP" in ops["tp_allreduce"].source
    assert cm.step_time(shape) == pytest.approx(sum(op.time_s for op in ops.values()), rel=1e-12)


def test_a_full_mesh_group_uses_tp_minus_one_of_its_links():
    link = get_link("infinity-fabric-mi300")
    assert link.mesh_links == 7
    assert link.group_bandwidth(2) == pytest.approx(link.bandwidth_bytes_per_s / 7)
    assert link.group_bandwidth(8) == pytest.approx(link.bandwidth_bytes_per_s)
    big = 64 * 2**20  # bytes-bound: TP2 sends 1 x S over one link, TP8 1.75 x S over seven
    t2, t8 = (allreduce_seconds(link, tp, big, 0.8) - link.allreduce_fixed_s(tp) for tp in (2, 8))
    assert t2 / t8 == pytest.approx(1.0 / (1.75 / 7))
    nv = get_link("nvlink4")  # through a switch every group has the whole attachment
    assert nv.group_bandwidth(2) == nv.group_bandwidth(8) == nv.bandwidth_bytes_per_s


def test_links_without_a_fit_keep_the_ring():
    link = get_link("pcie5")
    assert link.allreduce_call_s is None and link.allreduce_efficiency is None
    assert link.allreduce_fixed_s(4) == pytest.approx(6 * link.latency_s)
    assert allreduce_seconds(link, 4, 1e6, 0.8) == pytest.approx(
        6 * link.latency_s + 1.5e6 / (link.bandwidth_bytes_per_s * 0.8))
    assert allreduce_seconds(link, 1, 1e6, 0.8) == 0.0


@pytest.mark.parametrize("spec, match", [
    ({"base": "nvlink4", "allreduce_efficiency": 1.5}, "allreduce_efficiency must be in"),
    ({"name": "x", "bandwidth_gb_s": 100, "latency_us": 1, "allreduce_call_us": 5},
     "missing allreduce_rank_us, allreduce_efficiency"),
    ({"base": "infinity-fabric-mi300", "mesh_links": 2.5}, "mesh_links must be a positive integer"),
    ({"base": "pcie5", "large_allreduce_call_us": 70}, "missing large_allreduce_nvls_gb_s"),
    ({"base": "nvlink4", "large_allreduce_nvls_gb_s": 0, "large_allreduce_ring_gb_s": 0},
     "large_allreduce_nvls_gb_s or large_allreduce_ring_gb_s must be > 0"),
    ({"base": "nvlink4", "large_allreduce_nvls_min_tp": 2.5},
     "large_allreduce_nvls_min_tp must be a positive integer"),
])
def test_bad_link_fields_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        get_link(spec)


def test_inline_link_can_scale_the_fit():
    base, faster = get_link("nvlink4"), get_link({"base": "nvlink4", "allreduce_call_us_scale": 0.5})
    assert faster.allreduce_call_s == pytest.approx(base.allreduce_call_s / 2)
