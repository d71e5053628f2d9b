"""Least KV usage: the replica with the smallest fraction of GPU blocks held; then the fewest
outstanding requests; then the lowest index."""

from __future__ import annotations

from typing import Any

from sim.routing.view import ReplicaView


class LeastKVUsage:
    def choose(self, request: Any, replicas: list[ReplicaView]) -> int:
        return min(
            range(len(replicas)),
            key=lambda i: (replicas[i].kv_usage, replicas[i].num_outstanding, i),
        )
