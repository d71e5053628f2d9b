"""Routing policies: which replica an arriving request goes to (one module per policy).

`Router` names a policy in the scenario (`engine.router`); `make_policy` builds it. Every
policy implements `RoutingPolicy.choose(request, replicas)` over read-only `ReplicaView`s.
"""

from __future__ import annotations

import enum

from sim.routing.cache_index import CacheIndex
from sim.routing.least_kv_usage import LeastKVUsage
from sim.routing.least_outstanding import LeastOutstanding
from sim.routing.prefix_cache_aware import PrefixCacheAware
from sim.routing.round_robin import RoundRobin
from sim.routing.session_affinity import SessionAffinity
from sim.routing.view import ReplicaView, RoutingPolicy


class Router(enum.Enum):
    ROUND_ROBIN = "round_robin"
    LEAST_OUTSTANDING = "least_outstanding"
    LEAST_KV_USAGE = "least_kv_usage"
    PREFIX_CACHE_AWARE = "prefix_cache_aware"
    SESSION_AFFINITY = "session_affinity"

    @property
    def reads_kv_events(self) -> bool:
        """Whether the policy routes on the replicas' KV events."""
        return self is Router.PREFIX_CACHE_AWARE


def make_policy(router: Router, block_size: int, load_weight: float = 1.0) -> RoutingPolicy:
    """A fresh policy (round robin keeps a cursor, so one per run)."""
    if router is Router.ROUND_ROBIN:
        return RoundRobin()
    if router is Router.LEAST_OUTSTANDING:
        return LeastOutstanding()
    if router is Router.LEAST_KV_USAGE:
        return LeastKVUsage()
    if router is Router.SESSION_AFFINITY:
        return SessionAffinity()
    return PrefixCacheAware(block_size, load_weight)


__all__ = [
    "CacheIndex",
    "LeastKVUsage",
    "LeastOutstanding",
    "PrefixCacheAware",
    "ReplicaView",
    "RoundRobin",
    "Router",
    "RoutingPolicy",
    "SessionAffinity",
    "make_policy",
]
