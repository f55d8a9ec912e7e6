"""`load_trace`: read any supported trace file into a `Trace`.

Formats (auto-detected from the CSV header or the first JSON record, or named):
`azure`, `burstgpt`, `lengths` (needs `arrival=`), `generic_csv` (CSV) and
`mooncake`, `generic_jsonl` (JSON Lines). Each loader attaches its
`LoadReport` (rows read / kept / dropped by reason, first bad line numbers,
warnings) as `trace.load_report`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from workloads.errors import TraceError, TraceFileNotFoundError
from workloads.loaders import azure, burstgpt, generic, lengths, mooncake
from workloads.loaders.csvread import read_header
from workloads.loaders.jsonlread import first_record
from workloads.trace import Trace

LOADERS: dict[str, Callable[..., Trace]] = {
    "azure": azure.load,
    "mooncake": mooncake.load,
    "burstgpt": burstgpt.load,
    "lengths": lengths.load,
    "generic_csv": generic.load_csv,
    "generic_jsonl": generic.load_jsonl,
}
FORMATS = tuple(LOADERS)
_CSV_SIGNATURES = (
    ("azure", azure.matches, "TIMESTAMP, ContextTokens, GeneratedTokens"),
    ("burstgpt", burstgpt.matches, "Timestamp, Request tokens, Response tokens"),
    ("lengths", lengths.matches, "num_prefill_tokens, num_decode_tokens"),
    ("generic_csv", generic.matches_header, "arrival_s, prompt_len, output_len"),
)
_JSON_SIGNATURES = (
    ("mooncake", mooncake.matches, "timestamp, input_length, output_length"),
    ("generic_jsonl", generic.matches_record, "arrival_s, prompt_len, output_len"),
)


def _is_jsonl(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"{")


def detect_format(path: str | Path, *, columns: dict[str, str] | None = None) -> str:
    """Format name from the file's content; with a column mapping, the generic CSV/JSONL format."""
    path = Path(path)
    if not path.is_file():
        raise TraceFileNotFoundError(str(path))
    if _is_jsonl(path):
        if columns:
            return "generic_jsonl"
        line, first = first_record(path)
        for fmt, match, _ in _JSON_SIGNATURES:
            if match(first):
                return fmt
        wanted = "; ".join(f"{f} ({keys})" for f, _, keys in _JSON_SIGNATURES)
        raise TraceError(
            str(path),
            line,
            f"a known trace format: records with keys of {wanted}",
            got=", ".join(sorted(first)),
            note="name the format, or give a column mapping",
        )
    if columns:
        return "generic_csv"
    header = read_header(path)
    for fmt, match, _ in _CSV_SIGNATURES:
        if match(header):
            return fmt
    wanted = "; ".join(f"{f} ({cols})" for f, _, cols in _CSV_SIGNATURES)
    raise TraceError(
        str(path),
        1,
        f"a known trace format: a header with the columns of {wanted}",
        got=",".join(header),
        note="name the format, or give a column mapping",
    )


def load_trace(
    path: str | Path,
    format: str | None = None,
    *,
    skip_invalid: bool = False,
    columns: dict[str, str] | None = None,
    **format_options: Any,
) -> Trace:
    """Load the trace at `path`; the load report is `trace.load_report`.

    `format`: one of `FORMATS` or None to detect it. `skip_invalid`: drop bad rows
    (reported) instead of raising `TraceError`. `columns`: output key -> source
    column mapping (keys per format, e.g. `arrival`, `prompt_len`, `output_len`).
    `format_options`: per format, e.g. `name`, `arrival`/`seed`/`shuffle` (lengths),
    `model`/`log_type` (burstgpt), `hash_block_size`/`time_unit` (mooncake, generic),
    `rebase` (generic).
    """
    path = Path(path)
    if not path.is_file():
        raise TraceFileNotFoundError(str(path))
    if format is None:
        format = detect_format(path, columns=columns)
    if format not in LOADERS:
        raise ValueError(f"unknown trace format {format!r}; expected one of {', '.join(FORMATS)}")
    return LOADERS[format](path, skip_invalid=skip_invalid, columns=columns, **format_options)


__all__ = ["FORMATS", "LOADERS", "detect_format", "load_trace"]
