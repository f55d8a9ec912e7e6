"""Reading the JSON files `kvpd sweep` and `kvpd capacity` write, for reports: a file
that is not JSON, or lacks a key the report reads, is refused naming the file and the
key path, before anything is rendered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# What a report reads: {key: None (present) | {nested spec} | [spec of each item]}; a key
# ending in "?" may be absent (its spec applies when it is there).
SWEEP_META = {"name": None, "base": None, "mode": None, "num_points": None,
              "axes": [{"name": None}]}
EVALUATION = {"rate": None, "variant": None, "ok": None, "reasons": None, "metrics": {}}
CAPACITY = {"name": None, "scenario": None, "slo_text": None, "unit": None,
            "num_simulations": None, "wall_s": None, "best": None,
            "slo": {"targets": [{"column": None, "limit_s": None}]},
            "candidates": [{"name": None, "status": None, "evaluations?": [EVALUATION]}]}


def _check(data: Any, spec: dict, file: Path, where: str, writer: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{file}: {where or 'the file'} must be a JSON object, got "
                         f"{type(data).__name__}; is it a file written by {writer}?")
    for name, sub in spec.items():
        key = name.removesuffix("?")
        path = f"{where}.{key}" if where else key
        if key not in data:
            if name.endswith("?"):
                continue
            raise ValueError(f"{file}: no key {path!r}; is it a file written by {writer}?")
        if isinstance(sub, list):
            items = data[key]
            if not isinstance(items, list):
                raise ValueError(f"{file}: {path} must be a list, got {type(items).__name__}")
            for i, item in enumerate(items):
                _check(item, sub[0], file, f"{path}[{i}]", writer)
        elif isinstance(sub, dict):
            _check(data[key], sub, file, path, writer)


def read_result_json(file: Path, spec: dict, writer: str) -> dict[str, Any]:
    """The JSON object in `file`, checked against `spec` (see CAPACITY, SWEEP_META);
    ValueError naming the file and key otherwise. `writer`: the command that writes it."""
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}: not JSON ({exc}); is it a file written by {writer}?") \
            from None
    except UnicodeDecodeError:
        raise ValueError(f"{file}: not a text file; is it a file written by {writer}?") from None
    _check(data, spec, file, "", writer)
    return data
