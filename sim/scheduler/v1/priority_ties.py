"""vLLM 4ac7713 / 0.11.0's PRIORITY waiting queue crashes on an equal (priority, arrival) pair.

Its queue is a heap of ``(priority, arrival_time, request)`` tuples (0.11.0
`sched/request_queue.py:L149-210`), and the V1 `Request` defines no order. When the heap has
to compare two entries whose priority and arrival time are equal, the tuple comparison reaches
the requests and raises ``TypeError: '<' not supported between instances of 'Request' and
'Request'``: the engine core dies (upstream #29747, where n > 1 gives the child requests one
arrival time; fixed by #29764, 0.33.0 orders by `Request.__lt__`). Whether it raises depends on
the heap's shape, not only on the tie: two tied requests never compared (one was popped before
the other arrived) are harmless.

kvsim's waiting queue is an ordered deque, so it cannot see this by itself. `HeapTieMirror`
replays the heap operations the real scheduler makes (push on arrival and on preemption, pop
on admission, the side heap of skipped requests) on a shadow heap whose entries raise exactly
where the real ones would; `V1Scheduler` turns the first one into the step's `fatal_error`.
Where the real heap cannot die, the scheduler holds a `NoTieMirror`, whose hooks do nothing.
The lockstep tier (`tests/vllm_real/test_vllm_sched_lockstep.py`) checks it raises on the same step.

Example: requests 0 and 1, both priority 0 and arrival 0.0, queued while nothing runs: pushing
1 compares it with 0 (its parent): ``error == "TypeError: ... (priority 0, arrival 0.0)"``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from sim.scheduler.request import Request


class _Tie(Exception):
    def __init__(self, a: Request, b: Request) -> None:
        self.pair = (a, b)


class _Unordered:
    """A heap entry's third element: like vLLM 0.11.0's Request, it has no order."""

    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        self.request = request

    def __lt__(self, other: _Unordered) -> bool:
        raise _Tie(self.request, other.request)


def _entry(request: Request) -> tuple[int, float, _Unordered]:
    return (request.priority, request.arrival_s, _Unordered(request))


class HeapTieMirror:
    """A shadow of the real PRIORITY waiting heap; `error` is set at the first unordered tie."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, _Unordered]] = []
        self._skipped: list[tuple[int, float, _Unordered]] = []
        self.error: str | None = None

    def push(self, request: Request) -> None:
        """`add_request` / `prepend_request` (a preempted request is pushed, not prepended)."""
        self._guard(lambda: heapq.heappush(self._heap, _entry(request)))

    def pop(self) -> None:
        """`pop_request`: the head left the queue (admitted, failed or skipped)."""
        self._guard(lambda: heapq.heappop(self._heap))

    def skip(self, request: Request) -> None:
        """The head was set aside this step: popped, pushed onto the side heap."""
        self.pop()
        self._guard(lambda: heapq.heappush(self._skipped, _entry(request)))

    def return_skipped(self) -> None:
        """After the waiting loop: the side heap is iterated in heap order (popping a copy)
        and each request pushed back (0.11.0 `request_queue.py:L177-183`, `L205-210`)."""
        side, self._skipped = self._skipped, []

        def drain() -> None:
            while side:
                entry = heapq.heappop(side)
                heapq.heappush(self._heap, entry)

        self._guard(drain)

    def remove(self, requests: list[Request]) -> None:
        """`remove_requests`: the heap filtered and heapified again (0.11.0
        `request_queue.py:L190-195`), as when an async step finishes a preempted request."""
        gone = {id(request) for request in requests}

        def rebuild() -> None:
            self._heap = [entry for entry in self._heap if id(entry[2].request) not in gone]
            heapq.heapify(self._heap)

        self._guard(rebuild)

    def _guard(self, op: Callable[[], object]) -> None:
        if self.error is not None:
            return  # the real engine is already dead; nothing to mirror
        try:
            op()
        except _Tie as tie:
            a, b = tie.pair
            self.error = (
                "TypeError: '<' not supported between instances of 'Request' and 'Request' "
                f"(vLLM 4ac7713/0.11.0 PRIORITY queue: requests {a.request_id} and "
                f"{b.request_id} tie at priority {a.priority}, arrival {a.arrival_s})"
            )


class NoTieMirror:
    """The tie mirror's hooks where no real heap can die (FCFS, 0.33.0, or simulated arrival
    times): every operation is a no-op and `error` stays None."""

    error: str | None = None

    def push(self, request: Request) -> None:
        """Nothing to mirror."""

    def pop(self) -> None:
        """Nothing to mirror."""

    def skip(self, request: Request) -> None:
        """Nothing to mirror."""

    def return_skipped(self) -> None:
        """Nothing to mirror."""

    def remove(self, requests: list[Request]) -> None:
        """Nothing to mirror."""
