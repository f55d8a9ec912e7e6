"""kvpd's generic trace format, CSV or JSONL, also usable with any column mapping.

Columns / keys (defaults; remap any with `columns={key: source_column}`):
`arrival` -> `arrival_s`, `prompt_len`, `output_len`, optional `session_id`,
`hash_ids`, `prompt_token_ids` (JSON lists, or space-separated integers in
CSV) and, in CSV, `hash_block_size` (the same on every row). A JSONL file may
start with a metadata record `{"kvpd_trace": {"name": ..., "hash_block_size": ...}}`.

Options: `time_unit` of the arrival column (`s` default, `ms`, `us`, `ns`, or
`datetime` for wall-clock strings), `rebase` (shift the first arrival to 0;
default False, True for `datetime`), `hash_block_size` (overrides the file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from workloads.errors import TraceError
from workloads.loaders.build import TIME_UNITS, finish_trace
from workloads.loaders.csvread import read_csv_table
from workloads.loaders.fields import Field, column_mapping, reject_options
from workloads.loaders.jsonlread import read_jsonl_table
from workloads.loaders.table import ParsedTable
from workloads.trace import Trace

META_KEY = "kvpd_trace"
COLUMNS = {
    "arrival": "arrival_s",
    "prompt_len": "prompt_len",
    "output_len": "output_len",
    "session_id": "session_id",
    "hash_ids": "hash_ids",
    "prompt_token_ids": "prompt_token_ids",
    "hash_block_size": "hash_block_size",
}
_OPTIONS = ("time_unit", "rebase", "hash_block_size")


def matches_header(header: list[str]) -> bool:
    return all(c in header for c in ("arrival_s", "prompt_len", "output_len"))


def matches_record(first: dict[str, Any]) -> bool:
    return META_KEY in first or all(c in first for c in ("arrival_s", "prompt_len", "output_len"))


def _fields(cols: dict[str, str], time_unit: str, csv: bool) -> list[Field]:
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit: expected one of {', '.join(TIME_UNITS)}, got {time_unit!r}")
    fields = [
        Field("arrival", cols["arrival"], "datetime" if time_unit == "datetime" else "number"),
        Field("prompt_len", cols["prompt_len"], "count"),
        Field("output_len", cols["output_len"], "count"),
        Field("session_id", cols["session_id"], "int", required=False),
        Field("hash_ids", cols["hash_ids"], "ids", required=False),
        Field("prompt_token_ids", cols["prompt_token_ids"], "ids", required=False),
    ]
    if csv:
        fields.append(Field("hash_block_size", cols["hash_block_size"], "count", required=False))
    return fields


def load_csv(path: Path, **kwargs: Any) -> Trace:
    return _load(path, csv=True, **kwargs)


def load_jsonl(path: Path, **kwargs: Any) -> Trace:
    return _load(path, csv=False, **kwargs)


def _load(
    path: Path,
    *,
    csv: bool,
    skip_invalid: bool = False,
    columns: dict[str, str] | None = None,
    name: str | None = None,
    time_unit: str = "s",
    rebase: bool | None = None,
    hash_block_size: int | None = None,
    **options: Any,
) -> Trace:
    fmt = "generic_csv" if csv else "generic_jsonl"
    reject_options(fmt, options, _OPTIONS)
    cols = column_mapping(COLUMNS, columns, fmt)
    fields = _fields(cols, time_unit, csv)
    if csv:
        table = read_csv_table(path, fields, fmt=fmt, skip_invalid=skip_invalid)
    else:
        table = read_jsonl_table(
            path, fields, fmt=fmt, skip_invalid=skip_invalid, meta_key=META_KEY
        )
    block = hash_block_size or table.meta.get("hash_block_size") or _csv_block_size(table, path)
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
        raise TraceError(str(path), None, "hash_block_size to be an integer >= 1", got=block)
    table.columns.pop("hash_block_size", None)
    _check_token_counts(table, skip_invalid)
    return finish_trace(
        table,
        name=name or str(table.meta.get("name") or path.stem),
        unit=time_unit,
        rebase=(time_unit == "datetime") if rebase is None else bool(rebase),
        hash_block_size=int(block) if block else None,
    )


def _csv_block_size(table: ParsedTable, path: Path) -> int | None:
    sizes = table.columns.get("hash_block_size")
    if sizes is None or not len(sizes):
        return None
    bad = np.flatnonzero(sizes != sizes[0])
    if len(bad):
        raise TraceError(
            str(path),
            int(table.lines[bad[0]]),
            f"the same hash_block_size on every row ({sizes[0]})",
            field="hash_block_size",
            got=int(sizes[bad[0]]),
        )
    return int(sizes[0])


def _check_token_counts(table: ParsedTable, skip_invalid: bool) -> None:
    """prompt_token_ids must hold exactly prompt_len ids per row."""
    ids = table.columns.get("prompt_token_ids")
    if ids is None:
        return
    bad = ids.lengths() != table.columns["prompt_len"]
    if bad.any() and not skip_invalid:
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(
            table.report.file,
            int(table.lines[i]),
            f"prompt_len ({table.columns['prompt_len'][i]}) token ids",
            field="prompt_token_ids",
            got=f"{ids.lengths()[i]} ids",
            note=f"{int(bad.sum())} such row(s)",
            skippable=True,
        )
    table.drop(bad, "prompt_token_ids count != prompt_len")
