"""`ProgressBar`: a progress line for long simulations, redrawn at most every `interval_s`
seconds (wall), so a run of millions of requests spends nothing measurable on it.

On a terminal it redraws one line in place; elsewhere (a log file, CI) it writes a new line at
most every `log_interval_s` seconds. It reads finished requests, their rate and the time left.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, total: int, desc: str = "simulating", *, interval_s: float = 0.5,
                 log_interval_s: float = 10.0, stream: TextIO | None = None, width: int = 30) -> None:
        self.total = max(int(total), 0)
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s if self.tty else log_interval_s
        self.width = width
        self.done = 0
        self._start = time.monotonic()
        self._next_draw = self._start + self.interval_s
        self._closed = False

    def update(self, n: int) -> None:
        """Count `n` more finished requests (cheap: draws only when the interval has passed)."""
        self.done += n
        if n and time.monotonic() >= self._next_draw:
            self._draw()

    def set(self, done: int) -> None:
        """Set the count of finished requests (a total gathered from several processes)."""
        self.update(done - self.done)

    def _draw(self, final: bool = False) -> None:
        now = time.monotonic()
        self._next_draw = now + self.interval_s
        elapsed = now - self._start
        frac = self.done / self.total if self.total else 1.0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else float("nan")
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        eta = f"{left:6.0f}s left" if left == left and not final else f"{elapsed:6.1f}s total"
        line = (f"{self.desc} [{bar}] {100 * frac:5.1f}% {self.done}/{self.total} req "
                f"{rate:8.0f} req/s {eta}")
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        if final and self.tty:
            self.stream.write("\n")
        self.stream.flush()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._draw(final=True)
