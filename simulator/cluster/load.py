"""The load generator of a simulation: open or closed loop, and the check that a benchmark-style
load can be served at all.

Open loop (the default): each request is sent at its trace arrival time.

Closed loop (`workload.max_concurrency` = N, as `vllm bench serve --max-concurrency` and
`trtllm-bench --concurrency`): at most N requests are in the system (sent and not finished,
rejected ones included); a request is sent at max(its trace arrival, the time a slot frees),
in trace order. Its `arrival_time` becomes that send time, so TTFT, queueing delay and E2E
are measured from when it was sent, as benchmark clients measure them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import simpy

from simulator.core.request import Request
from simulator.core.scheduler import Scheduler


class ClosedLoop:
    """Sends `requests` (in order) through `submit`, never more than `max_concurrency` at once;
    call `on_finished` with every finished request."""

    def __init__(self, env: simpy.Environment, requests: Iterable[Request],
                 submit: Callable[[Request], None], max_concurrency: int) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.env = env
        self.requests = requests
        self.submit = submit
        self.max_concurrency = max_concurrency
        self.in_flight = 0
        self.max_in_flight = 0  # the most requests in the system at once
        self._slot_freed: simpy.Event | None = None

    def on_finished(self, finished: list[Request]) -> None:
        if not finished:
            return
        self.in_flight -= len(finished)
        waiter = self._slot_freed
        if waiter is not None and not waiter.triggered:
            waiter.succeed()

    def process(self):
        env = self.env
        for req in self.requests:
            delay = req.arrival_time - env.now
            if delay > 0:
                yield env.timeout(delay)
            while self.in_flight >= self.max_concurrency:
                self._slot_freed = env.event()
                yield self._slot_freed
            req.arrival_time = env.now  # sent now
            self.in_flight += 1
            if self.in_flight > self.max_in_flight:
                self.max_in_flight = self.in_flight
            self.submit(req)


def open_loop(env: simpy.Environment, requests: Iterable[Request],
              submit: Callable[[Request], None]):
    """Sends each request at its arrival time (a SimPy process body)."""
    for req in requests:
        delay = req.arrival_time - env.now
        if delay > 0:
            yield env.timeout(delay)
        submit(req)


def check_servable(source: str, keys: list[str], requests: list[Request],
                   pools: list[tuple[str, Scheduler]]) -> None:
    """Refuse a benchmark-style load (`keys`, "key = value") some of whose requests no replica
    could ever serve: each (role, scheduler) in `pools` gives its `rejection_reason` (longer than
    max_model_len, or - under either capacity policy - a prompt + max_tokens past the whole KV
    pool). Such a request would only be rejected, leaving the benchmark measuring less load
    than it states. ValueError naming `source`, the keys and the first such request."""
    for role, scheduler in pools:
        bad = [(r, why) for r in requests if (why := scheduler.rejection_reason(r)) is not None]
        if bad:
            req, why = bad[0]
            hint = ("shorten them (workload.scale_prompt, workload.scale_output, or "
                    "workload.over_max_len: reject | clip)")
            if "pool" in why:
                hint += " or give the pool more KV blocks (cache.num_gpu_blocks)"
            raise ValueError(
                f"{source}: {' and '.join(keys)}: {len(bad)} of {len(requests)} requests can never "
                f"be served by the {role} pool, e.g. request {req.request_id}: {why}; {hint}"
            )
