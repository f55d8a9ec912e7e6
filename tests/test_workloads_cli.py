"""`kvpd trace info|convert|synth|plot` through kvpd.cli.main."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvpd.cli import main
from workloads import load_trace

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:16:01.0000001,879,12\n"
    "2023-11-16 18:17:01.5000000,5000,7\n"
)
MOONCAKE = (
    '{"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]}\n'
    '{"timestamp": 1500, "input_length": 600, "output_length": 4, "hash_ids": [0, 2]}\n'
)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "az.csv").write_text(AZURE)
    (tmp_path / "mc.jsonl").write_text(MOONCAKE)
    (tmp_path / "bad.csv").write_text(AZURE.replace("396", "3x6"))
    return {p.stem: p for p in tmp_path.iterdir()}


def test_info_table_and_json(files, capsys):
    assert main(["trace", "info", str(files["az"])]) == 0
    out = capsys.readouterr().out
    assert "rows               4" in out and "inter-arrival CV" in out and "prompt_len" in out
    assert main(["trace", "info", str(files["mc"]), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rows"] == 2 and data["prefix"]["block_hit_ratio"] == 0.25
    assert data["load_report"]["rows_read"] == 2
    assert data["prompt_len"]["p50"] == 800.0


def test_info_of_an_empty_trace_says_so(tmp_path, capsys):
    """(before: a table of nan rates and lengths)"""
    path = tmp_path / "empty.csv"
    path.write_text('"arrival_s","prompt_len","output_len"\n')
    assert main(["trace", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "rows               0" in out and "(no requests: nothing to summarize)" in out
    assert "nan" not in out


def test_info_bad_input_exits_nonzero_with_file_and_line(files, capsys):
    assert main(["trace", "info", str(files["bad"])]) == 2
    err = capsys.readouterr().err
    assert f"{files['bad']}:3" in err and "ContextTokens" in err and "non-negative integer" in err
    assert main(["trace", "info", str(files["bad"]), "--skip-invalid", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["rows"] == 3
    assert "dropped 1" in captured.err and "first at lines 3" in captured.err
    assert main(["trace", "info", str(files["az"].parent / "missing.csv")]) == 2
    assert "missing.csv" in capsys.readouterr().err


def test_convert_applies_transforms(files, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    rc = main(
        [
            "trace",
            "convert",
            str(files["az"]),
            "-o",
            str(out),
            "--max-model-len",
            "4096",
            "--first",
            "2",
            "--rate",
            "2.0",
        ]
    )
    assert rc == 0 and "wrote 2 requests" in capsys.readouterr().out
    t = load_trace(out)
    assert t.prompt_len.tolist() == [374, 396] and t.duration_s == pytest.approx(1.0)
    merged = tmp_path / "merged.csv"
    assert (
        main(
            [
                "trace",
                "convert",
                str(files["az"]),
                str(files["mc"]),
                "-o",
                str(merged),
                "--window",
                "0:10",
            ]
        )
        == 0
    )
    m = load_trace(merged)
    assert len(m) == 4 and m.hash_ids is None
    assert "hash_ids dropped" in capsys.readouterr().err


def test_convert_mapped_columns_and_lengths_format(tmp_path, capsys):
    src = tmp_path / "custom.csv"
    src.write_text("ts_ms,in,out\n0,5,1\n250,6,2\n")
    out = tmp_path / "c.csv"
    assert (
        main(
            [
                "trace",
                "convert",
                str(src),
                "-o",
                str(out),
                "--columns",
                "arrival=ts_ms,prompt_len=in,output_len=out",
                "--option",
                "time_unit=ms",
            ]
        )
        == 0
    )
    assert load_trace(out).arrival_s.tolist() == [0.0, 0.25]
    lengths = tmp_path / "len.csv"
    lengths.write_text("num_prefill_tokens,num_decode_tokens\n10,2\n20,3\n30,4\n")
    assert main(["trace", "info", str(lengths)]) == 2
    assert "arrival process" in capsys.readouterr().err
    assert (
        main(
            [
                "trace",
                "convert",
                str(lengths),
                "-o",
                str(out),
                "--arrival",
                "process=constant,rate=2",
            ]
        )
        == 0
    )
    assert load_trace(out).arrival_s.tolist() == [0.0, 0.5, 1.0]


def test_synth_from_flags_and_yaml_is_deterministic(tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    flags = [
        "--num-requests",
        "300",
        "--arrival",
        "process=gamma,rate=5,cv=2",
        "--prompt-len",
        "dist=lognormal,mean=200,sigma=0.5",
        "--output-len",
        "dist=fixed,value=16",
        "--shared-prefix",
        "num_prefixes=2,prefix_len=32;48,fraction=0.5",
        "--seed",
        "3",
    ]
    assert main(["trace", "synth", "-o", str(a), *flags]) == 0
    assert main(["trace", "synth", "-o", str(b), *flags]) == 0
    assert a.read_bytes() == b.read_bytes()
    t = load_trace(a)
    assert len(t) == 300 and set(t.output_len) == {16} and t.hash_block_size == 16
    spec = tmp_path / "scenario.yaml"
    spec.write_text(
        "workload:\n  synthetic:\n    num_requests: 50\n"
        "    arrival: {process: piecewise, pieces: [{duration_s: 10, rate: 1}, {duration_s: 10, rate: 4}]}\n"
        "    prompt_len: {dist: uniform, min: 1, max: 9}\n    output_len: {dist: fixed, value: 2}\n"
    )
    c = tmp_path / "c.csv"
    assert (
        main(
            [
                "trace",
                "synth",
                "--spec",
                str(spec),
                "--spec-key",
                "workload.synthetic",
                "--num-requests",
                "80",
                "-o",
                str(c),
            ]
        )
        == 0
    )
    assert len(load_trace(c)) == 80
    assert main(["trace", "synth", "--spec", str(spec), "-o", str(c)]) == 2
    assert "synthesize.workload: unknown key" in capsys.readouterr().err


def test_plot_writes_png(files, tmp_path):
    png = tmp_path / "p.png"
    assert main(["trace", "plot", str(files["mc"]), "-o", str(png), "--bucket-s", "1"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert np.frombuffer(png.read_bytes(), np.uint8).size > 10_000


@pytest.mark.parametrize("flag, value, message", [
    ("--rate", "-1", "argument --rate: expects a number > 0, got '-1'"),
    ("--time-scale", "0", "argument --time-scale: expects a number > 0"),
    ("--scale-prompt", "inf", "argument --scale-prompt: expects a number > 0"),
    ("--first", "0", "argument --first: expects a positive integer"),
])
def test_convert_refuses_bad_transform_flags_by_name(tmp_path, capsys, flag, value, message):
    src = tmp_path / "g.csv"
    src.write_text("arrival_s,prompt_len,output_len\n0,5,1\n1,6,2\n")
    with pytest.raises(SystemExit) as exc:
        main(["trace", "convert", str(src), "-o", str(tmp_path / "o.csv"), flag, value])
    assert exc.value.code == 2 and message in capsys.readouterr().err
