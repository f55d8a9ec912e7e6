"""Loading a bench script as a module, for tests that check the catalog against the published
tables the script keeps."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_diagnostic(name: str) -> ModuleType:
    """`bench/diagnostics/<name>.py` as a module (bench/ is not a package; its folder goes on
    sys.path, as when the script runs, for the diagnostics that import a sibling)."""
    folder = REPO / "bench" / "diagnostics"
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    spec = importlib.util.spec_from_file_location(f"diag_{name}", folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
