"""synthesize(): arrival statistics, length distributions, shared prefixes, seeding, validation."""

from __future__ import annotations

import numpy as np
import pytest

from workloads import Trace, synthesize, trace_stats, write_trace

FIXED1 = {"dist": "fixed", "value": 1}


def spec_with(arrival: dict, n: int = 50_000, **extra) -> dict:
    return {
        "num_requests": n,
        "arrival": arrival,
        "prompt_len": FIXED1,
        "output_len": FIXED1,
        **extra,
    }


def rate_and_cv(t: Trace) -> tuple[float, float]:
    gaps = np.diff(t.arrival_s)
    return len(t) / t.duration_s, gaps.std() / gaps.mean()


# Tolerances are >= 5 standard deviations of the estimators for n = 50,000:
# sd(rate)/rate = cv / sqrt(n); sd(CV) measured over 30 seeds (0.004 Poisson, 0.06 for cv 4).
@pytest.mark.parametrize(
    ("arrival", "rate_tol", "cv", "cv_tol"),
    [
        ({"process": "poisson", "rate": 5.0}, 0.03, 1.0, 0.03),
        ({"process": "gamma", "rate": 5.0, "cv": 4.0}, 0.10, 4.0, 0.3),
        ({"process": "gamma", "rate": 20.0, "cv": 0.5}, 0.02, 0.5, 0.01),
    ],
)
def test_arrival_rate_and_cv(arrival, rate_tol, cv, cv_tol):
    t = synthesize(spec_with(arrival), seed=11)
    rate, got_cv = rate_and_cv(t)
    assert rate == pytest.approx(arrival["rate"], rel=rate_tol)
    assert got_cv == pytest.approx(cv, abs=cv_tol)
    assert t.arrival_s[0] == 0.0 and np.all(np.diff(t.arrival_s) >= 0)


def test_constant_arrivals_are_exact():
    t = synthesize(spec_with({"process": "constant", "rate": 4.0}, n=9), seed=0)
    np.testing.assert_allclose(t.arrival_s, np.arange(9) * 0.25)


def test_piecewise_rates_follow_the_schedule_and_repeat():
    arrival = {
        "process": "piecewise",
        "pieces": [
            {"duration_s": 100, "rate": 2.0},
            {"duration_s": 50, "rate": 0.0},
            {"duration_s": 100, "rate": 20.0},
        ],
    }
    t = synthesize(
        {"duration_s": 750, "arrival": arrival, "prompt_len": FIXED1, "output_len": FIXED1}, 3
    )
    assert t.arrival_s.max() < 750
    counts = np.histogram(t.arrival_s, bins=[0, 100, 150, 250, 350, 400, 500, 600, 650, 750])[0]
    expected = np.array([200, 0, 2000, 200, 0, 2000, 200, 0, 2000])
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected) + 1)


def test_duration_mode_poisson_count():
    t = synthesize(
        {
            "duration_s": 2000,
            "arrival": {"process": "poisson", "rate": 10.0},
            "prompt_len": FIXED1,
            "output_len": FIXED1,
        },
        1,
    )
    assert abs(len(t) - 20000) < 5 * np.sqrt(20000) and t.arrival_s.max() < 2000


def test_seeding_is_deterministic_and_streams_independent():
    spec = spec_with(
        {"process": "gamma", "rate": 2.0, "cv": 3.0},
        n=500,
        prompt_len={"dist": "lognormal", "mean": 300, "sigma": 1.0},
    )
    a, b = synthesize(spec, 42), synthesize(spec, 42)
    assert a.equals(b)
    assert not np.array_equal(a.arrival_s, synthesize(spec, 43).arrival_s)
    other = dict(spec, output_len={"dist": "uniform", "min": 5, "max": 50})
    c = synthesize(other, 42)
    assert np.array_equal(a.arrival_s, c.arrival_s) and np.array_equal(a.prompt_len, c.prompt_len)


def test_length_distributions():
    n = 40_000

    def lengths(dist: dict) -> np.ndarray:
        return synthesize(
            spec_with({"process": "constant", "rate": 1.0}, n=n, prompt_len=dist), 5
        ).prompt_len

    assert set(lengths({"dist": "fixed", "value": 77})) == {77}
    u = lengths({"dist": "uniform", "min": 10, "max": 20})
    assert u.min() == 10 and u.max() == 20 and u.mean() == pytest.approx(15, abs=0.1)
    ln = lengths({"dist": "lognormal", "mean": 600, "sigma": 0.8})
    # sd of the mean: 600 * sqrt(exp(0.64) - 1) / sqrt(n) = 2.8 tokens.
    assert ln.mean() == pytest.approx(600, abs=15)
    assert np.median(lengths({"dist": "lognormal", "median": 300, "sigma": 0.5})) == pytest.approx(
        300, rel=0.03
    )
    clipped = lengths({"dist": "lognormal", "mean": 600, "sigma": 2.0, "min": 50, "max": 4096})
    assert clipped.min() == 50 and clipped.max() == 4096
    z = lengths({"dist": "zipf", "s": 1.5, "min": 5, "max": 100})
    counts = np.bincount(z, minlength=101)
    assert z.min() >= 5 and z.max() <= 100
    # P(5) / P(6) = 2^1.5 = 2.83 for a bounded Zipf starting at 5.
    assert counts[5] / counts[6] == pytest.approx(2**1.5, rel=0.1)


def test_trace_resampling_keeps_pairs(tmp_path):
    src = Trace(np.arange(5.0), [10, 20, 30, 40, 50], [1, 2, 3, 4, 5], name="src")
    path = write_trace(src, tmp_path / "src.csv")
    spec = spec_with(
        {"process": "poisson", "rate": 1.0},
        n=2000,
        prompt_len={"dist": "trace", "path": str(path)},
        output_len={"dist": "trace", "path": str(path)},
    )
    t = synthesize(spec, 9)
    assert set(t.prompt_len) == {10, 20, 30, 40, 50}
    assert np.array_equal(t.prompt_len, t.output_len * 10)  # drawn as pairs
    only_out = synthesize(
        dict(
            spec,
            prompt_len=FIXED1,
            output_len={"dist": "trace", "path": str(path), "field": "prompt_len", "max": 35},
        ),
        9,
    )
    assert set(only_out.output_len) == {10, 20, 30, 35}


def test_shared_prefix_hashes_and_token_ids():
    spec = spec_with(
        {"process": "poisson", "rate": 5.0},
        n=400,
        prompt_len={"dist": "uniform", "min": 1, "max": 60},
        shared_prefix={
            "num_prefixes": 3,
            "prefix_len": [32, 40, 16],
            "fraction": 0.25,
            "block_size": 16,
            "vocab_size": 1000,
        },
    )
    t = synthesize(spec, 2)
    plain = synthesize(dict(spec, shared_prefix=None), 2)
    suffix = plain.prompt_len
    added = t.prompt_len - suffix
    assert np.count_nonzero(added) == 100  # exactly round(0.25 * 400)
    assert set(added) == {0, 32, 40, 16}
    assert t.hash_block_size == 16
    seen: dict[int, tuple[list[int], list[int]]] = {}
    for i in range(len(t)):
        hashes, tokens = t.hash_ids_of(i), t.prompt_token_ids_of(i)
        assert len(hashes) == -(-t.prompt_len[i] // 16) and len(tokens) == t.prompt_len[i]
        assert all(0 <= x < 1000 for x in tokens)
        if added[i]:
            full = added[i] // 16
            key = int(added[i])
            if key in seen:  # same prefix: same leading tokens and block hashes
                assert tokens[: added[i]] == seen[key][1] and hashes[:full] == seen[key][0]
            seen[key] = (hashes[:full], tokens[: added[i]])
        # Prefix k's full blocks get ids base_k.. (bases 0, 2, 4); every other block is fresh.
        expected_shared = {0: [], 32: [0, 1], 40: [2, 3], 16: [4]}[int(added[i])]
        assert hashes[: len(expected_shared)] == expected_shared
        assert min(hashes[len(expected_shared) :], default=5) >= 5
    unique = t.hash_ids.values[t.hash_ids.values >= 5]
    assert len(unique) == len(set(unique.tolist()))
    assert trace_stats(t)["prefix"]["block_hit_ratio"] > 0
    no_tokens = dict(spec, shared_prefix=dict(spec["shared_prefix"], emit_token_ids=False))
    u = synthesize(no_tokens, 2)
    assert u.prompt_token_ids is None and u.hash_ids.equals(t.hash_ids)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bogus": 1}, "synthesize.bogus: unknown key"),
        (
            {"arrival": {"process": "weibull", "rate": 1}},
            "arrival.process: expected one of poisson",
        ),
        ({"arrival": {"process": "gamma", "rate": 1}}, "arrival.cv: required"),
        ({"arrival": {"process": "poisson", "rate": 0}}, "arrival.rate: expected a number > 0"),
        (
            {"arrival": {"process": "poisson", "rate": 1, "cv": 2}},
            "arrival.cv: unknown key for process poisson",
        ),
        (
            {"arrival": {"process": "piecewise", "pieces": [{"duration_s": 5, "rate": 0}]}},
            "rate > 0",
        ),
        ({"prompt_len": {"dist": "lognormal", "mean": 5}}, "prompt_len.sigma: required"),
        (
            {"prompt_len": {"dist": "lognormal", "mean": 5, "median": 5, "sigma": 1}},
            "exactly one of mean and median",
        ),
        (
            {"output_len": {"dist": "uniform", "min": 10, "max": 5}},
            "output_len.max: expected an integer >= 10",
        ),
        ({"output_len": {"dist": "fixed", "value": 0}}, "output_len.value"),
        ({"num_requests": -1}, "num_requests"),
        ({"duration_s": 5}, "exactly one of num_requests"),
        (
            {"shared_prefix": {"num_prefixes": 2, "prefix_len": [1, 2, 3], "fraction": 0.5}},
            "expected 2 lengths",
        ),
        (
            {"shared_prefix": {"num_prefixes": 2, "prefix_len": 8, "fraction": 1.5}},
            "fraction: expected a number >= 0 and <= 1",
        ),
    ],
)
def test_spec_validation_names_the_key(change, message):
    spec = {**spec_with({"process": "poisson", "rate": 1.0}, n=10), **change}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        synthesize(spec, 0)


def test_seed_must_be_non_negative_int():
    with pytest.raises(ValueError, match="seed"):
        synthesize(spec_with({"process": "poisson", "rate": 1.0}, n=1), -1)
