"""Azure LLM inference traces, 2023 and 2024 (Azure/AzurePublicDataset).

CSV with `TIMESTAMP` (wall clock, e.g. `2023-11-16 18:15:46.6805900`, an
optional zone offset is converted to UTC), `ContextTokens` (prompt tokens) and
`GeneratedTokens` (output tokens). Arrival times are rebased so the first
request arrives at 0 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.loaders.build import finish_trace
from workloads.loaders.csvread import read_csv_table
from workloads.loaders.fields import Field, column_mapping, reject_options
from workloads.trace import Trace

FORMAT = "azure"
COLUMNS = {"arrival": "TIMESTAMP", "prompt_len": "ContextTokens", "output_len": "GeneratedTokens"}


def matches(header: list[str]) -> bool:
    return all(c in header for c in COLUMNS.values())


def load(
    path: Path,
    *,
    skip_invalid: bool = False,
    columns: dict[str, str] | None = None,
    name: str | None = None,
    **options: Any,
) -> Trace:
    reject_options(FORMAT, options)
    cols = column_mapping(COLUMNS, columns, FORMAT)
    fields = [
        Field("arrival", cols["arrival"], "datetime"),
        Field("prompt_len", cols["prompt_len"], "count"),
        Field("output_len", cols["output_len"], "count"),
    ]
    table = read_csv_table(path, fields, fmt=FORMAT, skip_invalid=skip_invalid)
    return finish_trace(table, name=name or path.stem, unit="datetime")
