"""BurstGPT traces (HPMLL/BurstGPT): Azure OpenAI GPT service logs.

CSV with `Timestamp` (seconds from the start of the log), `Model` (e.g.
`ChatGPT`, `GPT-4`), `Request tokens`, `Response tokens`, `Total tokens` and
`Log Type` (`Conversation log` / `API log`). Failed requests have 0 response
tokens and are dropped with a count. Options `model` and `log_type` keep only
the named values (a string or a list of strings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.loaders.build import finish_trace
from workloads.loaders.csvread import read_csv_table
from workloads.loaders.fields import Field, column_mapping, reject_options
from workloads.loaders.table import Categorical, ParsedTable
from workloads.trace import Trace

FORMAT = "burstgpt"
COLUMNS = {
    "arrival": "Timestamp",
    "prompt_len": "Request tokens",
    "output_len": "Response tokens",
    "model": "Model",
    "log_type": "Log Type",
}


def matches(header: list[str]) -> bool:
    return all(c in header for c in ("Timestamp", "Request tokens", "Response tokens"))


def load(
    path: Path,
    *,
    skip_invalid: bool = False,
    columns: dict[str, str] | None = None,
    name: str | None = None,
    model: str | list[str] | None = None,
    log_type: str | list[str] | None = None,
    **options: Any,
) -> Trace:
    reject_options(FORMAT, options, ("model", "log_type"))
    cols = column_mapping(COLUMNS, columns, FORMAT)
    fields = [
        Field("arrival", cols["arrival"], "number"),
        Field("prompt_len", cols["prompt_len"], "count"),
        Field("output_len", cols["output_len"], "count"),
        Field("model", cols["model"], "str", required=model is not None),
        Field("log_type", cols["log_type"], "str", required=log_type is not None),
    ]
    table = read_csv_table(path, fields, fmt=FORMAT, skip_invalid=skip_invalid)
    _keep_only(table, "model", cols["model"], model)
    _keep_only(table, "log_type", cols["log_type"], log_type)
    return finish_trace(
        table,
        name=name or path.stem,
        unit="s",
        zero_output_reason="failed request (0 response tokens)",
    )


def _keep_only(table: ParsedTable, key: str, column: str, wanted: str | list[str] | None) -> None:
    """Drop rows whose `key` is not among `wanted`; a value that never occurs is a ValueError."""
    if wanted is None:
        return
    allowed = {wanted} if isinstance(wanted, str) else set(wanted)
    col: Categorical = table.columns[key]
    missing = allowed - set(col.categories)
    if missing:
        raise ValueError(
            f"{table.report.file}: {column} value(s) {sorted(missing)} do not occur; "
            f"values present: {sorted(col.categories)}"
        )
    table.drop(~col.isin(allowed), f"{column} not in {sorted(allowed)}")
