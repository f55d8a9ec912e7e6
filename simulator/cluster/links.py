"""`SimLink`: a SimPy interconnect whose bandwidth is fair-shared by the transfers in flight.

A transfer of B bytes first waits the link's latency, then joins the share: with n
transfers active each progresses at bandwidth / n bytes/s, recomputed whenever a
transfer starts or ends (processor sharing). A lone transfer therefore takes
latency + B / bandwidth seconds; two equal concurrent ones take about twice that.
"""

from __future__ import annotations

import itertools

import simpy


class SimLink:
    def __init__(self, env: simpy.Environment, name: str, bandwidth_bytes_per_s: float, latency_s: float) -> None:
        if bandwidth_bytes_per_s <= 0:
            raise ValueError(f"link {name}: bandwidth must be > 0 bytes/s, got {bandwidth_bytes_per_s}")
        if latency_s < 0:
            raise ValueError(f"link {name}: latency must be >= 0 s, got {latency_s}")
        self.env = env
        self.name = name
        self.bandwidth = float(bandwidth_bytes_per_s)
        self.latency = float(latency_s)
        self._active: dict[int, list] = {}  # id -> [remaining bytes, done event]
        self._ids = itertools.count()
        self._last = 0.0
        self._generation = 0
        self.busy_s = 0.0  # time with at least one transfer on the wire
        self.bytes_moved = 0.0
        self.num_transfers = 0

    @property
    def num_active(self) -> int:
        return len(self._active)

    def transfer(self, nbytes: float) -> simpy.Event:
        """Start moving `nbytes`; the returned event fires when the last byte lands."""
        done = self.env.event()
        self.num_transfers += 1
        self.bytes_moved += nbytes
        if nbytes <= 0:
            self.env.process(self._after_latency_only(done))
        else:
            self.env.process(self._start_after_latency(nbytes, done))
        return done

    def transfer_time_alone(self, nbytes: float) -> float:
        """Seconds `nbytes` would take on this link with nothing else on it."""
        return self.latency + nbytes / self.bandwidth

    def _after_latency_only(self, done: simpy.Event):
        yield self.env.timeout(self.latency)
        done.succeed()

    def _start_after_latency(self, nbytes: float, done: simpy.Event):
        if self.latency:
            yield self.env.timeout(self.latency)
        self._advance()
        self._active[next(self._ids)] = [float(nbytes), done]
        self._reschedule()

    def _advance(self) -> None:
        """Drain bytes for the time since the last change at the current fair share."""
        now = self.env.now
        elapsed = now - self._last
        self._last = now
        n = len(self._active)
        if n and elapsed > 0:
            self.busy_s += elapsed
            drained = elapsed * self.bandwidth / n
            for entry in self._active.values():
                entry[0] -= drained

    def _reschedule(self) -> None:
        self._generation += 1
        if not self._active:
            return
        n = len(self._active)
        least = min(entry[0] for entry in self._active.values())
        # the transfers that finish first (ties within a relative 1e-9 finish together)
        due = [k for k, e in self._active.items() if e[0] <= least * (1 + 1e-9) + 1e-9]
        delay = max(least, 0.0) * n / self.bandwidth
        self.env.process(self._complete_after(delay, self._generation, due))

    def _complete_after(self, delay: float, generation: int, due: list[int]):
        yield self.env.timeout(delay)
        if generation != self._generation:
            return  # superseded by a later start or finish
        self._advance()
        # finish the due transfers by construction: float residue must not keep them alive
        for key in due:
            self._active.pop(key)[1].succeed()
        self._reschedule()
