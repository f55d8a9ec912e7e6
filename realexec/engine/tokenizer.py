"""The HF tokenizer of a model directory, for text prompts and output text (`LLM`, the
server), and the incremental `Detokenizer` that finds stop strings."""

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


def chat_token_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """A conversation as prompt token ids: the tokenizer's chat template with the assistant's
    turn opened, or a plain `<|role|>\\ncontent\\n` template when it has none."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        # transformers 5 returns a BatchEncoding (a mapping, not a dict); 4.x a list
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"
    return list(tokenizer.encode(text, add_special_tokens=False))


class Detokenizer:
    """Incremental text of a growing token list; with `stop_strings`, where to cut."""

    def __init__(self, tokenizer: Any, stop_strings: list[str],
                 seen: list[int] | None = None) -> None:
        """`seen`: tokens already out whose text is not searched for stop strings."""
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.ids: list[int] = list(seen or [])
        self.text = tokenizer.decode(self.ids, skip_special_tokens=True) if self.ids else ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that cut the text

    def add(self, ids: list[int]) -> str:
        """The new text for `ids` (empty without a tokenizer); sets `stopped` at a stop string."""
        if self.tokenizer is None or self.stopped:
            return ""
        self.ids.extend(ids)
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if full.endswith("\ufffd"):  # an unfinished multi-byte character: wait for more
            return ""
        for s in self.stop_strings:
            at = full.find(s, max(0, len(self.text) - len(s) + 1))  # ends in the new text
            if at >= 0:
                full, self.stopped, self.matched = full[:at], True, s
                break
        new = full[len(self.text):]
        self.text = full
        return new
