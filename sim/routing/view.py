"""What a router may see of the replicas, and the policy seam (`RoutingPolicy`).

A real router does not read a replica's scheduler: it sees load figures the replica reports
(outstanding requests, KV usage) and, for cache-aware routing, which prompt blocks a replica
holds, learned from the replica's KV cache events (blocks stored / removed, with their hashes).
`ReplicaView` exposes exactly that, read-only: the held blocks come from the router's
`CacheIndex`, which is built only from the events delivered so far (`sim.routing.cache_index`,
with the configured staleness), never from the replica's pool. With CPU offloading the
events also name the CPU tier's blocks, and a prompt's held prefix continues there after the
GPU's leading blocks (`CacheIndex.num_leading_blocks_held`).
"""

from __future__ import annotations

from typing import Any, Protocol

from sim.kv.types import BlockHash
from sim.routing.cache_index import CacheIndex


class ReplicaView:
    """Read-only load and cache figures of one replica, as a router would learn them."""

    __slots__ = ("_replica", "_index")

    def __init__(self, replica: Any, cache_index: CacheIndex | None = None) -> None:
        self._replica = replica
        #: None: no KV events reach the router (it sees no cached blocks).
        self._index = cache_index

    @property
    def index(self) -> int:
        return self._replica.index

    @property
    def num_outstanding(self) -> int:
        """Requests routed to the replica and not yet finished (queued or running)."""
        return self._replica.outstanding

    @property
    def kv_usage(self) -> float:
        """Fraction of GPU blocks held by requests (cached-but-free blocks count as free)."""
        stats = self._replica.pool_stats()
        return stats.num_held / stats.num_total if stats.num_total else 0.0

    def holds_block(self, block_hash: BlockHash) -> bool:
        """Whether the replica caches a block with `block_hash`, as far as its events say."""
        return self._index is not None and self._index.holds(self._replica.index, block_hash)

    def holds_cpu_block(self, block_hash: BlockHash) -> bool:
        """Whether the replica's CPU tier holds a block with `block_hash` that can continue a
        GPU prefix, as far as its events say (`CacheIndex.holds_in_cpu`)."""
        return self._index is not None and self._index.holds_in_cpu(self._replica.index, block_hash)

    def num_leading_blocks_held(self, block_hashes: list[BlockHash]) -> int:
        """How many of `block_hashes` (a prompt's chained full-block hashes, in order) the
        replica holds in its prefix cache as far as its KV events say, counted from the first
        until the first miss (`CacheIndex.num_leading_blocks_held`)."""
        if self._index is None:
            return 0
        return self._index.num_leading_blocks_held(self._replica.index, block_hashes)


class RoutingPolicy(Protocol):
    """Picks the replica for one arriving request; must be deterministic."""

    def choose(self, request: Any, replicas: list[ReplicaView]) -> int:
        """The index (into `replicas`) of the replica that gets `request`."""
        ...
