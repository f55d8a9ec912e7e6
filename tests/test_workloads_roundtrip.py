"""write_trace -> load_trace gives back the same trace, in CSV and JSONL."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads import Ragged, Trace, TraceError, load_trace, synthesize, write_trace


def _trace(n: int, seed: int, *, session: bool, hashes: bool, tokens: bool) -> Trace:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, 300, n)
    return Trace(
        arrival_s=np.sort(rng.exponential(2.0, n).cumsum() * rng.uniform(0.1, 10)),
        prompt_len=prompt,
        output_len=rng.integers(1, 50, n),
        name=f"t{seed}",
        session_id=rng.integers(-5, 5, n) if session else None,
        hash_ids=Ragged.from_lists([rng.integers(0, 2**62, -(-p // 16)).tolist() for p in prompt])
        if hashes
        else None,
        hash_block_size=16 if hashes else None,
        prompt_token_ids=Ragged.from_lists([rng.integers(0, 32000, p).tolist() for p in prompt])
        if tokens
        else None,
    )


@pytest.mark.parametrize("ext", [".csv", ".jsonl"])
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 40),
    seed=st.integers(0, 10**6),
    session=st.booleans(),
    hashes=st.booleans(),
    tokens=st.booleans(),
)
def test_round_trip_any_trace(tmp_path, ext, n, seed, session, hashes, tokens):
    t = _trace(n, seed, session=session, hashes=hashes, tokens=tokens)
    path = write_trace(t, tmp_path / f"rt{ext}")
    back = load_trace(path)
    assert back.equals(t)
    assert back.load_report.format == ("generic_csv" if ext == ".csv" else "generic_jsonl")
    if ext == ".jsonl":
        assert back.name == t.name


def test_round_trip_synthetic_with_shared_prefix(tmp_path):
    spec = {
        "num_requests": 200,
        "arrival": {"process": "gamma", "rate": 3.0, "cv": 2.0},
        "prompt_len": {"dist": "uniform", "min": 1, "max": 100},
        "output_len": {"dist": "fixed", "value": 8},
        "shared_prefix": {"num_prefixes": 3, "prefix_len": [40, 64, 7], "fraction": 0.6},
    }
    t = synthesize(spec, seed=5)
    for ext in (".csv", ".jsonl"):
        assert load_trace(write_trace(t, tmp_path / f"s{ext}")).equals(t)


def test_empty_trace_round_trips(tmp_path):
    t = Trace(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), name="empty")
    for ext in (".csv", ".jsonl"):
        path = write_trace(t, tmp_path / f"e{ext}")
        assert len(load_trace(path)) == 0


def test_writer_rejects_unknown_extension_and_reader_checks_block_size(tmp_path):
    t = _trace(3, 1, session=False, hashes=True, tokens=False)
    with pytest.raises(ValueError, match="extension"):
        write_trace(t, tmp_path / "x.parquet")
    path = write_trace(t, tmp_path / "x.csv")
    lines = path.read_text().splitlines()
    lines[2] = lines[2].rsplit(",", 1)[0] + ",32"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match="hash_block_size") as info:
        load_trace(path)
    assert info.value.line == 3
