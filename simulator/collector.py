"""`RequestCollector`: reduces finished requests into their per-request records and the run's
inter-token-gap distribution as they finish, so a simulation's memory grows with the requests in
flight, not with the requests simulated.

Finished requests are buffered and reduced `batch` at a time with the vectorised
`records_and_gaps` (exactly the columns a list of requests gives), written into row i of each
column for the request of trace row i (`request_id` == str(i)), then released: their token
times are dropped unless `keep` (the full per-request record, `sim.keep_requests`).
"""

from __future__ import annotations

import numpy as np

from simulator.core.request import Request
from simulator.distribution import ExactDistribution
from simulator.metrics import all_itls, records_and_gaps, request_records

_OBJECT_COLUMNS = ("request_id", "finish_reason", "replica")


class RequestCollector:
    def __init__(self, num_requests: int, *, keep: bool = False, batch: int = 4096,
                 expected: int | None = None, measured_from: int = 0) -> None:
        """`num_requests`: rows of the trace; `expected`: how many of them this run simulates
        (all by default); `measured_from`: the rows before it are warm-up requests, whose
        gaps stay out of the ITL distribution (their records are kept)."""
        self.num_requests = num_requests
        self.measured_from = measured_from
        self.expected = num_requests if expected is None else expected
        self.keep = keep
        self.batch = batch
        self.num_finished = 0
        self.itl = ExactDistribution()  # gaps between consecutive tokens of completed requests
        self.kept: list[Request] = []
        self._pending: list[Request] = []
        self._columns: dict[str, np.ndarray] | None = None

    def add(self, finished: list[Request]) -> None:
        """Take requests that just finished (each exactly once)."""
        self._pending.extend(finished)
        self.num_finished += len(finished)
        if len(self._pending) >= self.batch:
            self._reduce()

    def _reduce(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        cols, gaps = records_and_gaps(batch)
        if self._columns is None:
            n = self.num_requests
            self._columns = {k: np.empty(n, dtype=v.dtype) if k not in _OBJECT_COLUMNS
                             else np.full(n, "", dtype=object) for k, v in cols.items()}
        rows = np.fromiter((int(r.request_id) for r in batch), dtype=np.int64, count=len(batch))
        for key, col in cols.items():
            self._columns[key][rows] = col
        reason = cols["finish_reason"]
        done = (reason == "stop") | (reason == "length")
        if self.measured_from:
            done &= rows >= self.measured_from
        # (the gaps of completed, measured requests only: an aborted one's are not in it)
        self.itl.add(gaps if done.all() else all_itls(r for r, c in zip(batch, done) if c))
        if self.keep:
            self.kept.extend(batch)

    def records(self) -> dict[str, np.ndarray]:
        """Every request's record, in trace order (after all have finished)."""
        self._reduce()
        if self.num_finished != self.expected:
            raise RuntimeError(f"{self.expected - self.num_finished} of {self.expected} "
                               "requests have not finished")
        if self._columns is None:
            return request_records([])
        return self._columns

    def requests(self) -> list[Request]:
        """The finished requests in trace order (only when kept)."""
        self._reduce()
        return sorted(self.kept, key=lambda r: int(r.request_id))

    def rows_only(self, rows: np.ndarray) -> None:
        """Keep only the records of `rows` (this process's share of a split run), so they
        cross to the parent without the other rows' empty space."""
        self._reduce()
        if self._columns is not None:
            self._columns = {k: v[rows] for k, v in self._columns.items()}

    def merge(self, part: RequestCollector, rows: np.ndarray) -> None:
        """Take another process's share of the trace: `part` after `rows_only(rows)`."""
        if part._columns is not None:
            if self._columns is None:
                self._columns = {k: np.empty(self.num_requests, dtype=v.dtype) if k not in
                                 _OBJECT_COLUMNS else np.full(self.num_requests, "", dtype=object)
                                 for k, v in part._columns.items()}
            for key, col in part._columns.items():
                self._columns[key][rows] = col
        self.itl.merge(part.itl)
        self.kept.extend(part.kept)
        self.num_finished += part.num_finished
