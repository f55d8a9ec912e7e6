"""Reading the profile's fresh-shape check (written by realexec/fidelity/profile/fresh_shapes.py): how much
slower steps of never-run shapes were than steps of repeated ones."""

from __future__ import annotations

from typing import Any

WARN_RATIO = 1.25  # fresh / repeated above this: the profile understates served steps


def describe_fresh_shapes(check: dict[str, Any]) -> str:
    """One line for a progress log or a calibration report."""
    if check.get("ratio") is None:
        return "fresh-shape check: no points"
    pts = ", ".join(f"{p['kind']} {p['batch']}x{p['tokens']} {p['ratio']:.2f}"
                    for p in check["points"] if p.get("ratio") is not None)
    line = f"fresh-shape check: never-run shapes / repeated shapes {check['ratio']:.2f} ({pts})"
    if check["ratio"] > WARN_RATIO:
        line += (f". WARNING: above {WARN_RATIO}, a per-shape set-up cost that this profile "
                 "does not time; served steps (a new shape nearly every step) will pay it")
    return line
