"""A memory-lean ragged array: one flat values array plus int64 row offsets.

Row `i` is `values[offsets[i]:offsets[i + 1]]`. Used for per-request prefix
block hashes and prompt token ids, so a 1M-row trace costs 8 bytes per value
plus 8 bytes per row instead of a Python list per request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


class Ragged:
    """Immutable-by-convention ragged array of integers (`values`, `offsets`)."""

    __slots__ = ("values", "offsets")

    def __init__(self, values: np.ndarray, offsets: np.ndarray) -> None:
        values = np.asarray(values)
        offsets = np.asarray(offsets, dtype=np.int64)
        if values.ndim != 1 or offsets.ndim != 1 or len(offsets) == 0:
            raise ValueError("Ragged: values and offsets must be 1-D, offsets non-empty")
        if offsets[0] != 0 or offsets[-1] != len(values) or np.any(np.diff(offsets) < 0):
            raise ValueError(
                "Ragged: offsets must start at 0, be non-decreasing and end at len(values)"
            )
        if not np.issubdtype(values.dtype, np.integer):
            raise ValueError(f"Ragged: values must be integers, got dtype {values.dtype}")
        self.values = values
        self.offsets = offsets

    @classmethod
    def from_lists(cls, rows: Iterable[Sequence[int]], dtype: type = np.int64) -> Ragged:
        """Build from Python sequences of ints (one per row)."""
        rows = list(rows)
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = [v for r in rows for v in r]
        return cls(np.asarray(flat, dtype=dtype).reshape(-1), offsets)

    @classmethod
    def from_lengths(cls, values: np.ndarray, lengths: np.ndarray) -> Ragged:
        """Build from a flat values array and per-row lengths."""
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(np.asarray(lengths, dtype=np.int64), out=offsets[1:])
        return cls(values, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        """Per-row lengths (int64)."""
        return np.diff(self.offsets)

    def row(self, i: int) -> np.ndarray:
        """Row `i` as a numpy view."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"Ragged row {i} out of range for {n} rows")
        i %= n
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def row_list(self, i: int) -> list[int]:
        """Row `i` as a list of Python ints."""
        return self.row(i).tolist()

    def take(self, idx: np.ndarray) -> Ragged:
        """Rows `idx` (int indices, any order, repeats allowed) as a new Ragged."""
        idx = np.asarray(idx, dtype=np.int64)
        starts = self.offsets[idx]
        lengths = self.offsets[idx + 1] - starts
        return Ragged(self.values[_gather_positions(starts, lengths)], _offsets(lengths))

    def truncate(self, max_lengths: np.ndarray) -> Ragged:
        """Keep at most `max_lengths[i]` leading values of each row."""
        lengths = np.minimum(self.lengths(), np.maximum(np.asarray(max_lengths, np.int64), 0))
        if np.array_equal(lengths, self.lengths()):
            return self
        return Ragged(self.values[_gather_positions(self.offsets[:-1], lengths)], _offsets(lengths))

    @staticmethod
    def concat(parts: Sequence[Ragged]) -> Ragged:
        """Rows of all `parts`, in order."""
        if not parts:
            return Ragged(np.zeros(0, np.int64), np.zeros(1, np.int64))
        values = np.concatenate([p.values for p in parts])
        lengths = np.concatenate([p.lengths() for p in parts])
        return Ragged(values, _offsets(lengths))

    def equals(self, other: object) -> bool:
        return (
            isinstance(other, Ragged)
            and np.array_equal(self.offsets, other.offsets)
            and np.array_equal(self.values, other.values)
        )

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.offsets.nbytes)

    def __repr__(self) -> str:
        return f"Ragged(rows={len(self)}, values={len(self.values)}, dtype={self.values.dtype})"


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _gather_positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Flat positions `starts[i] + 0..lengths[i]-1`, concatenated over rows."""
    total = int(lengths.sum())
    new_starts = np.cumsum(lengths) - lengths
    return np.repeat(starts - new_starts, lengths) + np.arange(total, dtype=np.int64)
