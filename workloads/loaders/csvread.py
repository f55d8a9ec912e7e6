"""Read selected CSV columns: pyarrow fast path, row-by-row fallback for bad files.

The fast path (multithreaded pyarrow.csv plus vectorised checks) is taken when
every needed cell converts, no value is negative or missing and the file has
exactly one line per row, so that row `i` is line `i + 2`. Anything else goes
through `RowCollector`, which knows the line of every bad cell.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from workloads.errors import LoadReport, TraceError, TraceFileNotFoundError
from workloads.loaders.fields import Field
from workloads.loaders.table import Categorical, ParsedTable, RowCollector
from workloads.ragged import Ragged

_ARROW_TYPES = {
    "datetime": pa.string(),
    "number": pa.float64(),
    "count": pa.int64(),
    "int": pa.int64(),
    "ids": pa.string(),
    "str": pa.string(),
}
# Bytes per pyarrow read block. With 1 MiB blocks (and timestamps parsed without a string
# copy) the 1M-row load of bench/trace_load.py peaks ~125 MB over the import baseline,
# against ~165 MB with 16 MiB blocks and a string column (measured on this project's box).
# Rows of token-id lists can be far longer than 1 MiB, so files with list columns use 64 MiB.
_BLOCK_SIZE = 1 << 20
_BLOCK_SIZE_LISTS = 64 << 20


def read_header(path: Path) -> list[str]:
    """Column names of the first line of a CSV file (stripped)."""
    if not path.is_file():
        raise TraceFileNotFoundError(str(path))
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            row = next(csv.reader(fh), None)
    except UnicodeDecodeError:
        raise TraceError(str(path), 1, "UTF-8 text") from None
    except csv.Error as exc:
        raise TraceError(str(path), 1, "a CSV header line", note=str(exc)) from None
    if not row:
        raise TraceError(str(path), 1, "a CSV header line", got="(empty)")
    return [c.strip() for c in row]


def resolve_fields(path: Path, header: list[str], fields: list[Field]) -> list[Field]:
    """The fields whose column is in `header`; a missing required column is a TraceError."""
    present = []
    for f in fields:
        if f.column in header:
            present.append(f)
        elif f.required:
            raise TraceError(
                str(path), 1, f"a header with column {f.column!r}", got=",".join(header)
            )
    return present


def read_csv_table(
    path: Path, fields: list[Field], *, fmt: str, skip_invalid: bool = False
) -> ParsedTable:
    """Parse `fields` of the CSV at `path`; optional fields absent from the header are skipped."""
    header = read_header(path)
    fields = resolve_fields(path, header, fields)
    fast = _read_fast(path, header, fields)
    if fast is not None:
        columns, n = fast
        report = LoadReport(str(path), fmt, rows_read=n, rows_kept=n)
        return ParsedTable(columns, np.arange(2, n + 2, dtype=np.int64), report)
    return _read_slow(path, header, fields, fmt=fmt, skip_invalid=skip_invalid)


def count_lines(path: Path) -> int:
    """Lines in the file (a last line without a newline counts)."""
    lines, last = 0, b"\n"
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def _read_fast(
    path: Path, header: list[str], fields: list[Field]
) -> tuple[dict[str, Any], int] | None:
    raw_names = _raw_header(path)
    by_name = dict(zip(header, raw_names))
    include = list(dict.fromkeys(by_name[f.column] for f in fields))
    block = _BLOCK_SIZE_LISTS if any(f.kind == "ids" for f in fields) else _BLOCK_SIZE
    # Wall-clock columns parse straight to timestamp[ns] (no string copy); strings with a
    # zone offset fail that and are read as text, then cast with tz=UTC in convert_column.
    attempts = (
        [{"datetime": pa.timestamp("ns")}, {}]
        if any(f.kind == "datetime" for f in fields)
        else [{}]
    )
    table = None
    for override in attempts:
        types = {by_name[f.column]: override.get(f.kind, _ARROW_TYPES[f.kind]) for f in fields}
        try:
            table = pcsv.read_csv(
                path,
                read_options=pcsv.ReadOptions(block_size=block),
                convert_options=pcsv.ConvertOptions(include_columns=include, column_types=types),
            )
            break
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
            continue
    if table is None:
        return None
    if count_lines(path) != table.num_rows + 1:
        return None  # blank or multi-line rows: line numbers need the slow path
    columns: dict[str, Any] = {}
    for f in fields:
        col = table.column(by_name[f.column])
        if col.null_count:
            return None
        converted = convert_column(col, f.kind)
        if converted is None:
            return None
        columns[f.key] = converted
    return columns, table.num_rows


def _raw_header(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return next(csv.reader(fh))


def convert_column(col: pa.ChunkedArray, kind: str) -> Any:
    """Arrow column -> numpy (or Ragged/Categorical); None if any value needs the slow path."""
    if kind == "datetime":
        if pa.types.is_timestamp(col.type):
            return col.cast(pa.int64()).to_numpy()
        for typ in (pa.timestamp("ns"), pa.timestamp("ns", tz="UTC")):
            try:
                return pc.cast(col, typ).cast(pa.int64()).to_numpy()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue
        return None
    if kind == "str":
        enc = col.combine_chunks().dictionary_encode()
        return Categorical(
            enc.indices.to_numpy(zero_copy_only=False).astype(np.int32),
            [str(s) for s in enc.dictionary.to_pylist()],
        )
    if kind == "ids":
        return _convert_ids(col)
    arr = col.to_numpy()
    if kind == "number" and not np.all(np.isfinite(arr) & (arr >= 0)):
        return None
    if kind == "count" and len(arr) and arr.min() < 0:
        return None
    return arr


def _convert_ids(col: pa.ChunkedArray) -> Ragged | None:
    """Space-separated integer lists (the generic CSV writer's format) -> Ragged."""
    strings = col.combine_chunks()
    nonempty = pc.not_equal(strings, "")
    lists = pc.split_pattern(pc.if_else(nonempty, strings, pa.scalar(None, pa.string())), " ")
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy().astype(np.int64)
    try:
        values = pc.cast(pc.list_flatten(lists), pa.int64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if len(values) and values.min() < 0:
        return None
    return Ragged.from_lengths(np.ascontiguousarray(values), lengths)


def _read_slow(
    path: Path, header: list[str], fields: list[Field], *, fmt: str, skip_invalid: bool
) -> ParsedTable:
    collector = RowCollector(str(path), fmt, fields)
    index = {f.key: header.index(f.column) for f in fields}
    width = len(header)
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            next(reader)
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # blank line
                line = reader.line_num
                if len(row) != width:
                    collector.rows_read += 1
                    collector.bad(
                        line, None, f"{width} fields as in the header", len(row)
                    )
                    continue
                collector.add(line, lambda f, row=row: row[index[f.key]])
    except UnicodeDecodeError as exc:
        raise TraceError(str(path), None, "UTF-8 text", note=str(exc)) from None
    except csv.Error as exc:
        raise TraceError(str(path), reader.line_num, "well-formed CSV", note=str(exc)) from None
    return collector.finish(skip_invalid)
