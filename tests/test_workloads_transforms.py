"""Trace transforms: rate rescaling, windows, first N, max_model_len, jitter, lengths, merge."""

from __future__ import annotations

import numpy as np
import pytest

from workloads import (
    Ragged,
    Trace,
    TraceWarning,
    coarse_step,
    first_n,
    jitter_arrivals,
    limit_prompt_len,
    mean_rate,
    merge_traces,
    rescale_rate,
    scale_lengths,
    scale_time,
    synthesize,
    time_window,
)


def bursty(n: int = 2000, seed: int = 4) -> Trace:
    spec = {
        "num_requests": n,
        "arrival": {"process": "gamma", "rate": 3.0, "cv": 3.0},
        "prompt_len": {"dist": "uniform", "min": 1, "max": 500},
        "output_len": {"dist": "uniform", "min": 1, "max": 50},
        "shared_prefix": {"num_prefixes": 2, "prefix_len": 64, "fraction": 0.5, "block_size": 16},
    }
    return synthesize(spec, seed)


@pytest.mark.parametrize("target", [0.5, 3.0, 47.0])
def test_rescale_rate_keeps_order_and_scales_span_exactly(target):
    t = bursty()
    r = rescale_rate(t, target)
    factor = mean_rate(t) / target
    assert mean_rate(r) == pytest.approx(target, rel=1e-12)
    assert r.duration_s == pytest.approx(t.duration_s * factor, rel=1e-12)
    np.testing.assert_allclose(r.arrival_s, t.arrival_s * factor, rtol=1e-15)
    # Same requests in the same order; gaps keep their relative shape (burstiness).
    assert np.array_equal(r.prompt_len, t.prompt_len) and r.hash_ids.equals(t.hash_ids)
    gaps_t, gaps_r = np.diff(t.arrival_s), np.diff(r.arrival_s)
    assert np.all(gaps_r >= 0)
    assert gaps_r.std() / gaps_r.mean() == pytest.approx(gaps_t.std() / gaps_t.mean(), rel=1e-9)


def test_scale_time_and_bad_factors():
    t = bursty(50)
    assert scale_time(t, 2.0).duration_s == pytest.approx(2 * t.duration_s)
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="factor"):
            scale_time(t, bad)
    with pytest.raises(ValueError, match="rate_rps"):
        rescale_rate(t, 0)


def test_time_window_and_first_n_report_drops():
    t = bursty()
    w = time_window(t, 100.0, 200.0)
    inside = (t.arrival_s >= 100) & (t.arrival_s < 200)
    assert len(w) == inside.sum() and w.arrival_s.min() >= 0 and w.arrival_s.max() < 100
    np.testing.assert_allclose(w.arrival_s, t.arrival_s[inside] - 100)
    assert w.load_report.rows_read == len(t) and w.load_report.rows_kept == len(w)
    assert w.load_report.rows_dropped == len(t) - len(w)
    kept = time_window(t, 100.0, 200.0, rebase=False)
    assert np.array_equal(kept.arrival_s, t.arrival_s[inside])
    f = first_n(t, 10)
    assert len(f) == 10 and np.array_equal(f.prompt_len, t.prompt_len[:10])
    assert f.hash_ids_of(9) == t.hash_ids_of(9)
    assert len(first_n(t, 10**6)) == len(t)


def test_limit_prompt_len_reject_and_clip():
    t = bursty()
    rej = limit_prompt_len(t, 300, mode="reject")
    assert rej.prompt_len.max() <= 300 and len(rej) == (t.prompt_len <= 300).sum()
    assert rej.load_report.dropped == {"prompt_len > max_model_len (300)": len(t) - len(rej)}
    clip = limit_prompt_len(t, 300, mode="clip")
    assert len(clip) == len(t) and np.array_equal(clip.prompt_len, np.minimum(t.prompt_len, 300))
    for i in np.flatnonzero(t.prompt_len > 300)[:20]:
        assert clip.hash_ids_of(i) == t.hash_ids_of(i)[: -(-300 // 16)]
        assert clip.prompt_token_ids_of(i) == t.prompt_token_ids_of(i)[:300]
    with pytest.raises(ValueError, match="mode"):
        limit_prompt_len(t, 300, mode="truncate")


def test_jitter_spreads_coarse_stamps_within_the_step_keeping_order():
    rng = np.random.default_rng(0)
    stamps = np.sort(rng.integers(0, 100, 500)) * 3.0  # like a trace rounded to 3 s
    t = Trace(stamps, np.arange(1, 501), np.ones(500, np.int64), name="coarse")
    assert coarse_step(t) == 3.0
    j = jitter_arrivals(t, seed=1)
    assert np.all(np.diff(j.arrival_s) >= 0)
    assert np.array_equal(j.prompt_len, t.prompt_len)  # file order kept
    assert np.all((j.arrival_s >= t.arrival_s) & (j.arrival_s < t.arrival_s + 3.0))
    assert len(np.unique(j.arrival_s)) == 500
    assert j.equals(jitter_arrivals(t, seed=1)) and not j.equals(jitter_arrivals(t, seed=2))
    with pytest.raises(ValueError, match="step_s"):
        jitter_arrivals(t, -1.0)


def test_scale_lengths():
    t = bursty(300)
    s = scale_lengths(t, prompt=0.5, output=2.0)
    assert np.array_equal(s.output_len, t.output_len * 2)
    assert np.array_equal(s.prompt_len, np.maximum(np.rint(t.prompt_len * 0.5), 1))
    assert s.prompt_token_ids_of(3) == t.prompt_token_ids_of(3)[: s.prompt_len[3]]
    with pytest.raises(ValueError, match="cannot lengthen"):
        scale_lengths(t, prompt=2.0)
    plain = t.replace(hash_ids=None, hash_block_size=None, prompt_token_ids=None)
    assert np.array_equal(scale_lengths(plain, prompt=2.0).prompt_len, t.prompt_len * 2)


def test_merge_interleaves_and_keeps_hash_spaces_apart():
    a, b = bursty(300, seed=1), bursty(200, seed=2)
    m = merge_traces([a, b])
    assert len(m) == 500 and np.all(np.diff(m.arrival_s) >= 0)
    assert sorted(m.prompt_len.tolist()) == sorted(a.prompt_len.tolist() + b.prompt_len.tolist())
    a_ids = set(a.hash_ids.values.tolist())
    shifted_b = set(m.hash_ids.values.tolist()) - a_ids
    assert len(shifted_b) == len(set(b.hash_ids.values.tolist()))
    assert min(shifted_b) > max(a_ids)
    for i in range(len(m)):
        assert len(m.hash_ids_of(i)) == -(-m.prompt_len[i] // 16)
        assert len(m.prompt_token_ids_of(i)) == m.prompt_len[i]
    plain = Trace([0.5], [3], [1], hash_ids=None)
    with pytest.warns(TraceWarning) as record:
        mixed = merge_traces([a, plain])
    assert sorted(str(w.message).split(":")[1].split()[0] for w in record) == [
        "hash_ids",
        "prompt_token_ids",
    ]
    assert mixed.hash_ids is None and len(mixed) == 301
    other = a.replace(hash_ids=Ragged.from_lists([[1]] * len(a)), hash_block_size=1024)
    with pytest.raises(ValueError, match="block sizes differ"):
        merge_traces([a.replace(prompt_token_ids=None), other.replace(prompt_token_ids=None)])
