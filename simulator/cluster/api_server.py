"""The OpenAI-compatible server in front of an engine: its API-server processes' event loops.

An API-server process (vLLM's `--api-server-count`, default 1) serves requests on one asyncio
event loop. A request's route handler runs `preprocess_s` seconds of synchronous work on that
loop (for instance the chat route's template handling, `simulator.engines.chat_template`),
then awaits its tokenization; the continuation that hands the request to the engine is queued
behind every handler that was ready before it, because the loop runs ready callbacks in the
order they became ready. So:
- spread arrivals (rate below 1 / preprocess_s per process) each wait `preprocess_s`;
- a burst of N requests to one process reaches the engine only after all N handlers ran,
  N x preprocess_s after it was sent, as a client's TTFT then shows.

The handler's own queueing (FIFO) and the continuations are one priority queue per process
keyed by the time each item became ready (ties in arrival order). A continuation costs no
time here. Requests go to the processes in turn (the kernel's SO_REUSEPORT balancing is
close to that). With `preprocess_s` 0 no server is built and requests reach the engine as
they are sent.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import count

import simpy

from simulator.core.request import Request

_HANDLER, _CONTINUATION = 0, 1


class APIServer:
    """`processes` event loops, each running every request's `preprocess_s` handler before
    handing it on (module docstring)."""

    def __init__(self, env: simpy.Environment, preprocess_s: float, processes: int = 1) -> None:
        if preprocess_s <= 0:
            raise ValueError(f"an API server needs preprocess_s > 0, got {preprocess_s}")
        if processes < 1:
            raise ValueError(f"an API server needs processes >= 1, got {processes}")
        self.env = env
        self.preprocess_s = preprocess_s
        self._loops = [simpy.PriorityStore(env) for _ in range(processes)]
        self._seq = count()
        self._next = 0
        self.busy_s = 0.0  # handler seconds run, all processes
        for store in self._loops:
            env.process(self._run(store))

    def submit(self, req: Request, admit: Callable[[Request], None]) -> None:
        """A request arrives (now) at the next process in turn; `admit` hands it to its engine
        once its handler has run and its continuation's turn comes."""
        store = self._loops[self._next]
        self._next = (self._next + 1) % len(self._loops)
        self._put(store, _HANDLER, req, admit)

    def _put(self, store: simpy.PriorityStore, kind: int, req: Request,
             admit: Callable[[Request], None]) -> None:
        store.put(simpy.PriorityItem((self.env.now, next(self._seq)), (kind, req, admit)))

    def _run(self, store: simpy.PriorityStore):
        env = self.env
        while True:
            item = yield store.get()
            kind, req, admit = item.item
            if kind == _HANDLER:
                yield env.timeout(self.preprocess_s)
                self.busy_s += self.preprocess_s
                self._put(store, _CONTINUATION, req, admit)
            else:
                admit(req)
