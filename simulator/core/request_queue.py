"""Waiting queues: FCFS (arrival order, preempted requests go back to the front) and
priority (lowest `priority` value first, then earliest arrival)."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from simulator.core.request import Request


class FCFSQueue:
    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def prepend(self, req: Request) -> None:
        """Put a preempted request back at the head."""
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, req: Request) -> None:
        self._q.remove(req)

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class PriorityQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._seq = itertools.count()
        self._removed: set[int] = set()
        self._live = 0

    def add(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_time, next(self._seq), req))
        self._live += 1

    def prepend(self, req: Request) -> None:
        """A preempted request comes back: it keeps its (priority, arrival) rank."""
        self.add(req)

    def _clean(self) -> None:
        heap = self._heap
        while heap and id(heap[0][3]) in self._removed:
            self._removed.discard(id(heapq.heappop(heap)[3]))

    def peek(self) -> Request:
        self._clean()
        return self._heap[0][3]

    def pop(self) -> Request:
        self._clean()
        self._live -= 1
        return heapq.heappop(self._heap)[3]

    def remove(self, req: Request) -> None:
        if not any(entry[3] is req for entry in self._heap):
            raise ValueError(f"request {req.request_id} is not waiting")
        self._removed.add(id(req))
        self._live -= 1

    def __len__(self) -> int:
        return self._live

    def __bool__(self) -> bool:
        return self._live > 0

    def __iter__(self) -> Iterator[Request]:
        return (e[3] for e in sorted(self._heap, key=lambda e: e[:3]) if id(e[3]) not in self._removed)


def make_queue(policy: str) -> FCFSQueue | PriorityQueue:
    return PriorityQueue() if policy == "priority" else FCFSQueue()
