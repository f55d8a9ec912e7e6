"""Trace and Ragged invariants, and the vectorised prefix-reuse statistic."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads import Ragged, Trace
from workloads.stats import prefix_reuse

rows_strategy = st.lists(st.lists(st.integers(0, 30), max_size=6), max_size=12)


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, data=st.data())
def test_ragged_take_truncate_concat_match_lists(rows, data):
    r = Ragged.from_lists(rows)
    assert len(r) == len(rows) and [r.row_list(i) for i in range(len(rows))] == rows
    if rows:
        idx = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=15))
        taken = r.take(np.array(idx, dtype=np.int64))
        assert [taken.row_list(i) for i in range(len(idx))] == [rows[i] for i in idx]
    caps = data.draw(st.lists(st.integers(0, 7), min_size=len(rows), max_size=len(rows)))
    cut = r.truncate(np.array(caps, dtype=np.int64))
    assert [cut.row_list(i) for i in range(len(rows))] == [row[:c] for row, c in zip(rows, caps)]
    both = Ragged.concat([r, cut])
    assert [both.row_list(i) for i in range(2 * len(rows))] == rows + [
        row[:c] for row, c in zip(rows, caps)
    ]


def test_ragged_rejects_bad_offsets():
    with pytest.raises(ValueError, match="offsets"):
        Ragged(np.arange(3), np.array([0, 2, 1, 3]))
    with pytest.raises(ValueError, match="offsets"):
        Ragged(np.arange(3), np.array([0, 2]))


def _brute_reuse(rows: list[list[int]], prompt: list[int], block: int) -> dict[str, float]:
    seen: set[int] = set()
    hits = []
    for row in rows:
        run = 0
        while run < len(row) and row[run] in seen:
            run += 1
        hits.append(run)
        seen.update(row)
    total = sum(len(r) for r in rows)
    hit_tokens = sum(min(h * block, p) for h, p in zip(hits, prompt))
    return {
        "block_hit_ratio": sum(hits) / total,
        "token_hit_ratio": hit_tokens / sum(prompt),
        "requests_with_hit": sum(h > 0 for h in hits) / len(rows),
        "unique_blocks": len(seen),
        "total_blocks": total,
    }


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.lists(st.integers(0, 8), min_size=1, max_size=6), min_size=1, max_size=15))
def test_prefix_reuse_matches_brute_force(rows):
    prompt = [len(r) * 4 - 1 for r in rows]
    got = prefix_reuse(Ragged.from_lists(rows), np.array(prompt), 4)
    want = _brute_reuse(rows, prompt, 4)
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key


def test_trace_validation_and_accessors():
    t = Trace(
        [0.0, 1.0, 1.0],
        [3, 2, 1],
        [1, 1, 1],
        name="x",
        hash_ids=Ragged.from_lists([[1, 2], [1], [9]]),
        hash_block_size=2,
        prompt_token_ids=Ragged.from_lists([[5, 6, 7], [5, 6], [8]]),
    )
    assert len(t) == 3 and t.duration_s == 1.0
    assert t.hash_ids_of(0) == [1, 2] and t.prompt_token_ids_of(1) == [5, 6]
    assert t.take(np.array([True, False, True])).prompt_len.tolist() == [3, 1]
    assert "rows=3" in repr(t)
    with pytest.raises(ValueError, match="sorted"):
        Trace([1.0, 0.0], [1, 1], [1, 1])
    with pytest.raises(ValueError, match="prompt_token_ids row 1"):
        Trace([0.0, 1.0], [1, 3], [1, 1], prompt_token_ids=Ragged.from_lists([[1], [1, 2]]))
    with pytest.raises(ValueError, match="hash_block_size"):
        Trace([0.0], [1], [1], hash_ids=Ragged.from_lists([[1]]))
    with pytest.raises(ValueError, match=">= 0"):
        Trace([-1.0], [1], [1])
    with pytest.raises(ValueError, match="integers"):
        Trace([0.0], [1.5], [1])


def test_trace_memory_is_columnar():
    n = 100_000
    t = Trace(
        np.arange(n, dtype=float),
        np.ones(n, np.int64),
        np.ones(n, np.int64),
        hash_ids=Ragged(np.arange(3 * n), np.arange(0, 3 * n + 1, 3)),
        hash_block_size=16,
    )
    # 3 columns of 8 bytes, plus 3 hashes of 8 bytes and one offset of 8 bytes per row.
    assert t.nbytes == n * (3 * 8 + 3 * 8 + 8) + 8
