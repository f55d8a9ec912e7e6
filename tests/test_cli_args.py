"""Flags every command shares a type for (kvpd/commands/arg_types.py): argparse refuses a bad
value naming the flag, exit code 2, before any file is read or any work starts."""

from __future__ import annotations

import pytest

from kvpd.cli import main


@pytest.mark.parametrize("argv", [
    ["calibrate", "profile.csv"],
    ["profile"],
    ["trace", "synth", "-o", "t.csv"],
    ["trace", "convert", "t.csv", "-o", "u.csv"],
    ["serve"],
])
def test_a_negative_seed_is_refused_by_argparse(capsys, argv):
    """(before: `trace convert --jitter --seed -5` failed inside numpy with "expected
    non-negative integer", naming no flag; the others took it)"""
    with pytest.raises(SystemExit) as info:
        main([*argv, "--seed", "-5"])
    assert info.value.code == 2
    assert "argument --seed: expects an integer >= 0, got '-5'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["serve"], ["replay", "t.csv", "--target", "inproc"],
                                  ["generate", "--random-prompts", "1"]])
@pytest.mark.parametrize(("flag", "value", "what"), [
    ("--block-size", "0", "a positive integer"),
    ("--num-gpu-blocks", "0", "a positive integer"),
    ("--model-seed", "-1", "an integer >= 0"),
])
def test_real_engine_sizes_and_seeds_are_refused_by_argparse(capsys, argv, flag, value, what):
    """(before: --block-size 0 was a ZeroDivisionError traceback, -3 a message about KV
    room; a negative --model-seed was taken where --seed is refused)"""
    with pytest.raises(SystemExit) as info:
        main([*argv, flag, value])
    assert info.value.code == 2
    assert f"argument {flag}: expects {what}, got '{value}'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["serve"], ["replay", "t.csv", "--target", "inproc"]])
@pytest.mark.parametrize("flag", ["--num-threads", "--max-model-len"])
def test_worker_threads_and_context_must_be_positive(capsys, argv, flag):
    """(before: --num-threads 0 silently meant the default, -1 failed in each worker)"""
    with pytest.raises(SystemExit) as info:
        main([*argv, flag, "0"])
    assert info.value.code == 2
    assert f"argument {flag}: expects a positive integer, got '0'" in capsys.readouterr().err


@pytest.mark.parametrize("threads", [0, -1, True, 1.5])
def test_serve_config_refuses_what_num_threads_refuses(threads):
    """The library's `ServeConfig` (before: 0 meant the default, -1 failed in each worker)."""
    from realexec.serving.config import ServeConfig

    with pytest.raises(ValueError, match=rf"num_threads must be an integer >= 1 .*got {threads}"):
        ServeConfig(model="tiny-llama", num_threads=threads)
