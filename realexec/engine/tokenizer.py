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
    """Incremental text of a growing token list; with `stop_strings`, where to cut.

    Each step decodes only a window: the tokens since the last text that came out plus the
    chunk before them (`prefix_offset`..end), less that chunk's own text, as vLLM's incremental
    detokenizer does. The chunk keeps a word's leading space where a tokenizer renders it from
    the token before; a step whose text ends in an unfinished multi-byte character waits for
    the next. Work per step: the window, not the whole output.

    With stop strings, `add` holds back the text's last (longest stop string - 1) characters
    until more text shows they start no stop string, or the output ends (`final`), so a
    stream never sends the start of a stop string it then cuts (vLLM's stop buffer)."""

    # tokens of `seen` kept as context for the first window (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET)
    CONTEXT_TOKENS = 5

    def __init__(self, tokenizer: Any, stop_strings: list[str],
                 seen: list[int] | None = None) -> None:
        """`seen`: tokens already out whose text is not searched for stop strings."""
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.ids: list[int] = list(seen or [])
        # `text` holds the first read_offset tokens': those of `seen` up to its last complete
        # character (an unfinished one's text comes with the next tokens), all of them if none
        # ends within CONTEXT_TOKENS (undecodable bytes)
        n = len(self.ids)
        self.read_offset = next((r for r in range(n, max(0, n - self.CONTEXT_TOKENS) - 1, -1)
                                 if not self._decode(self.ids[:r]).endswith("\ufffd")), n)
        self.text = self._decode(self.ids[:self.read_offset])
        self.prefix_offset = self._context_start(max(0, self.read_offset - self.CONTEXT_TOKENS))
        self.emitted = len(self.text)  # characters of `text` that `add` has returned
        self.hold = max((len(s) for s in stop_strings), default=1) - 1
        self.stopped = False
        self.matched: str | None = None  # the stop string that cut the text

    def _decode(self, ids: list[int]) -> str:
        if not ids or self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _context_start(self, start: int) -> int:
        """`start`, or earlier while the context `ids[start:read_offset]` decodes to no text
        (special tokens only, skipped): a window whose context renders nothing decodes its
        first new token as the text's first, and SentencePiece-style decoders drop that
        token's leading space. Steps back by doubling, so a long run costs few decodes."""
        while 0 < start < self.read_offset and not self._decode(self.ids[start:self.read_offset]):
            start = max(0, 2 * start - self.read_offset)
        return start

    def add(self, ids: list[int], final: bool = False) -> str:
        """The text to send for `ids` (empty without a tokenizer); sets `stopped` at a stop
        string. `final`: the output ends here, so nothing is held back."""
        if self.tokenizer is None or self.stopped:
            return ""
        self.ids.extend(ids)
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        now = self._decode(self.ids[self.prefix_offset:])
        if not now.endswith("\ufffd") and len(now) > len(before):  # else wait for more
            start, self.read_offset = self.read_offset, len(self.ids)
            self.prefix_offset = self._context_start(start)
            full = self.text + now[len(before):]
            for s in self.stop_strings:
                at = full.find(s, max(0, len(self.text) - len(s) + 1))  # ends in the new text
                if at >= 0:
                    full, self.stopped, self.matched = full[:at], True, s
                    break
            self.text = full
        end = len(self.text)
        if not (final or self.stopped):
            end = max(self.emitted, end - self.hold)
        out, self.emitted = self.text[self.emitted:end], end
        return out
