"""The HF tokenizer of a model directory, for text prompts and output text (`LLM`, the
server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def has_tokenizer(path: str | Path) -> bool:
    """Whether `path` is a directory with tokenizer files."""
    p = Path(path)
    return p.is_dir() and any((p / f).is_file() for f in TOKENIZER_FILES)


def load_tokenizer(path: str | Path | None) -> Any:
    """An HF tokenizer from a directory with tokenizer files, or None if there is none;
    ValueError naming the directory if its files do not load."""
    if path is None or not has_tokenizer(path):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(Path(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for bad files
        raise ValueError(f"{path}: its tokenizer files do not load ({type(exc).__name__}: "
                         f"{exc})") from None
