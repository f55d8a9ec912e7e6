"""Where the public traces live: `$KVPD_TRACES_DIR` if set, else `../shared/data/traces`
beside this checkout (the layout this repository is developed and tested in)."""

from __future__ import annotations

import os
from pathlib import Path

TRACES_DIR_ENV = "KVPD_TRACES_DIR"
AZURE_CONV_FILE = "azure2023_AzureLLMInferenceTrace_conv.csv"


def traces_dir() -> Path:
    """The folder holding the public traces (it may not exist: callers say so by name)."""
    env = os.environ.get(TRACES_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def azure_conv_path() -> Path:
    """The Azure LLM inference trace 2023, conversation (README beside it)."""
    return traces_dir() / AZURE_CONV_FILE
