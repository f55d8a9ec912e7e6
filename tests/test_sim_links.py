import pytest
import simpy

from simulator.cluster.links import SimLink


def _run(transfers, bw=1e9, lat=1e-3):
    env = simpy.Environment()
    link = SimLink(env, "l", bw, lat)
    done = {}

    def go(name, start, nbytes):
        yield env.timeout(start)
        t0 = env.now
        yield link.transfer(nbytes)
        done[name] = env.now - t0

    for name, start, nbytes in transfers:
        env.process(go(name, start, nbytes))
    env.run()
    return done, link


def test_single_transfer_takes_bytes_over_bandwidth_plus_latency():
    done, link = _run([("a", 0.0, 5e8)])
    assert done["a"] == pytest.approx(0.5 + 1e-3)
    assert link.busy_s == pytest.approx(0.5)


def test_two_concurrent_transfers_share_the_bandwidth():
    done, _ = _run([("a", 0.0, 5e8), ("b", 0.0, 5e8)])
    assert done["a"] == pytest.approx(1.0 + 1e-3) and done["b"] == pytest.approx(1.0 + 1e-3)


def test_share_is_recomputed_when_a_transfer_ends():
    # b (small) shares for 0.2 s, then a runs alone: a needs 0.5 + 0.1 s
    done, _ = _run([("a", 0.0, 5e8), ("b", 0.0, 1e8)], lat=0.0)
    assert done["b"] == pytest.approx(0.2)
    assert done["a"] == pytest.approx(0.6)


def test_bad_link_parameters():
    env = simpy.Environment()
    with pytest.raises(ValueError, match="bandwidth"):
        SimLink(env, "x", 0, 0)
    with pytest.raises(ValueError, match="latency"):
        SimLink(env, "x", 1, -1)


def test_many_overlapping_transfers_all_finish_despite_float_residue():
    import random

    rng = random.Random(3)
    env = simpy.Environment(initial_time=4.3)
    link = SimLink(env, "kv", 50e9, 2e-6)
    done = []

    def go(start, nbytes):
        yield env.timeout(start)
        yield link.transfer(nbytes)
        done.append(env.now)

    for _ in range(300):
        env.process(go(rng.random() * 0.01, rng.choice([1.0, 3.7e5, 1.31e7, 9.99e8 / 7])))
    env.run(until=100.0)
    assert len(done) == 300 and link.num_active == 0
