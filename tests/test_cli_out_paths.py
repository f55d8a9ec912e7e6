"""Every command that writes refuses an output path it cannot write (a file where its folder
must go) before any work, naming the option (kvpd/commands/out_paths.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpd.cli import main

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
SYNTH = ["--num-requests", "3", "--arrival", "process=poisson,rate=1",
         "--prompt-len", "dist=fixed,value=5", "--output-len", "dist=fixed,value=5"]


def _sweep(tmp_path: Path) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(f"base: {QUICKSTART}\naxes:\n  scheduler.max_num_seqs: [32, 64]\n")
    return path


@pytest.mark.parametrize(("argv", "option"), [
    (lambda d: ["sweep", str(_sweep(d)), "--out", "{file}"], "--out"),
    (lambda d: ["sweep", str(_sweep(d)), "--out", "{file}/sub"], "--out"),
    (lambda d: ["replay", str(d / "t.csv"), "--target", "inproc", "--out", "{file}"], "--out"),
    (lambda d: ["generate", "--model", "tiny-llama", "--random-prompts", "1", "--out", "{file}"],
     "--out"),
    (lambda d: ["trace", "synth", "-o", "{file}/t.csv", *SYNTH], "--output"),
    (lambda d: ["trace", "convert", str(d / "t.csv"), "-o", "{file}/u.csv"], "--output"),
    (lambda d: ["trace", "plot", str(d / "t.csv"), "-o", "{file}/p.png"], "--output"),
    (lambda d: ["report", str(d), "--out", "{file}/r.html"], "--out"),
])
def test_an_output_path_under_a_file_is_refused_before_any_work(tmp_path, capsys, argv, option):
    """(before: sweep, replay and generate raised FileExistsError / NotADirectoryError
    tracebacks after their work; trace synth, convert and plot after loading)"""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file")
    assert main(["trace", "synth", "-o", str(tmp_path / "t.csv"), *SYNTH]) == 0
    capsys.readouterr()
    args = [a.replace("{file}", str(blocker)) for a in argv(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"error: {option} {blocker}" in err
    assert "exists and is not a folder" in err or "is a file, so no folder can be made" in err
    assert "Traceback" not in err
