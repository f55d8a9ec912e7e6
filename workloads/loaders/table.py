"""Parsed columns of a trace file, with the line number of every kept row.

`ParsedTable` is what the CSV and JSONL readers return and what the format
modules filter (each filter records its drops in the `LoadReport`).
`RowCollector` is the row-by-row (error) path: it parses each cell, keeps good
rows and either raises a `TraceError` for the first bad one or, with
`skip_invalid`, drops bad rows and reports how many and where.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workloads.errors import FIRST_LINES_KEPT, LoadReport, TraceError
from workloads.loaders.fields import PARSERS, BadValue, Field
from workloads.ragged import Ragged


@dataclass
class Categorical:
    """A text column as int32 codes into `categories` (memory-lean for 1M rows)."""

    codes: np.ndarray
    categories: list[str]

    def isin(self, allowed: set[str]) -> np.ndarray:
        """Boolean mask of rows whose text is in `allowed`."""
        ok = np.array([c in allowed for c in self.categories], dtype=bool)
        return ok[self.codes] if len(ok) else np.zeros(len(self.codes), dtype=bool)

    def take(self, idx: np.ndarray) -> Categorical:
        return Categorical(self.codes[idx], self.categories)


@dataclass
class ParsedTable:
    """Columns keyed by `Field.key`; `lines[i]` is the 1-based file line of row `i`."""

    columns: dict[str, Any]
    lines: np.ndarray
    report: LoadReport
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.lines)

    def drop(self, mask: np.ndarray, reason: str) -> None:
        """Remove the rows where `mask` is True, recording them under `reason`."""
        mask = np.asarray(mask, dtype=bool)
        count = int(mask.sum())
        if not count:
            return
        self.report.drop(reason, count, self.lines[np.flatnonzero(mask)[:FIRST_LINES_KEPT]])
        self.take(np.flatnonzero(~mask))

    def take(self, idx: np.ndarray) -> None:
        """Keep rows `idx` (in that order), in place."""
        self.lines = self.lines[idx]
        for key, col in self.columns.items():
            self.columns[key] = (
                col.take(idx) if isinstance(col, (Ragged, Categorical)) else col[idx]
            )


_TYPECODES = {"datetime": "q", "count": "q", "int": "q", "number": "d"}


class RowCollector:
    """Accumulates parsed rows (compactly, in `array`s) and bad-row records."""

    def __init__(self, file: str, fmt: str, fields: list[Field]) -> None:
        self.file, self.fmt, self.fields = file, fmt, fields
        self.lines = array("q")
        self.rows_read = 0
        self._store: dict[str, Any] = {}
        for f in fields:
            if f.kind == "ids":
                self._store[f.key] = (array("q"), array("q"))  # flat values, row lengths
            elif f.kind == "str":
                self._store[f.key] = ({}, array("i"))  # category -> code, codes
            else:
                self._store[f.key] = array(_TYPECODES[f.kind])
        self._bad: dict[str, int] = {}
        self._bad_lines: dict[str, list[int]] = {}
        self._first_error: tuple[int, str | None, str, Any] | None = None
        self._bad_line_list: list[int] = []

    def bad(self, line: int, column: str | None, expected: str, got: Any = None) -> None:
        """Record one bad row (it is not kept)."""
        reason = f"invalid {column}: expected {expected}" if column else f"expected {expected}"
        self._bad[reason] = self._bad.get(reason, 0) + 1
        lines = self._bad_lines.setdefault(reason, [])
        if len(lines) < FIRST_LINES_KEPT:
            lines.append(line)
        if len(self._bad_line_list) < FIRST_LINES_KEPT:
            self._bad_line_list.append(line)
        if self._first_error is None:
            self._first_error = (line, column, expected, got)

    def add(self, line: int, get: Callable[[Field], Any]) -> None:
        """Parse one row; `get(field)` returns the raw cell or raises KeyError if absent."""
        self.rows_read += 1
        parsed = []
        for f in self.fields:
            try:
                raw = get(f)
            except KeyError:
                self.bad(line, f.column, "the field to be present")
                return
            try:
                parsed.append(PARSERS[f.kind](raw))
            except BadValue as exc:
                self.bad(line, f.column, exc.expected, raw)
                return
        for f, value in zip(self.fields, parsed):
            store = self._store[f.key]
            if f.kind == "ids":
                store[0].extend(value)
                store[1].append(len(value))
            elif f.kind == "str":
                store[1].append(store[0].setdefault(value, len(store[0])))
            else:
                store.append(value)
        self.lines.append(line)

    def finish(self, skip_invalid: bool) -> ParsedTable:
        """The kept rows; raises TraceError for the first bad row unless `skip_invalid`."""
        n_bad = sum(self._bad.values())
        if n_bad and not skip_invalid:
            line, column, expected, got = self._first_error  # type: ignore[misc]
            at = ", ".join(map(str, self._bad_line_list))
            rows = "1 invalid row" if n_bad == 1 else f"{n_bad} invalid rows in total"
            note = f"{rows}, first at line{'s' if len(self._bad_line_list) > 1 else ''} {at}"
            raise TraceError(self.file, line, expected, field=column, got=got, note=note,
                             skippable=True)
        report = LoadReport(self.file, self.fmt, rows_read=self.rows_read, rows_kept=self.rows_read)
        for reason, count in self._bad.items():
            report.drop(reason, count, self._bad_lines[reason])
        columns: dict[str, Any] = {}
        for f in self.fields:
            store = self._store[f.key]
            if f.kind == "ids":
                values = (
                    np.frombuffer(store[0], dtype=np.int64) if store[0] else np.zeros(0, np.int64)
                )
                lengths = (
                    np.frombuffer(store[1], dtype=np.int64) if store[1] else np.zeros(0, np.int64)
                )
                columns[f.key] = Ragged.from_lengths(values.copy(), lengths)
            elif f.kind == "str":
                codes = np.array(store[1], dtype=np.int32)
                columns[f.key] = Categorical(codes, list(store[0]))
            else:
                dtype = np.float64 if f.kind == "number" else np.int64
                columns[f.key] = np.array(store, dtype=dtype)
        return ParsedTable(columns, np.array(self.lines, dtype=np.int64), report)
