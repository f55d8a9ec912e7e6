"""Scenario key paths for sweeps and capacity search: check that a key exists (naming the
closest ones when not), and build a scenario from base data plus `key.path -> value`
overrides, with the same rule as `simulator.scenario.apply_overrides`."""

from __future__ import annotations

import copy
import difflib
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from simulator.scenario import Scenario, scenario_from_dict, scenario_keys
from simulator.scenario import set_path as scenario_set_path


def set_path(data: dict[str, Any], key: str, value: Any) -> None:
    """`data[a][b][c] = a copy of value` (the rule of `simulator.scenario.set_path`)."""
    scenario_set_path(data, key, copy.deepcopy(value))


def build_scenario(base: dict[str, Any], overrides: dict[str, Any], source: str,
                   base_dir: str) -> Scenario:
    data = copy.deepcopy(base)
    for key, value in overrides.items():
        set_path(data, key, value)
    return scenario_from_dict(data, source, base_dir)


@dataclass(frozen=True)
class BaseScenario:
    """A scenario file's data and where it came from (`source`, `base_dir` for relative
    paths): what sweep points and capacity candidates override. Plain data: it travels to
    worker processes. `cost_table`: $/GPU-hour by accelerator name."""

    data: dict[str, Any]
    source: str
    base_dir: str
    cost_table: dict[str, float] = field(default_factory=dict)

    def build(self, overrides: dict[str, Any]) -> Scenario:
        return build_scenario(self.data, overrides, self.source, self.base_dir)


def _union_args(ann: Any) -> tuple[Any, ...]:
    """The members of a `X | Y | None` annotation (the annotation itself otherwise)."""
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(ann) if a is not type(None))
    return (ann,)


def _open_keys() -> list[str]:
    """Scenario keys whose value may be a free-form mapping (inline hardware, options...)."""
    out = []

    def walk(model: type, prefix: str) -> None:
        for name, f in model.model_fields.items():
            path = prefix + name
            for a in _union_args(f.annotation):
                if a is dict or typing.get_origin(a) is dict:
                    out.append(path)
                elif isinstance(a, type) and hasattr(a, "model_fields"):
                    walk(a, path + ".")

    walk(Scenario, "")
    return out


def integer_key(key: str) -> bool:
    """Whether scenario key `key` takes whole numbers only (an `int` field, no float)."""
    model: Any = Scenario
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return False
        args = _union_args(fields[part].annotation)
        if i == len(parts) - 1:
            return int in args and float not in args
        model = next((a for a in args if isinstance(a, type) and hasattr(a, "model_fields")),
                     None)
    return False


def check_key(key: str, where: str) -> None:
    """Refuse a key that is not a scenario key path, naming the closest ones."""
    known = scenario_keys()
    if key in known or any(key.startswith(k + ".") for k in _open_keys()):
        return
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    if not close:
        head = key.split(".")[0]
        close = [k for k in known if k.split(".")[0] == head][:6]
    hint = f"; closest: {', '.join(close)}" if close else f"; top-level keys: {', '.join(k for k in known if '.' not in k)}"
    raise ValueError(f"{where}: {key!r} is not a scenario key{hint}")
