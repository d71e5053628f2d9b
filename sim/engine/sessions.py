"""Closed-loop session turns: which turn comes after a finished request, and when.

Pure bookkeeping for `sim.engine.engine` (which owns simulated time): a closed-loop turn
(`RequestSpec.think_s` set, `sim.workload.sessions`) arrives `think_s` after the previous turn
of its session finished. When that previous turn ends any other way, the session ends there:
its later turns are cancelled and never arrive (the engine records them as aborted, with the
reason).

Example: turns 1, 2, 3 of a session, think 2 s. Turn 1 finishes at 5.0 s -> `after(turn 1)`
gives turn 2 at 7.0 s. Turn 2 is ignored (its prompt is longer than max_model_len) ->
`after(turn 2)` cancels turn 3.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sim.scheduler import Request, RequestState
from sim.workload.request import RequestSpec


@dataclass(slots=True)
class TurnEnd:
    """What follows a request's end: its session's next turn (arriving at `at_s`) or the
    turns `cancelled` because the session ended."""

    next_turn: RequestSpec | None = None
    at_s: float = 0.0
    cancelled: list[RequestSpec] = field(default_factory=list)


@dataclass(slots=True)
class SessionTurns:
    """The closed-loop turns of a workload, keyed by the request id of the turn before."""

    #: Requests that arrive at their own `arrival_s` (every non-closed-loop spec), in order.
    open_loop: list[RequestSpec]
    after_request: dict[int, RequestSpec]
    #: Closed-loop turns neither arrived nor cancelled yet: while any is left, more arrive.
    num_pending: int = 0

    @classmethod
    def of(cls, specs: Iterable[RequestSpec]) -> SessionTurns | None:
        """The bookkeeping for `specs` (sorted by arrival), or None without closed-loop turns."""
        specs = list(specs)
        closed = [s for s in specs if s.think_s is not None]
        if not closed:
            return None
        by_turn: dict[tuple[int | None, int | None], RequestSpec] = {
            (s.session_id, s.turn): s for s in specs if s.session_id is not None
        }
        after_request = {}
        for spec in closed:
            assert spec.turn is not None  # RequestSpec: think_s needs a session and turn
            before = by_turn.get((spec.session_id, spec.turn - 1))
            if before is None:
                raise ValueError(
                    f"request {spec.request_id}: closed-loop turn {spec.turn} of session "
                    f"{spec.session_id} has no turn {spec.turn - 1} to follow"
                )
            after_request[before.request_id] = spec
        open_loop = [s for s in specs if s.think_s is None]
        return cls(open_loop, after_request, len(closed))

    def after(self, request: Request) -> TurnEnd:
        """What follows `request`, which has just ended (in any terminal state)."""
        next_turn = self.after_request.pop(request.request_id, None)
        if next_turn is None:
            return TurnEnd()
        completed = (
            request.state is RequestState.FINISHED
            and request.seq.output_len == request.max_tokens
            and request.finish_s is not None
        )
        if completed:
            assert next_turn.think_s is not None and request.finish_s is not None
            return TurnEnd(next_turn, request.finish_s + next_turn.think_s)
        # The next turn's prompt holds this turn's whole output, which never came: the
        # session ends here.
        cancelled = []
        while next_turn is not None:
            cancelled.append(next_turn)
            next_turn = self.after_request.pop(next_turn.request_id, None)
        self.num_pending -= len(cancelled)
        return TurnEnd(cancelled=cancelled)

    def arrived(self) -> None:
        self.num_pending -= 1
