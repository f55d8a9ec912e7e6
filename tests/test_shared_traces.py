"""Where kvpd looks for the public traces: $KVPD_TRACES_DIR, else ../shared beside the checkout."""

from __future__ import annotations

from pathlib import Path

from workloads.shared_traces import AZURE_CONV_FILE, TRACES_DIR_ENV, azure_conv_path, traces_dir

CHECKOUT = Path(__file__).resolve().parents[1]


def test_default_is_shared_beside_the_checkout(monkeypatch):
    monkeypatch.delenv(TRACES_DIR_ENV, raising=False)
    assert traces_dir() == CHECKOUT.parent / "shared" / "data" / "traces"
    assert azure_conv_path() == traces_dir() / AZURE_CONV_FILE


def test_environment_variable_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv(TRACES_DIR_ENV, str(tmp_path))
    assert traces_dir() == tmp_path
    assert azure_conv_path() == tmp_path / AZURE_CONV_FILE


def test_defaults_follow_the_variable_set_after_import(monkeypatch, tmp_path):
    """The ladder looks the trace up when it runs, not at import."""
    import argparse

    from realexec.fidelity import ladder

    monkeypatch.setenv(TRACES_DIR_ENV, str(tmp_path))
    p = argparse.ArgumentParser()
    ladder.add_arguments(p)
    assert p.parse_args([]).trace == tmp_path / AZURE_CONV_FILE
