"""Read selected keys of a JSON Lines file (one JSON object per line).

Fast path: pyarrow.json with an explicit schema, taken when every record
converts, no value is missing or negative and there are no blank lines (so
record `i` is line `i + 1`). Otherwise every line is parsed with `json.loads`,
so each bad line (truncated JSON, a missing key, a wrong value) is reported
with its line number. An optional
first-line metadata record (`{meta_key: {...}}`) is returned as `table.meta`.
Optional fields are taken if the first data record has them; then every
record must have them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from workloads.errors import LoadReport, TraceError, TraceFileNotFoundError
from workloads.loaders.csvread import convert_column, count_lines
from workloads.loaders.fields import Field
from workloads.loaders.table import ParsedTable, RowCollector
from workloads.ragged import Ragged

_ARROW_TYPES = {
    "datetime": pa.string(),
    "number": pa.float64(),
    "count": pa.int64(),
    "int": pa.int64(),
    "ids": pa.list_(pa.int64()),
    "str": pa.string(),
}
# Bytes per pyarrow JSON block; must hold the longest record (token-id lists can be long).
_BLOCK_SIZE = 64 << 20


def first_record(path: Path) -> tuple[int, dict[str, Any]]:
    """(line number, object) of the first non-blank line; TraceError if it is not a JSON object."""
    if not path.is_file():
        raise TraceFileNotFoundError(str(path))
    with open(path, encoding="utf-8") as fh:
        for line_no, text in enumerate(fh, start=1):
            if text.strip():
                return line_no, _decode(path, line_no, text)
    raise TraceError(str(path), None, "at least one JSON record", got="(empty file)")


def _decode(path: Path, line_no: int, text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            str(path), line_no, "a JSON object (is the line truncated?)", note=exc.msg
        ) from None
    if not isinstance(obj, dict):
        raise TraceError(str(path), line_no, "a JSON object", got=type(obj).__name__)
    return obj


def read_jsonl_table(
    path: Path,
    fields: list[Field],
    *,
    fmt: str,
    skip_invalid: bool = False,
    meta_key: str | None = None,
) -> ParsedTable:
    """Parse `fields` from each record of the JSONL file at `path`."""
    if not path.is_file():
        raise TraceFileNotFoundError(str(path))
    first_line, first = _next_record(path, 0)
    meta: dict[str, Any] = {}
    data_line, data_first = first_line, first
    meta_line = None
    if meta_key and first is not None and meta_key in first:
        meta_line = first_line
        if not isinstance(first[meta_key], dict):
            raise TraceError(str(path), first_line, f"{meta_key!r} to be a JSON object")
        meta = first[meta_key]
        data_line, data_first = _next_record(path, first_line)
    present = []
    for f in fields:
        if data_first is not None and f.column in data_first:
            present.append(f)
        elif f.required and data_first is None and meta_line is not None:
            present.append(f)  # kvpd's own file with no rows: an empty trace
        elif f.required:
            keys = ", ".join(sorted(data_first)) if data_first is not None else "(no records)"
            raise TraceError(str(path), data_line, f"records with key {f.column!r}", got=keys)
    fast = _read_fast(path, present, meta_line)
    if fast is not None:
        columns, n = fast
        lines = np.arange(1, n + 1, dtype=np.int64) + (1 if meta_line else 0)
        report = LoadReport(str(path), fmt, rows_read=n, rows_kept=n)
        return ParsedTable(columns, lines, report, meta)
    collector = RowCollector(str(path), fmt, present)
    try:
        with open(path, encoding="utf-8") as fh:
            for line_no, text in enumerate(fh, start=1):
                if not text.strip() or line_no == meta_line:
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError:
                    collector.rows_read += 1
                    collector.bad(line_no, None, "a JSON object (truncated or malformed line)")
                    continue
                if not isinstance(obj, dict):
                    collector.rows_read += 1
                    collector.bad(line_no, None, "a JSON object", type(obj).__name__)
                    continue
                collector.add(line_no, lambda f, obj=obj: obj[f.column])
    except UnicodeDecodeError as exc:
        raise TraceError(str(path), None, "UTF-8 text", note=str(exc)) from None
    table = collector.finish(skip_invalid)
    table.meta = meta
    return table


def _next_record(path: Path, after_line: int) -> tuple[int | None, dict[str, Any] | None]:
    """(line, object) of the first parseable JSON object after line `after_line` (None, None if none)."""
    with open(path, encoding="utf-8") as fh:
        for line_no, text in enumerate(fh, start=1):
            if line_no <= after_line or not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return line_no, obj
    return None, None


def _read_fast(
    path: Path, fields: list[Field], meta_line: int | None
) -> tuple[dict[str, Any], int] | None:
    """Columns via pyarrow.json, or None when the row-by-row path is needed."""
    if meta_line not in (None, 1):
        return None
    schema = pa.schema([(f.column, _ARROW_TYPES[f.kind]) for f in fields])
    try:
        table = pj.read_json(
            path,
            read_options=pj.ReadOptions(block_size=_BLOCK_SIZE),
            parse_options=pj.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
        return None
    if count_lines(path) != table.num_rows:
        return None  # blank lines: record i is not line i + 1
    if meta_line:
        table = table.slice(1)
    columns: dict[str, Any] = {}
    for f in fields:
        col = table.column(f.column)
        if col.null_count:
            return None
        if f.kind == "ids":
            arr = col.combine_chunks()
            if pc.list_flatten(arr).null_count:
                return None
            values = pc.list_flatten(arr).to_numpy().astype(np.int64, copy=False)
            if len(values) and values.min() < 0:
                return None
            lengths = pc.list_value_length(arr).to_numpy().astype(np.int64)
            columns[f.key] = Ragged.from_lengths(np.ascontiguousarray(values), lengths)
            continue
        converted = convert_column(col, f.kind)
        if converted is None:
            return None
        columns[f.key] = converted
    return columns, table.num_rows
