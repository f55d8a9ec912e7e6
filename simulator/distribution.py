"""`ExactDistribution`: every value of a large sample (e.g. all inter-token gaps of a run), kept
as sorted distinct values with counts, so memory grows with the distinct values, not the sample.

Its percentiles equal `np.percentile` (linear interpolation) over the full sample bit for bit,
and its mean is the exact mean rounded once, so neither depends on the order in which values
were added nor on when they were compacted: a run that streams its requests' gaps and one that
keeps every request give identical figures.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

_COMPACT_AT = 1 << 22  # buffered values (32 MiB of float64) before they are merged


class ExactDistribution:
    def __init__(self) -> None:
        self._values = np.empty(0)  # sorted distinct values
        self._counts = np.empty(0, dtype=np.int64)
        self._buffer: list[np.ndarray] = []
        self._buffered = 0

    @classmethod
    def of(cls, values: np.ndarray) -> ExactDistribution:
        d = cls()
        d.add(values)
        return d

    def add(self, values: np.ndarray) -> None:
        """Add a sample of finite float64 values."""
        if len(values):
            self._buffer.append(np.asarray(values, dtype=np.float64))
            self._buffered += len(values)
            if self._buffered >= _COMPACT_AT:
                self._compact()

    def _compact(self) -> None:
        if not self._buffer:
            return
        values, counts = np.unique(np.concatenate(self._buffer), return_counts=True)
        self._buffer, self._buffered = [], 0
        self._merge(values, counts)

    def merge(self, other: ExactDistribution) -> None:
        """Add every value of `other`."""
        other._compact()
        self._compact()
        self._merge(other._values, other._counts)

    def _merge(self, values: np.ndarray, counts: np.ndarray) -> None:
        """Merge sorted distinct `values` with their `counts` into the compacted state."""
        if not len(values):
            return
        if not len(self._values):
            self._values, self._counts = values.copy(), counts.copy()
            return
        # both sorted and distinct: add the counts of values already held, insert the others
        # at their places (linear in the sizes, where a re-sort of both would not be)
        held = self._values
        pos = np.searchsorted(held, values)
        hit = pos < len(held)
        hit[hit] = held[pos[hit]] == values[hit]
        self._counts[pos[hit]] += counts[hit]
        new = ~hit
        if new.any():
            self._values = np.insert(held, pos[new], values[new])
            self._counts = np.insert(self._counts, pos[new], counts[new])

    def __len__(self) -> int:
        self._compact()
        return int(self._counts.sum())

    def percentiles(self, qs: tuple[float, ...]) -> list[float]:
        """`np.percentile(sample, qs)` (method "linear"), bit for bit."""
        self._compact()
        n = int(self._counts.sum())
        if n == 0:
            raise ValueError("percentiles of an empty distribution")
        # numpy: virtual index (n - 1) * q / 100, gamma = index - floor(index), then _lerp
        index = (n - 1) * np.true_divide(np.asarray(qs, dtype=np.float64), 100)
        prev = np.floor(index)
        gamma = index - prev
        lo = np.clip(prev.astype(np.int64), 0, n - 1)
        hi = np.clip(lo + 1, 0, n - 1)
        ends = np.cumsum(self._counts)  # value i covers sorted ranks [ends[i-1], ends[i])
        a = self._values[np.searchsorted(ends, lo, side="right")]
        b = self._values[np.searchsorted(ends, hi, side="right")]
        diff = b - a
        out = a + diff * gamma
        out = np.where(gamma >= 0.5, b - diff * (1 - gamma), out)
        return [float(x) for x in out]

    def mean(self) -> float:
        """The exact mean of the sample, rounded once to float64."""
        self._compact()
        n = int(self._counts.sum())
        if n == 0:
            raise ValueError("mean of an empty distribution")
        if n >= 1 << 36:
            raise ValueError(f"sample of {n} values is too large for the exact mean")
        # value = m * 2**(e - 53) with integer m < 2**53: sum c * m per exponent, exactly
        mant, exp = np.frexp(self._values)
        m = (mant * float(1 << 53)).astype(np.int64)
        total = Fraction(0)
        for e in np.unique(exp).tolist():
            sel = exp == e
            c, me = self._counts[sel], m[sel]
            # m = m1 * 2**27 + m0: each partial sum stays below 2**63 while n < 2**36
            s = (int((c * (me >> 27)).sum()) << 27) + int((c * (me & ((1 << 27) - 1))).sum())
            total += Fraction(s) * Fraction(2) ** (e - 53)
        return float(total / n)

    def max(self) -> float:
        self._compact()
        return float(self._values[-1])

    def stats(self, qs: tuple[float, ...]) -> dict[str, float | None]:
        """{"mean", "p<q>"..., "max"}; all None for an empty sample."""
        keys = [f"p{q:g}" for q in qs]
        if not len(self):
            return {"mean": None, **dict.fromkeys(keys), "max": None}
        return {"mean": self.mean(), **dict(zip(keys, self.percentiles(qs))), "max": self.max()}
