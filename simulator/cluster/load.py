"""The load generator of a simulation: open or closed loop, and the check that a benchmark-style
load can be served at all.

Open loop (the default): each request is sent at its trace arrival time.

Closed loop (`workload.max_concurrency` = N, as `vllm bench serve --max-concurrency` and
`trtllm-bench --concurrency`): at most N requests are in the system (sent and not finished,
rejected ones included); a request is sent at max(its trace arrival, the time a slot frees),
in trace order. Its `arrival_time` becomes that send time, so TTFT, queueing delay and E2E
are measured from when it was sent, as benchmark clients measure them.

Warm-up drain (`workload.warmup_drain`, with `warmup_requests` = W): the first measured request
(trace order W) is sent only once all W warm-up requests have finished, and every measured
request's trace arrival moves by that wait, as `vllm bench serve --num-warmups` and
`sglang.bench_serving --warmup-requests` finish their warm-ups before the measured run starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import simpy

from simulator.core.request import Request
from simulator.core.scheduler import Scheduler


class WarmupDrain:
    """Holds the measured requests back until the first `warmup` requests sent have finished,
    then moves each measured request's arrival by the wait (`hold`, in a load generator's
    process; `sent` and `on_finished` keep count)."""

    def __init__(self, env: simpy.Environment, warmup: int) -> None:
        if warmup < 1:
            raise ValueError(f"a warm-up drain needs warm-up requests, got {warmup}")
        self.env = env
        self.warmup = warmup
        self._warmup_ids: set[str] = set()
        self._left = warmup
        self._done = env.event()
        self._shift_s = 0.0  # set when the first measured request goes out
        self.drained_at_s: float | None = None

    def sent(self, index: int, req: Request) -> None:
        """Note the `index`-th request sent (trace order) as a warm-up one if it is one."""
        if index < self.warmup:
            self._warmup_ids.add(req.request_id)

    def on_finished(self, finished: list[Request]) -> None:
        if self._done.triggered:
            return
        for r in finished:
            if r.request_id in self._warmup_ids:
                self._warmup_ids.discard(r.request_id)
                self._left -= 1
        if self._left == 0:
            self.drained_at_s = self.env.now
            self._done.succeed()

    def hold(self, index: int, req: Request):
        """A SimPy generator: before the `index`-th request (trace order), wait for the drain when
        it is the first measured one, and shift a measured request's arrival by the wait."""
        if index < self.warmup:
            return
        if index == self.warmup:
            if not self._done.triggered:
                yield self._done
            self._shift_s = max(0.0, self.env.now - req.arrival_time)
        req.arrival_time += self._shift_s


class ClosedLoop:
    """Sends `requests` (in order) through `submit`, never more than `max_concurrency` at once;
    call `on_finished` with every finished request."""

    def __init__(self, env: simpy.Environment, requests: Iterable[Request],
                 submit: Callable[[Request], None], max_concurrency: int,
                 drain: WarmupDrain | None = None) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.env = env
        self.requests = requests
        self.submit = submit
        self.max_concurrency = max_concurrency
        self.drain = drain
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
        env, drain = self.env, self.drain
        for index, req in enumerate(self.requests):
            if drain is not None:
                yield from drain.hold(index, req)
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
            if drain is not None:
                drain.sent(index, req)
            self.submit(req)


def open_loop(env: simpy.Environment, requests: Iterable[Request],
              submit: Callable[[Request], None], drain: WarmupDrain | None = None):
    """Sends each request at its arrival time (a SimPy process body)."""
    for index, req in enumerate(requests):
        if drain is not None:
            yield from drain.hold(index, req)
        delay = req.arrival_time - env.now
        if delay > 0:
            yield env.timeout(delay)
        if drain is not None:
            drain.sent(index, req)
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
