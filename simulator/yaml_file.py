"""Read a YAML (or JSON) file that must hold a mapping, with one wording of its errors for
every reader (scenarios, sweeps, trace specs): the file, what it should be, and YAML's own
line and column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_yaml_mapping(path: str | Path, what: str) -> dict[str, Any]:
    """The mapping `path` holds (an empty file reads as {}). FileNotFoundError naming `what`
    (e.g. "scenario") and the path; ValueError naming the file for bad YAML or a non-mapping."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start}); "
                         f"a {what} is YAML or JSON text") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a {what} must be a YAML mapping, got {type(data).__name__}")
    return data
