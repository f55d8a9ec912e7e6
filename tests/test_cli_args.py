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
