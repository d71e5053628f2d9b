"""Least outstanding: the replica with the fewest unfinished requests; ties to the lowest index."""

from __future__ import annotations

from typing import Any

from sim.routing.view import ReplicaView


class LeastOutstanding:
    def choose(self, request: Any, replicas: list[ReplicaView]) -> int:
        return min(range(len(replicas)), key=lambda i: (replicas[i].num_outstanding, i))
