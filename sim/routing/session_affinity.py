"""Session affinity: every request of a session goes to the replica its first request got.

The first request of a session (and every request without a session id) goes to the replica
with the fewest outstanding requests (ties to the lowest index); later turns of the session
stick to that replica, where the session's earlier context is most likely still cached. The
session id is the request's `session_id` attribute (None or absent: no session).

Example (2 replicas, both idle): s1 turn 1 -> 0; s2 turn 1 -> 1 (replica 0 now has one
outstanding); s1 turn 2 -> 0 whatever the load.
"""

from __future__ import annotations

from typing import Any

from sim.routing.least_outstanding import LeastOutstanding
from sim.routing.view import ReplicaView


class SessionAffinity:
    def __init__(self) -> None:
        self._replica_of: dict[Any, int] = {}
        self._fallback = LeastOutstanding()

    def choose(self, request: Any, replicas: list[ReplicaView]) -> int:
        session = getattr(request, "session_id", None)
        if session is None:
            return self._fallback.choose(request, replicas)
        chosen = self._replica_of.get(session)
        if chosen is None:
            chosen = self._fallback.choose(request, replicas)
            self._replica_of[session] = chosen
        return chosen
