"""Round robin: replica 0, 1, ..., n-1, 0, ... regardless of load."""

from __future__ import annotations

from typing import Any

from sim.routing.view import ReplicaView


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: Any, replicas: list[ReplicaView]) -> int:
        chosen = self._next
        self._next = (self._next + 1) % len(replicas)
        return chosen
