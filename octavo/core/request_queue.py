"""Waiting queues for the two scheduling policies.

``fcfs``: arrival order; a preempted request returns to the *front*.
``priority``: lowest ``priority`` value first, ties broken by arrival time, then by
``arrival_seq`` (the scheduler's arrival order), then by insertion. A preempted request
re-enters with its original key, so it returns to where it belongs.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from octavo.core.request import Request

POLICIES = ("fcfs", "priority")


class FCFSQueue:
    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def prepend(self, req: Request) -> None:
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, req: Request) -> None:
        self._q.remove(req)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class PriorityQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, int, Request]] = []
        self._counter = itertools.count()

    def add(self, req: Request) -> None:
        key = (req.priority, req.arrival_time, req.arrival_seq, next(self._counter), req)
        heapq.heappush(self._heap, key)

    prepend = add  # a preempted request's key already puts it where it belongs

    def peek(self) -> Request:
        return self._heap[0][-1]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def remove(self, req: Request) -> None:
        self._heap = [e for e in self._heap if e[-1] is not req]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[-1] for e in sorted(self._heap, key=lambda e: e[:4]))


def create_request_queue(policy: str) -> FCFSQueue | PriorityQueue:
    if policy == "fcfs":
        return FCFSQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"scheduling_policy must be one of {POLICIES}, got {policy!r}")
