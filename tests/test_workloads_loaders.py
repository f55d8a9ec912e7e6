"""Loaders on small files written by the test, including malformed variants."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from workloads import (
    LoadReport,
    TraceError,
    TraceFileNotFoundError,
    TraceWarning,
    detect_format,
    load_trace,
)
from workloads.loaders import csvread
from workloads.loaders.fields import Field, parse_datetime_ns

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROWS = (
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:16:01.0000001,879,12\n"
)
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def assert_report_balanced(report: LoadReport) -> None:
    assert report.rows_read == report.rows_kept + sum(report.dropped.values())


# --- Azure -------------------------------------------------------------------------------


def test_azure_small_file(tmp_path):
    path = write(tmp_path, "az.csv", AZURE_HEADER + AZURE_ROWS)
    assert detect_format(path) == "azure"
    t = load_trace(path)
    assert t.name == "az" and len(t) == 3
    np.testing.assert_allclose(t.arrival_s, [0.0, 4.314579, 14.3194101], rtol=0, atol=1e-9)
    assert t.prompt_len.tolist() == [374, 396, 879]
    assert t.output_len.tolist() == [44, 109, 12]
    assert t.hash_ids is None and t.hash_ids_of(0) is None and t.prompt_token_ids_of(0) is None
    r = t.load_report
    assert (r.format, r.rows_read, r.rows_kept, r.dropped) == ("azure", 3, 3, {})


def test_azure_2024_zone_offsets_and_mixed(tmp_path):
    tz = write(
        tmp_path,
        "tz.csv",
        AZURE_HEADER + "2024-05-10 00:00:00.009930+00:00,10,2\n2024-05-10 00:00:01.5+00:00,20,3\n",
    )
    np.testing.assert_allclose(load_trace(tz).arrival_s, [0.0, 1.49007], atol=1e-9)
    # Mixed naive / offset stamps take the row-by-row path; naive ones count as UTC.
    mixed = write(
        tmp_path,
        "mixed.csv",
        AZURE_HEADER + "2024-05-10 00:00:00,10,2\n2024-05-10T02:00:01+02:00,20,3\n",
    )
    np.testing.assert_allclose(load_trace(mixed).arrival_s, [0.0, 1.0])


def test_parse_datetime_ns_reference():
    assert parse_datetime_ns("1970-01-01 00:00:01.000000001") == 1_000_000_001
    assert parse_datetime_ns("2023-11-16 18:15:46.6805900") == np.datetime64(
        "2023-11-16T18:15:46.680590000", "ns"
    ).astype(np.int64)
    assert parse_datetime_ns("1970-01-01T01:00:00+01:00") == 0


@pytest.mark.parametrize(
    ("row", "field", "expected"),
    [
        ("2023-11-16 18:15:50.9951690,abc,109", "ContextTokens", "non-negative integer"),
        ("2023-11-16 18:15:50.9951690,396,-3", "GeneratedTokens", "non-negative integer"),
        ("2023-11-16 18:15:50.9951690,39.5,3", "ContextTokens", "non-negative integer"),
        ("16/11/2023 18:15,396,109", "TIMESTAMP", "timestamp"),
        ("2023-11-16 18:15:50.9951690,,109", "ContextTokens", "non-negative integer"),
    ],
)
def test_azure_bad_value_names_file_line_and_expectation(tmp_path, row, field, expected):
    path = write(
        tmp_path,
        "bad.csv",
        AZURE_HEADER + AZURE_ROWS.splitlines(True)[0] + row + "\n" + AZURE_ROWS.splitlines(True)[2],
    )
    with pytest.raises(TraceError) as info:
        load_trace(path)
    err = info.value
    assert (err.file, err.line, err.field) == (str(path), 3, field)
    assert expected in err.expected
    assert f"{path}:3" in str(err) and "skip_invalid=True drops them" in str(err)
    t = load_trace(path, skip_invalid=True)
    assert len(t) == 2 and t.prompt_len.tolist() == [374, 879]
    (reason,) = t.load_report.dropped
    assert field in reason and t.load_report.first_lines[reason] == [3]
    assert_report_balanced(t.load_report)


def test_azure_wrong_field_count_and_blank_lines_keep_line_numbers(tmp_path):
    lines = AZURE_ROWS.splitlines(True)
    path = write(
        tmp_path,
        "ragged.csv",
        AZURE_HEADER
        + lines[0]
        + "\n"
        + "2023-11-16 18:15:50,1\n"
        + lines[1]
        + "\n"
        + "2023-11-16 18:20:00,x,1\n"
        + lines[2],
    )
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.line == 4 and "3 fields" in str(info.value)
    t = load_trace(path, skip_invalid=True)
    assert len(t) == 3
    assert t.load_report.rows_read == 5 and t.load_report.rows_dropped == 2
    lines_dropped = sorted(sum(t.load_report.first_lines.values(), []))
    assert lines_dropped == [4, 7]


def test_missing_column_missing_file_unknown_format(tmp_path):
    path = write(tmp_path, "nocol.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n")
    with pytest.raises(TraceError, match="GeneratedTokens") as info:
        load_trace(path, "azure")
    assert info.value.line == 1
    with pytest.raises(TraceError, match="known trace format") as info:
        load_trace(path)
    assert info.value.line == 1 and "azure" in str(info.value)
    with pytest.raises(TraceFileNotFoundError) as info:
        load_trace(tmp_path / "nope.csv")
    assert isinstance(info.value, FileNotFoundError) and "nope.csv" in str(info.value)
    with pytest.raises(ValueError, match="unknown trace format 'bogus'"):
        load_trace(path, "bogus")
    with pytest.raises(ValueError, match="unknown option"):
        load_trace(write(tmp_path, "ok.csv", AZURE_HEADER + AZURE_ROWS), "azure", model="x")
    with pytest.raises(ValueError, match="unknown column key 'arrivl'"):
        load_trace(tmp_path / "ok.csv", columns={"arrivl": "TIMESTAMP"}, format="azure")


def test_out_of_order_rows_are_sorted_with_a_warning(tmp_path):
    rows = AZURE_ROWS.splitlines(True)
    path = write(tmp_path, "ooo.csv", AZURE_HEADER + rows[1] + rows[0] + rows[2])
    with pytest.warns(TraceWarning, match="line"):
        t = load_trace(path)
    assert t.prompt_len.tolist() == [374, 396, 879]
    assert np.all(np.diff(t.arrival_s) >= 0) and t.arrival_s[0] == 0.0
    assert "sorted" in t.load_report.warnings[0] and "lines 3" in t.load_report.warnings[0]


def test_zero_length_requests_are_dropped_and_reported(tmp_path):
    path = write(
        tmp_path,
        "zero.csv",
        AZURE_HEADER
        + "2023-11-16 18:15:46,0,5\n"
        + "2023-11-16 18:15:47,5,0\n2023-11-16 18:15:48,5,5\n",
    )
    t = load_trace(path)
    assert len(t) == 1 and t.arrival_s.tolist() == [0.0]
    assert t.load_report.dropped == {"zero prompt tokens": 1, "zero output tokens": 1}
    assert t.load_report.first_lines == {"zero prompt tokens": [2], "zero output tokens": [3]}


def test_fast_path_equals_row_by_row_path(tmp_path):
    rng = np.random.default_rng(1)
    stamps = np.sort(rng.integers(0, 10**15, 500)) + np.datetime64("2023-11-16", "ns").astype(
        np.int64
    )
    text = AZURE_HEADER + "".join(
        f"{np.datetime_as_string(np.datetime64(int(s), 'ns')).replace('T', ' ')[:27]},"
        f"{rng.integers(1, 9000)},{rng.integers(1, 900)}\n"
        for s in stamps
    )
    path = write(tmp_path, "many.csv", text)
    fields = [
        Field("arrival", "TIMESTAMP", "datetime"),
        Field("prompt_len", "ContextTokens", "count"),
        Field("output_len", "GeneratedTokens", "count"),
    ]
    header = csvread.read_header(path)
    fast = csvread.read_csv_table(path, fields, fmt="azure")
    slow = csvread._read_slow(path, header, fields, fmt="azure", skip_invalid=False)
    for key in ("arrival", "prompt_len", "output_len"):
        np.testing.assert_array_equal(fast.columns[key], slow.columns[key])
    np.testing.assert_array_equal(fast.lines, slow.lines)


# --- Mooncake ----------------------------------------------------------------------------


def mooncake_lines() -> list[str]:
    recs = [
        {"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]},
        {"timestamp": 1500, "input_length": 600, "output_length": 4, "hash_ids": [0, 2]},
        {"timestamp": 3000, "input_length": 100, "output_length": 9, "hash_ids": [3]},
    ]
    return [json.dumps(r) + "\n" for r in recs]


def test_mooncake_small_file(tmp_path):
    path = write(tmp_path, "mc.jsonl", "".join(mooncake_lines()))
    assert detect_format(path) == "mooncake"
    t = load_trace(path)
    assert t.arrival_s.tolist() == [0.0, 1.5, 3.0]
    assert t.hash_block_size == 512
    assert [t.hash_ids_of(i) for i in range(3)] == [[0, 1], [0, 2], [3]]
    assert t.load_report.warnings == []


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ('{"timestamp": 1600, "input_length": 5, "output_len', "JSON object"),
        ('{"timestamp": 1600, "input_length": 5, "hash_ids": [4]}', "present"),
        (
            '{"timestamp": "soon", "input_length": 5, "output_length": 1, "hash_ids": [4]}',
            "non-negative number",
        ),
        ('{"timestamp": 1600, "input_length": 5, "output_length": 1, "hash_ids": 4}', "list"),
        ("[1, 2, 3]", "JSON object"),
    ],
)
def test_mooncake_malformed_line(tmp_path, bad, expected):
    lines = mooncake_lines()
    path = write(tmp_path, "bad.jsonl", lines[0] + lines[1] + bad + "\n" + lines[2])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.line == 3 and expected in str(info.value) and str(path) in str(info.value)
    t = load_trace(path, skip_invalid=True)
    assert len(t) == 3 and t.load_report.rows_read == 4
    assert list(t.load_report.first_lines.values()) == [[3]]


def test_mooncake_hash_count_mismatch_is_reported(tmp_path):
    path = write(tmp_path, "mc.jsonl", "".join(mooncake_lines()))
    t = load_trace(path, hash_block_size=16)
    assert "hash_ids count" in t.load_report.warnings[0]


# --- BurstGPT ----------------------------------------------------------------------------


def burst_text() -> str:
    return BURST_HEADER + (
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,Conversation log\n"
        "201,ChatGPT,1360,104,1464,API log\n"
        "230,GPT-4,20,0,20,API log\n"
    )


def test_burstgpt_drops_failed_requests_and_filters(tmp_path):
    path = write(tmp_path, "burst.csv", burst_text())
    assert detect_format(path) == "burstgpt"
    t = load_trace(path)
    assert t.arrival_s.tolist() == [0.0, 113.0, 196.0]
    assert t.load_report.dropped == {"failed request (0 response tokens)": 2}
    assert t.load_report.first_lines["failed request (0 response tokens)"] == [3, 6]
    chat = load_trace(path, model="ChatGPT")
    assert chat.prompt_len.tolist() == [472, 1360]
    assert chat.load_report.rows_read == 5 and chat.load_report.rows_kept == 2
    assert_report_balanced(chat.load_report)
    api = load_trace(path, model=["ChatGPT", "GPT-4"], log_type="API log")
    assert api.prompt_len.tolist() == [1360]
    with pytest.raises(ValueError, match="GPT-5.*values present"):
        load_trace(path, model="GPT-5")


# --- lengths (ShareGPT-style) and generic ------------------------------------------------


def test_lengths_needs_arrival_and_is_seeded(tmp_path):
    path = write(
        tmp_path,
        "len.csv",
        "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
        + "".join(f"{10 + i},{5 + i},{15 + 2 * i},0.5\n" for i in range(50)),
    )
    assert detect_format(path) == "lengths"
    with pytest.raises(ValueError, match="arrival"):
        load_trace(path)
    arrival = {"process": "poisson", "rate": 2.0}
    a = load_trace(path, arrival=arrival, seed=3)
    assert a.prompt_len.tolist() == list(range(10, 60)) and a.arrival_s[0] == 0.0
    assert a.equals(load_trace(path, arrival=arrival, seed=3))
    assert not np.array_equal(a.arrival_s, load_trace(path, arrival=arrival, seed=4).arrival_s)
    s = load_trace(path, arrival=arrival, seed=3, shuffle=True)
    assert sorted(s.prompt_len.tolist()) == a.prompt_len.tolist()
    assert s.prompt_len.tolist() != a.prompt_len.tolist()
    assert np.array_equal(s.output_len - s.prompt_len, np.full(50, -5))


def test_generic_csv_and_jsonl_with_column_mapping(tmp_path):
    csv_path = write(tmp_path, "x.csv", "t_ms,in,out,user\n1000,5,6,7\n1500,8,9,7\n")
    t = load_trace(
        csv_path,
        columns={"arrival": "t_ms", "prompt_len": "in", "output_len": "out", "session_id": "user"},
        time_unit="ms",
        rebase=True,
    )
    assert t.arrival_s.tolist() == [0.0, 0.5] and t.session_id.tolist() == [7, 7]
    jl = write(tmp_path, "x.jsonl", '{"t": 2.0, "p": 3, "o": 4}\n{"t": 2.5, "p": 1, "o": 2}\n')
    t = load_trace(jl, columns={"arrival": "t", "prompt_len": "p", "output_len": "o"})
    assert detect_format(jl, columns={"arrival": "t"}) == "generic_jsonl"
    assert t.arrival_s.tolist() == [2.0, 2.5] and t.prompt_len.tolist() == [3, 1]
    with pytest.raises(TraceError, match="records with key 'arrival_s'"):
        load_trace(jl, "generic_jsonl")


def test_generic_token_ids_must_match_prompt_len(tmp_path):
    path = write(
        tmp_path,
        "tok.jsonl",
        '{"arrival_s": 0, "prompt_len": 2, "output_len": 1, "prompt_token_ids": [5, 6]}\n'
        '{"arrival_s": 1, "prompt_len": 3, "output_len": 1, "prompt_token_ids": [5]}\n',
    )
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.line == 2 and info.value.field == "prompt_token_ids"
    t = load_trace(path, skip_invalid=True)
    assert len(t) == 1 and t.prompt_token_ids_of(0) == [5, 6]


def test_empty_and_non_utf8_files(tmp_path):
    with pytest.raises(TraceError, match="header"):
        load_trace(write(tmp_path, "empty.csv", ""))
    path = tmp_path / "latin.csv"
    path.write_bytes(AZURE_HEADER.encode() + "2023-11-16 18:15:46,5,\xe9\n".encode("latin-1"))
    with pytest.raises(TraceError, match="UTF-8"):
        load_trace(path, "azure")


def test_no_warning_for_clean_file(tmp_path):
    path = write(tmp_path, "az.csv", AZURE_HEADER + AZURE_ROWS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_trace(path)


def test_jsonl_fast_path_equals_row_by_row_path(tmp_path, monkeypatch):
    from workloads.loaders import jsonlread

    rng = np.random.default_rng(3)
    recs = [
        {
            "timestamp": int(ts),
            "input_length": int(n),
            "output_length": int(rng.integers(0, 9)),
            "hash_ids": rng.integers(0, 50, -(-int(n) // 512)).tolist(),
        }
        for ts, n in zip(np.sort(rng.integers(0, 10**6, 300)), rng.integers(1, 5000, 300))
    ]
    path = write(tmp_path, "mc.jsonl", "".join(json.dumps(r) + "\n" for r in recs))
    fast = load_trace(path)
    monkeypatch.setattr(jsonlread, "_read_fast", lambda *a: None)
    slow = load_trace(path)
    assert fast.equals(slow) and fast.load_report.to_dict() == slow.load_report.to_dict()
    assert fast.load_report.dropped  # some zero-output rows, reported with their lines
    zero_lines = [i + 1 for i, r in enumerate(recs) if r["output_length"] == 0][:5]
    assert fast.load_report.first_lines["zero output tokens"] == zero_lines


def test_generic_jsonl_meta_line_keeps_line_numbers(tmp_path):
    path = write(
        tmp_path,
        "g.jsonl",
        '{"kvpd_trace": {"name": "n", "hash_block_size": null}}\n'
        '{"arrival_s": 0, "prompt_len": 2, "output_len": 1}\n'
        '{"arrival_s": 1, "prompt_len": 3, "output_len": 0}\n',
    )
    t = load_trace(path)
    assert t.name == "n" and len(t) == 1
    assert t.load_report.first_lines == {"zero output tokens": [3]}
