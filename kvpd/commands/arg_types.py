"""argparse types shared by the commands: whole numbers with a floor, finite positive numbers.
A bad value is refused by argparse naming the flag, before any work is done."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def int_at_least(low: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number >= `low` (`what` names the kind in the error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or str(value) != text.strip():
            raise argparse.ArgumentTypeError(f"expects {what}, got {text!r}")
        return value
    return parse


positive_int = int_at_least(1, "a positive integer")
non_negative_int = int_at_least(0, "an integer >= 0")


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expects a number > 0, got {text!r}")
    return value
