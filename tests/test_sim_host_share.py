"""`cluster.host_memory_share` / `host_compute_share`: replicas on one host share its memory
bandwidth and compute. A step that starts while another replica is in a step is priced with
slower memory and compute; bursts stay equal to step-by-step simulation, and shares of 1
change nothing."""

from __future__ import annotations

import pytest

from simulator.scenario import scenario_from_dict
from tests.sim_helpers import BASE, merged, sim

PD = merged(BASE, {"cluster": {"pd": {"link": "nvlink4", "first_token": "prefill"}},
                   "workload": {"synthetic": {"num_requests": 120}}})


def _summary(scenario: dict) -> dict:
    """The run's summary without its wall-clock figures."""
    s = sim(scenario).summary
    return {k: v for k, v in s.items() if k not in ("wall_s", "sim")}


def _pd(share: float | None, compute: float | None = None, **sim_opts) -> dict:
    patch: dict = {"cluster": {"host_memory_share": share, "host_compute_share": compute}}
    if sim_opts:
        patch["sim"] = sim_opts
    return _summary(merged(PD, patch))


def test_share_of_one_is_separate_devices() -> None:
    assert _pd(1.0) == _pd(None) == _pd(1.0, 1.0)


def test_compute_share_slows_both_pools_and_adds_to_the_memory_share() -> None:
    alone, compute, both = _pd(None), _pd(None, 0.8), _pd(0.6, 0.8)
    for key in ("ttft_s", "tpot_s"):
        assert alone[key]["p50"] < compute[key]["p50"] < both[key]["p50"]
    burst, steps = both, _pd(0.6, 0.8, max_decode_burst=1)
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert burst[key]["p50"] == pytest.approx(steps[key]["p50"], rel=1e-4)


def test_shared_bandwidth_slows_both_pools() -> None:
    alone, shared = _pd(None), _pd(0.5)
    assert shared["tpot_s"]["p50"] > alone["tpot_s"]["p50"]
    assert shared["ttft_s"]["p50"] > alone["ttft_s"]["p50"]
    assert shared["requests"]["finished"] == alone["requests"]["finished"]


def test_bursts_equal_step_by_step_with_sharing() -> None:
    """Bursts are cut whenever a neighbour starts or ends a step; the one difference left is
    that a neighbour reads a burst's memory fraction from its first step (contexts grow by
    a token per step), hence the 1e-4 tolerance."""
    burst, steps = _pd(0.6), _pd(0.6, max_decode_burst=1)
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        for q in ("p50", "p99"):
            assert burst[key][q] == pytest.approx(steps[key][q], rel=1e-4)


def test_a_lone_replica_has_no_neighbour() -> None:
    one = merged(BASE, {"workload": {"synthetic": {"num_requests": 60}}})
    assert _summary(merged(one, {"cluster": {"host_memory_share": 0.3}})) == _summary(one)


def test_deterministic() -> None:
    assert _pd(0.6) == _pd(0.6)


@pytest.mark.parametrize("key", ["host_memory_share", "host_compute_share"])
@pytest.mark.parametrize("bad", [0, -0.2, 1.5])
def test_out_of_range_share_is_refused(key, bad) -> None:
    with pytest.raises(ValueError, match=key):
        scenario_from_dict(merged(PD, {"cluster": {key: bad}}))


def test_contended_steps_use_the_share_of_bandwidth() -> None:
    import simpy

    from simulator.cluster import SimCluster
    from simulator.core.batch_shape import BatchShape
    from simulator.models import get_model
    from simulator.timeline import Timeline

    sc = scenario_from_dict(merged(PD, {"cluster": {"host_memory_share": 0.5}}))
    c = SimCluster(simpy.Environment(), sc, get_model("llama-3-8b"), Timeline(enabled=False),
                   lambda *_: None)
    p, d = c.prefill_replicas[0], c.decode_replicas[0]
    assert p.neighbours == [d] and d.neighbours == [p]
    from simulator.host_share import contended_cost_model

    slow_cm = contended_cost_model(d.cost_model, 0.5)
    assert slow_cm.accelerator.mem_bw_bytes_per_s == pytest.approx(
        0.5 * d.cost_model.accelerator.mem_bw_bytes_per_s)
    # a memory-bound decode step costs about twice as much; a long prompt much less so
    decode = BatchShape.from_lists([1] * 8, [500] * 8)
    prompt = BatchShape.from_lists([4096], [0])
    r_dec = slow_cm.step_time(decode) / d.cost_model.step_time(decode)
    r_pre = contended_cost_model(p.cost_model, 0.5).step_time(prompt) / p.cost_model.step_time(prompt)
    assert 1.6 < r_dec <= 2.0 and 1.0 <= r_pre < r_dec
    # priced at the start of a step: slowed only while the neighbour is in one, by as much
    # as the neighbour streams memory (a pure stream: all the way to the share)
    t, t_slow = d.cost_model.step_time(decode), slow_cm.step_time(decode)
    assert d._durations(decode, 1) == [t]
    d._leave_step()
    p.in_step, p.mem_fraction = True, 1.0
    assert d._durations(decode, 1) == pytest.approx([t_slow], rel=1e-9)
    d._leave_step()
    p.mem_fraction = 0.3  # a neighbour mostly computing slows it less
    s = 1 - 0.5 * 0.3
    assert d._durations(decode, 1)[0] == pytest.approx(t + (t_slow - t) * (1 / s - 1), rel=1e-9)
    # a burst is priced the same way, step by step
    d._leave_step()
    run = d._durations(decode, 5)
    for i, x in enumerate(run):
        b, c = d.cost_model.step_time(decode.advanced(i)), slow_cm.step_time(decode.advanced(i))
        assert x == pytest.approx(b + (c - b) * (1 / s - 1), rel=1e-9)


def test_compute_share_applies_to_the_non_memory_seconds() -> None:
    import simpy

    from simulator.cluster import SimCluster
    from simulator.core.batch_shape import BatchShape
    from simulator.models import get_model
    from simulator.timeline import Timeline

    sc = scenario_from_dict(merged(PD, {"cluster": {"host_compute_share": 0.8}}))
    c = SimCluster(simpy.Environment(), sc, get_model("llama-3-8b"), Timeline(enabled=False),
                   lambda *_: None)
    p, d = c.prefill_replicas[0], c.decode_replicas[0]
    prompt = BatchShape.from_lists([2048], [0])
    t = p.cost_model.step_time(prompt)
    assert p._durations(prompt, 1) == [t]  # no neighbour in a step
    p._leave_step()
    d.in_step, d.mem_fraction = True, 0.7
    m = p.host_sharing.memory_seconds(prompt, t)
    assert 0 < m < t
    # memory at full bandwidth (share 1), the rest at 0.8 of its speed
    assert p._durations(prompt, 1)[0] == pytest.approx((t - m) / 0.8 + m, rel=1e-12)
