"""The model a scenario mapping names, before the scenario is validated (engine presets read it
to pick their rules): its `model` with its `hf_overrides` laid over the config."""

from __future__ import annotations

from typing import Any

from simulator.defaults import DEFAULT_MODEL


def raw_model(data: dict[str, Any]) -> Any:
    """`get_model` of the mapping's `model` (default `DEFAULT_MODEL`) and `hf_overrides`;
    ValueError / OSError where it cannot be read (the scenario check then names it)."""
    from simulator.cost.models import get_model

    overrides = data.get("hf_overrides")
    return get_model(data.get("model", DEFAULT_MODEL),
                     overrides if isinstance(overrides, dict) else None)


def readable_model(data: dict[str, Any]) -> Any | None:
    """`raw_model(data)`, or None where it cannot be read (an engine rule then leaves the
    scenario alone: the scenario check names what is wrong)."""
    try:
        return raw_model(data)
    except (ValueError, OSError):
        return None
