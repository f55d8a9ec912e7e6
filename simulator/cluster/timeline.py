"""`Timeline`: per-step time series of every replica (batch, tokens, KV usage, queue)
and link utilisation samples, kept as plain lists and exported as numpy columns."""

from __future__ import annotations

import numpy as np

from simulator.core.scheduler import Scheduler
from simulator.core.scheduler_output import SchedulerOutput


class Timeline:
    COLUMNS = ("replica", "start_s", "end_s", "num_steps", "batch_size", "num_tokens",
               "num_prefill_tokens", "kv_usage", "num_waiting", "num_running")

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.rows: list[tuple] = []
        self.link_rows: list[tuple] = []  # (link, time_s, active transfers)

    def record_step(self, replica: str, start: float, ends: list[float], out: SchedulerOutput,
                    sched: Scheduler) -> None:
        """One row for the steps of `out` that ended at `ends` (s): a decode burst is one row
        at its first step's shape; a burst led by a prompt step is that step's row and one for
        the decodes after it (queue and KV usage as read before the steps are applied)."""
        if not self.enabled:
            return
        shape = out.shape
        state = (sched.kv_cache_manager.usage, len(sched.waiting), len(sched.running))
        if shape.num_prefill_reqs and len(ends) > 1:
            self.rows.append((replica, start, ends[0], 1, shape.num_reqs, shape.num_tokens,
                              shape.num_prefill_tokens, *state))
            start = ends[0]
            n = shape.num_reqs
            self.rows.append((replica, start, ends[-1], len(ends) - 1, n, n, 0, *state))
            return
        self.rows.append((replica, start, ends[-1], len(ends), shape.num_reqs, shape.num_tokens,
                          shape.num_prefill_tokens, *state))

    def record_link(self, link: str, time_s: float, active: int) -> None:
        if self.enabled:
            self.link_rows.append((link, time_s, active))

    def columns(self) -> dict[str, np.ndarray]:
        if not self.rows:
            return {c: np.empty(0) for c in self.COLUMNS}
        # canonical order: by end time, ties by replica name (a run split across processes
        # merges its replicas' rows into the same order)
        cols = list(zip(*sorted(self.rows, key=lambda row: (row[2], row[0]))))
        return {
            name: np.array(col, dtype=object if name == "replica" else None)
            for name, col in zip(self.COLUMNS, cols)
        }
