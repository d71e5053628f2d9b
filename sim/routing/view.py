"""What a router may see of the replicas, and the policy seam (`RoutingPolicy`).

A real router does not read a replica's scheduler: it sees load figures the replica reports
(outstanding requests, KV usage) and, for cache-aware routing, which prompt blocks a replica
holds, learned from the replica's KV cache events (blocks stored / removed, with their hashes).
`ReplicaView` exposes exactly that, read-only. The held-hash set is read straight from the
replica's V1 block pool at routing time: this equals consuming its KV events with no delay
(no staleness is modelled yet). With CPU offloading (`sim.kv_connector`) the replica's events
also name the blocks its CPU tier holds (vLLM 0.11.0's connector emits them with medium CPU,
`offloading_connector.py:L366-382`); a prefix continues there after the GPU's leading blocks,
as the connector's lookup does, and both count alike.
"""

from __future__ import annotations

from typing import Any, Protocol

from sim.kv.types import BlockHash


class ReplicaView:
    """Read-only load and cache figures of one replica, as a router would learn them."""

    __slots__ = ("_replica", "_cached", "_cpu_blocks")

    def __init__(self, replica: Any) -> None:
        self._replica = replica
        # Only the single-group V1 pool keys its cache by kvsim's chained hashes; other
        # managers (V0, hybrid groups, real vLLM code) report no held blocks.
        pool = getattr(replica.manager, "block_pool", None)
        self._cached: dict | None = getattr(pool, "cached_block_hash_to_block", None)
        if getattr(replica.manager, "coordinator", None) is not None:
            self._cached = None
        # A CPU tier keyed by the same hashes (offloaded block = one GPU block): hash -> ref_cnt.
        connector = getattr(getattr(replica, "connector_hooks", None), "connector", None)
        tier = getattr(connector, "tier", None)
        self._cpu_blocks: dict | None = None
        if tier is not None and getattr(connector, "block_size_factor", 0) == 1:
            self._cpu_blocks = tier.blocks

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

    def num_leading_blocks_held(self, block_hashes: list[BlockHash]) -> int:
        """How many of `block_hashes` (a prompt's chained full-block hashes, in order) the
        replica holds in its prefix cache, counted from the first until the first miss.

        Example: hashes [h0, h1, h2] of a 48-token prompt (block size 16) on a replica that
        caches h0 and h2 but not h1: the answer is 1 (h2 is unreachable without h1).
        """
        held = 0
        if self._cached:
            for block_hash in block_hashes:
                if block_hash not in self._cached:
                    break
                held += 1
        cpu_blocks = self._cpu_blocks
        if cpu_blocks:
            # Then the CPU tier's ready blocks (ref_cnt >= 0; -1 while a store runs).
            for block_hash in block_hashes[held:]:
                if cpu_blocks.get(block_hash, -1) < 0:
                    break
                held += 1
        return held


class RoutingPolicy(Protocol):
    """Picks the replica for one arriving request; must be deterministic."""

    def choose(self, request: Any, replicas: list[ReplicaView]) -> int:
        """The index (into `replicas`) of the replica that gets `request`."""
        ...
