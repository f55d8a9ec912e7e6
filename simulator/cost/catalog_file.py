"""Reading the catalogs shipped in `simulator/catalog/` (hardware, links, kernels, models)."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

# libyaml's parser when PyYAML was built with it (~8x faster on these files; same result)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_catalog(filename: str) -> Any:
    """The parsed contents of `simulator/catalog/<filename>` (safe YAML)."""
    text = resources.files("simulator").joinpath("catalog", filename).read_text()
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 (a safe loader)
