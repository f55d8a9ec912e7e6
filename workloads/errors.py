"""Errors, warnings and the load report shared by every loader.

A loader either raises `TraceError` (file, line and what was expected) or, with
`skip_invalid=True`, drops the bad rows and records them in a `LoadReport`
(attached to the returned trace as `trace.load_report`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# How many line numbers to keep per drop reason (the rest are only counted).
FIRST_LINES_KEPT = 5


class TraceError(ValueError):
    """Bad trace input: names the file, the 1-based line (None: whole file) and what was expected."""

    def __init__(
        self,
        file: str,
        line: int | None,
        expected: str,
        *,
        field: str | None = None,
        got: Any = None,
        note: str | None = None,
        skippable: bool = False,
    ) -> None:
        self.file = str(file)
        self.line = line
        self.expected = expected
        self.field = field
        self.got = got
        self.note = note
        # True when the loader's `skip_invalid` option would drop the bad rows; each front end
        # names its own way to set it (`hinted`).
        self.skippable = skippable
        super().__init__(self.hinted("skip_invalid=True drops them"))

    def hinted(self, skip_hint: str) -> str:
        """The message, with `skip_hint` (how the caller's interface sets skip_invalid) when the
        bad rows are skippable."""
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        what = f"{self.field}: " if self.field else ""
        msg = f"{where}: {what}expected {self.expected}"
        if self.got is not None:
            shown = self.got if len(repr(self.got)) <= 80 else repr(self.got)[:77] + "..."
            msg += f", got {shown!r}"
        parts = [x for x in (self.note, skip_hint if self.skippable else None) if x]
        if parts:
            msg += f" ({'; '.join(parts)})"
        return msg


class TraceFileNotFoundError(TraceError, FileNotFoundError):
    """The trace file does not exist (both a `TraceError` and a `FileNotFoundError`)."""

    def __init__(self, file: str) -> None:
        TraceError.__init__(self, file, None, "an existing trace file")


class TraceWarning(UserWarning):
    """Something was fixed up while loading (e.g. rows out of order were sorted)."""


@dataclass
class LoadReport:
    """What a loader (or a row-dropping transform) did with the rows it read.

    Invariant: `rows_read == rows_kept + sum(dropped.values())`. Line numbers are
    1-based and count the header (the first data row of a CSV is line 2).
    """

    file: str
    format: str
    rows_read: int = 0
    rows_kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    first_lines: dict[str, list[int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def drop(self, reason: str, count: int, lines: Any = ()) -> None:
        """Record `count` rows dropped for `reason`; `lines` are their line numbers (if known)."""
        if count <= 0:
            return
        self.dropped[reason] = self.dropped.get(reason, 0) + int(count)
        kept = self.first_lines.setdefault(reason, [])
        for line in list(lines)[: max(0, FIRST_LINES_KEPT - len(kept))]:
            kept.append(int(line))
        self.rows_kept -= int(count)

    @property
    def rows_dropped(self) -> int:
        return sum(self.dropped.values())

    def copy(self) -> LoadReport:
        return LoadReport(
            self.file,
            self.format,
            self.rows_read,
            self.rows_kept,
            dict(self.dropped),
            {k: list(v) for k, v in self.first_lines.items()},
            list(self.warnings),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "format": self.format,
            "rows_read": self.rows_read,
            "rows_kept": self.rows_kept,
            "rows_dropped": self.rows_dropped,
            "dropped": dict(self.dropped),
            "first_lines": {k: list(v) for k, v in self.first_lines.items()},
            "warnings": list(self.warnings),
        }

    def summary(self) -> str:
        """Human-readable lines: rows read/kept, each drop reason with its first line numbers, warnings."""
        out = [
            f"{self.file} ({self.format}): read {self.rows_read} rows, kept {self.rows_kept}, "
            f"dropped {self.rows_dropped}"
        ]
        for reason, count in self.dropped.items():
            lines = self.first_lines.get(reason)
            at = f" (first at lines {', '.join(map(str, lines))})" if lines else ""
            out.append(f"  dropped {count}: {reason}{at}")
        out.extend(f"  warning: {w}" for w in self.warnings)
        return "\n".join(out)
