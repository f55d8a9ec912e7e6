"""Shared pytest fixtures and helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO_ROOT.parent / "shared" / "data" / "traces"


@pytest.fixture
def traces_dir() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"shared traces not found at {SHARED_TRACES}")
    return SHARED_TRACES


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A tiny local tokenizer for the HTTP server tests (no hub download)."""
    from realexec.engine.tokenizer import load_tokenizer
    from tests.serving_helpers import save_tiny_tokenizer

    d = tmp_path_factory.mktemp("tok")
    save_tiny_tokenizer(str(d))
    return load_tokenizer(d)
