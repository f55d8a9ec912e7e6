"""Turn a `ParsedTable` into a `Trace`: drop empty requests, sort, rebase time, check hashes.

Every drop is recorded in the load report with its reason and first line
numbers; rows out of order are sorted (stable) with a `TraceWarning`.
"""

from __future__ import annotations

import warnings

import numpy as np

from workloads.errors import FIRST_LINES_KEPT, TraceWarning
from workloads.loaders.table import ParsedTable
from workloads.trace import Trace

# Divisor that turns a raw time value into seconds. "datetime" values are int64 ns.
TIME_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9, "datetime": 1e9}


def drop_empty_requests(table: ParsedTable, zero_output_reason: str = "zero output tokens") -> None:
    """Drop requests with no prompt tokens or no output tokens (a server cannot serve them)."""
    table.drop(table.columns["prompt_len"] == 0, "zero prompt tokens")
    table.drop(table.columns["output_len"] == 0, zero_output_reason)


def sort_rows(table: ParsedTable, key: str = "arrival") -> None:
    """Stable-sort rows by `key`, warning (and noting in the report) if any were out of order."""
    col = table.columns[key]
    if len(col) < 2:
        return
    back = np.flatnonzero(col[1:] < col[:-1]) + 1
    if not len(back):
        return
    lines = ", ".join(str(x) for x in table.lines[back[:FIRST_LINES_KEPT]])
    msg = (
        f"{table.report.file}: {len(back)} row(s) arrive earlier than the row before them "
        f"(first at lines {lines}); sorted by arrival time"
    )
    table.report.warnings.append(msg)
    warnings.warn(msg, TraceWarning, stacklevel=4)
    table.take(np.argsort(col, kind="stable"))


def arrival_seconds(raw: np.ndarray, unit: str, *, rebase: bool) -> np.ndarray:
    """Raw times in `unit` -> float64 seconds; with `rebase` the first arrival becomes 0."""
    if unit not in TIME_UNITS:
        raise ValueError(f"time unit {unit!r} not known; expected one of {sorted(TIME_UNITS)}")
    if rebase and len(raw):
        raw = raw - raw.min()
    return raw.astype(np.float64) / TIME_UNITS[unit]


def check_hash_counts(table: ParsedTable, block_size: int | None) -> None:
    """Warn (in the report) when a row's hash count is not ceil(prompt_len / block_size)."""
    hashes = table.columns.get("hash_ids")
    if hashes is None or not block_size:
        return
    expected = -(-table.columns["prompt_len"] // block_size)
    bad = np.flatnonzero(hashes.lengths() != expected)
    if len(bad):
        lines = ", ".join(str(x) for x in table.lines[bad[:FIRST_LINES_KEPT]])
        table.report.warnings.append(
            f"{len(bad)} row(s) have a hash_ids count other than ceil(prompt_len / {block_size}) "
            f"(first at lines {lines}); is the hash block size right?"
        )


def finish_trace(
    table: ParsedTable,
    *,
    name: str,
    unit: str,
    rebase: bool = True,
    hash_block_size: int | None = None,
    zero_output_reason: str = "zero output tokens",
) -> Trace:
    """Drop empty requests, sort by arrival, convert times to seconds, and build the Trace."""
    drop_empty_requests(table, zero_output_reason)
    sort_rows(table)
    hashes = table.columns.get("hash_ids")
    if hashes is not None and not hash_block_size:
        raise ValueError(
            f"{table.report.file}: the trace has hash_ids but no hash block size; "
            "pass hash_block_size=<tokens per block>"
        )
    check_hash_counts(table, hash_block_size)
    table.report.rows_kept = len(table)
    return Trace(
        arrival_s=arrival_seconds(table.columns["arrival"], unit, rebase=rebase),
        prompt_len=table.columns["prompt_len"],
        output_len=table.columns["output_len"],
        name=name,
        session_id=table.columns.get("session_id"),
        hash_ids=hashes,
        hash_block_size=hash_block_size if hashes is not None else None,
        prompt_token_ids=table.columns.get("prompt_token_ids"),
        load_report=table.report,
    )
