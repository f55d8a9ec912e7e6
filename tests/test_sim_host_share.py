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

    from simulator.cluster.cluster import SimCluster
    from simulator.cluster.timeline import Timeline
    from simulator.core.batch_shape import BatchShape
    from simulator.cost.models import get_model

    sc = scenario_from_dict(merged(PD, {"cluster": {"host_memory_share": 0.5}}))
    c = SimCluster(simpy.Environment(), sc, get_model("llama-3-8b"), Timeline(enabled=False),
                   lambda *_: None)
    p, d = c.prefill_replicas[0], c.decode_replicas[0]
    assert p.neighbours == [d] and d.neighbours == [p]
    from simulator.cost.host_share import contended_cost_model

    slow_cm = contended_cost_model(d.cost_model, 0.5)
    assert slow_cm.accelerator.mem_bw_bytes_per_s == pytest.approx(
        0.5 * d.cost_model.accelerator.mem_bw_bytes_per_s)
    # a memory-bound decode step costs about twice as much; a long prompt much less so
    decode = BatchShape.from_lists([1] * 8, [500] * 8)
    prompt = BatchShape.from_lists([4096], [0])
    r_dec = slow_cm.step_time(decode) / d.cost_model.step_time(decode)
    r_pre = contended_cost_model(p.cost_model, 0.5).step_time(prompt) / p.cost_model.step_time(prompt)
    assert 1.6 < r_dec <= 2.0 and 1.0 <= r_pre < r_dec
    # slowed only while the neighbour is in a step, by as much as the neighbour streams
    # memory (a pure stream: all the way to the share)
    t, t_slow = d.cost_model.decode_step_time(decode), slow_cm.step_time(decode)  # as replicas price decodes
    assert _price_alone_then_beside(d, p, decode, None) == [t]
    assert _price_alone_then_beside(d, p, decode, 1.0) == pytest.approx([t_slow], rel=1e-9)
    s = 1 - 0.5 * 0.3  # a neighbour mostly computing slows it less
    assert _price_alone_then_beside(d, p, decode, 0.3)[0] == pytest.approx(
        t + (t_slow - t) * (1 / s - 1), rel=1e-9)
    # a burst is priced the same way, step by step
    base, mem = d._begin_steps(decode, 5)
    p.in_step, p.mem_fraction = True, 0.3
    for i, x in enumerate(d._prices(base, mem)):
        b, c = d.cost_model.step_time(decode.advanced(i)), slow_cm.step_time(decode.advanced(i))
        assert x == pytest.approx(b + (c - b) * (1 / s - 1), rel=1e-9)


def _price_alone_then_beside(r, neighbour, shape, fraction: float | None) -> list[float]:
    """`r`'s price of one step of `shape` beside `neighbour` in a step spending `fraction`
    of it on memory (None: not in a step)."""
    base, mem = r._begin_steps(shape, 1)
    r._leave_step()
    neighbour.in_step, neighbour.mem_fraction = fraction is not None, fraction or 0.0
    return r._prices(base, mem)


def test_compute_share_applies_to_the_non_memory_seconds() -> None:
    import simpy

    from simulator.cluster.cluster import SimCluster
    from simulator.cluster.timeline import Timeline
    from simulator.core.batch_shape import BatchShape
    from simulator.cost.models import get_model

    sc = scenario_from_dict(merged(PD, {"cluster": {"host_compute_share": 0.8}}))
    c = SimCluster(simpy.Environment(), sc, get_model("llama-3-8b"), Timeline(enabled=False),
                   lambda *_: None)
    p, d = c.prefill_replicas[0], c.decode_replicas[0]
    prompt = BatchShape.from_lists([2048], [0])
    t = p.cost_model.step_time(prompt)
    assert _price_alone_then_beside(p, d, prompt, None) == [t]  # no neighbour in a step
    m = p.host_sharing.memory_seconds(prompt, t)
    assert 0 < m < t
    # memory at full bandwidth (share 1), the rest at 0.8 of its speed
    assert _price_alone_then_beside(p, d, prompt, 0.7)[0] == pytest.approx((t - m) / 0.8 + m,
                                                                          rel=1e-12)


def _two_replicas(share: float = 0.5, compute: float = 0.8):
    import simpy

    from simulator.cluster.cluster import SimCluster
    from simulator.cluster.timeline import Timeline
    from simulator.cost.models import get_model

    sc = scenario_from_dict(merged(PD, {"cluster": {"host_memory_share": share,
                                                    "host_compute_share": compute}}))
    env = simpy.Environment()
    c = SimCluster(env, sc, get_model("llama-3-8b"), Timeline(enabled=False), lambda *_: None)
    return env, c.prefill_replicas[0], c.decode_replicas[0]


def test_a_neighbour_starting_part_way_slows_the_rest_of_a_step() -> None:
    """A prompt step alone for its first 40% of work, then beside a decode step that covers
    the rest, takes 0.4 a + 0.6 x (its price beside that step): neither the price at its
    start (a) nor the shared price for all of it."""
    from simulator.core.batch_shape import BatchShape

    env, p, d = _two_replicas()
    prompt = BatchShape.from_lists([2048], [0])
    decode = BatchShape.from_lists([1] * 64, [3000] * 64)
    a = p.cost_model.step_time(prompt)
    m = p.host_sharing.memory_seconds(prompt, a)
    dd = d.cost_model.step_time(decode)
    f = d.host_sharing.memory_seconds(decode, dd) / dd
    shared = p.host_sharing.price(a, m, f)
    ends = {}

    def prompt_step():
        ends["p"] = yield from p._steps(prompt, 1)

    def decode_step():
        yield env.timeout(0.4 * a)
        ends["d"] = yield from d._steps(decode, 1)

    env.process(prompt_step())
    env.process(decode_step())
    env.run()
    assert shared > 1.05 * a
    want = 0.4 * a + 0.6 * shared
    if ends["d"][0] < want:  # the decode step ended first: the rest ran alone again
        done = 0.4 + (ends["d"][0] - 0.4 * a) / shared
        want = ends["d"][0] + (1 - done) * a
    assert ends["p"][0] == pytest.approx(want, rel=1e-9)
    assert not p.in_step and not d.in_step


def test_steps_of_two_neighbours_overlap_as_the_host_share_model_says() -> None:
    """Two equal steps started together finish at the shared price; one started as the
    other ends runs alone."""
    from simulator.core.batch_shape import BatchShape

    env, p, d = _two_replicas()
    prompt = BatchShape.from_lists([512], [0])
    a = p.cost_model.step_time(prompt)
    m = p.host_sharing.memory_seconds(prompt, a)
    ends = {}

    def run(r, key, delay):
        yield env.timeout(delay)
        ends[key] = (yield from r._steps(prompt, 1))[0]

    env.process(run(p, "p", 0.0))
    env.process(run(d, "d", 0.0))
    env.run()
    both = p.host_sharing.price(a, m, m / a)
    assert ends["p"] == pytest.approx(both, rel=1e-9) and ends["d"] == pytest.approx(both, rel=1e-9)
    env2, p2, d2 = _two_replicas()
    ends2 = {}

    def run2(r, key, delay):
        yield env2.timeout(delay)
        ends2[key] = (yield from r._steps(prompt, 1))[0]

    env2.process(run2(p2, "p", 0.0))
    env2.process(run2(d2, "d", a))
    env2.run()
    assert ends2["p"] == pytest.approx(a, rel=1e-9) and ends2["d"] == pytest.approx(2 * a, rel=1e-9)
