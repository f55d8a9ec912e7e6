"""`Trace`: one request trace as columnar numpy arrays.

Row `i` is one request: it arrives at `arrival_s[i]` seconds (>= 0, sorted
ascending), has a prompt of `prompt_len[i]` tokens and asks for
`output_len[i]` output tokens. Optional columns: `session_id` (int64),
`hash_ids` (ragged prefix block hashes, one id per `hash_block_size` tokens of
the prompt, the last block possibly partial, as in the Mooncake traces) and
`prompt_token_ids` (ragged; row `i` has exactly `prompt_len[i]` ids).
`load_report` is the `LoadReport` of the loader (None for synthetic traces).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from workloads.errors import LoadReport
from workloads.ragged import Ragged


@dataclass(eq=False, repr=False)
class Trace:
    """Columnar request trace; treat as immutable (transforms return new traces)."""

    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    name: str = "trace"
    session_id: np.ndarray | None = None
    hash_ids: Ragged | None = None
    hash_block_size: int | None = None
    prompt_token_ids: Ragged | None = None
    load_report: LoadReport | None = None

    def __post_init__(self) -> None:
        self.arrival_s = np.ascontiguousarray(self.arrival_s, dtype=np.float64).reshape(-1)
        self.prompt_len = _int_column(self.prompt_len, "prompt_len")
        self.output_len = _int_column(self.output_len, "output_len")
        n = len(self.arrival_s)
        for col in ("prompt_len", "output_len"):
            if len(getattr(self, col)) != n:
                raise ValueError(f"Trace: {col} has {len(getattr(self, col))} rows, arrival_s {n}")
        if n and not np.all(np.isfinite(self.arrival_s)):
            raise ValueError("Trace: arrival_s must be finite")
        if n and self.arrival_s[0] < 0:
            raise ValueError("Trace: arrival_s must be >= 0 seconds")
        if n > 1 and np.any(self.arrival_s[1:] < self.arrival_s[:-1]):
            raise ValueError("Trace: arrival_s must be sorted ascending (use sort_by_arrival)")
        if n and (self.prompt_len.min() < 0 or self.output_len.min() < 0):
            raise ValueError("Trace: prompt_len and output_len must be >= 0 tokens")
        if self.session_id is not None:
            self.session_id = _int_column(self.session_id, "session_id")
            if len(self.session_id) != n:
                raise ValueError(f"Trace: session_id has {len(self.session_id)} rows, expected {n}")
        if self.hash_ids is not None:
            if len(self.hash_ids) != n:
                raise ValueError(f"Trace: hash_ids has {len(self.hash_ids)} rows, expected {n}")
            if not self.hash_block_size or int(self.hash_block_size) < 1:
                raise ValueError("Trace: hash_ids need hash_block_size >= 1 (tokens per block)")
            self.hash_block_size = int(self.hash_block_size)
        elif self.hash_block_size is not None:
            raise ValueError("Trace: hash_block_size given without hash_ids")
        if self.prompt_token_ids is not None:
            if len(self.prompt_token_ids) != n:
                raise ValueError(
                    f"Trace: prompt_token_ids has {len(self.prompt_token_ids)} rows, expected {n}"
                )
            bad = np.flatnonzero(self.prompt_token_ids.lengths() != self.prompt_len)
            if len(bad):
                raise ValueError(
                    f"Trace: prompt_token_ids row {bad[0]} has "
                    f"{self.prompt_token_ids.lengths()[bad[0]]} ids, prompt_len is "
                    f"{self.prompt_len[bad[0]]}"
                )

    def __len__(self) -> int:
        return len(self.arrival_s)

    def __repr__(self) -> str:
        extra = []
        if self.session_id is not None:
            extra.append("session_id")
        if self.hash_ids is not None:
            extra.append(f"hash_ids/{self.hash_block_size}")
        if self.prompt_token_ids is not None:
            extra.append("prompt_token_ids")
        more = f", {', '.join(extra)}" if extra else ""
        return f"Trace({self.name!r}, rows={len(self)}, duration_s={self.duration_s:.3f}{more})"

    @property
    def duration_s(self) -> float:
        """Seconds from the first to the last arrival (0.0 for fewer than two rows)."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    def hash_ids_of(self, i: int) -> list[int] | None:
        """Prefix block hashes of request `i` (one per `hash_block_size` tokens), or None."""
        return None if self.hash_ids is None else self.hash_ids.row_list(i)

    def prompt_token_ids_of(self, i: int) -> list[int] | None:
        """Prompt token ids of request `i`, or None if the trace has none."""
        return None if self.prompt_token_ids is None else self.prompt_token_ids.row_list(i)

    def replace(self, **changes: object) -> Trace:
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **changes)

    def take(self, idx: np.ndarray) -> Trace:
        """Rows `idx` (integer indices or a boolean mask) as a new trace; order must stay sorted."""
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64, copy=False)
        return Trace(
            arrival_s=self.arrival_s[idx],
            prompt_len=self.prompt_len[idx],
            output_len=self.output_len[idx],
            name=self.name,
            session_id=None if self.session_id is None else self.session_id[idx],
            hash_ids=None if self.hash_ids is None else self.hash_ids.take(idx),
            hash_block_size=self.hash_block_size,
            prompt_token_ids=(
                None if self.prompt_token_ids is None else self.prompt_token_ids.take(idx)
            ),
            load_report=self.load_report,
        )

    def equals(self, other: Trace, *, check_name: bool = False) -> bool:
        """Same rows and optional columns (bit-exact arrays); names compared if `check_name`."""

        def same(a: object, b: object) -> bool:
            if a is None or b is None:
                return a is None and b is None
            if isinstance(a, Ragged):
                return a.equals(b)
            return np.array_equal(a, b)

        return (
            (not check_name or self.name == other.name)
            and np.array_equal(self.arrival_s, other.arrival_s)
            and np.array_equal(self.prompt_len, other.prompt_len)
            and np.array_equal(self.output_len, other.output_len)
            and same(self.session_id, other.session_id)
            and same(self.hash_ids, other.hash_ids)
            and self.hash_block_size == other.hash_block_size
            and same(self.prompt_token_ids, other.prompt_token_ids)
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the column arrays."""
        total = self.arrival_s.nbytes + self.prompt_len.nbytes + self.output_len.nbytes
        for col in (self.session_id, self.hash_ids, self.prompt_token_ids):
            if col is not None:
                total += col.nbytes
        return int(total)


def sort_by_arrival(trace_columns: dict[str, object]) -> np.ndarray | None:
    """Stable order that sorts `trace_columns['arrival_s']`, or None if already sorted."""
    arrival = np.asarray(trace_columns["arrival_s"])
    if len(arrival) < 2 or not np.any(arrival[1:] < arrival[:-1]):
        return None
    return np.argsort(arrival, kind="stable")


def _int_column(values: object, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind == "f":
        if arr.size and not np.all(np.isfinite(arr) & (arr == np.round(arr))):
            raise ValueError(f"Trace: {name} must hold integers")
    elif arr.size and arr.dtype.kind not in "iub":
        raise ValueError(f"Trace: {name} must hold integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64).reshape(-1)
