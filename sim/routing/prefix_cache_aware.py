"""Prefix-cache-aware routing: send a prompt where its leading blocks are already cached.

score(replica) = leading full prompt blocks the replica holds - load_weight * outstanding;
the highest score wins, ties to the lowest index. This is the shape of llm-d's precise
prefix-cache scorer combined with a load scorer; the held blocks come from `ReplicaView`,
i.e. the router's index of the replicas' KV events (`sim.routing.cache_index`), which sees
them `engine.router_staleness_s` late.

The prompt's chained block hashes are computed one block at a time and only while some
replica still holds every block so far: a prompt that no replica caches costs one hash, not
one per block. A replica's held prefix continues in its CPU tier after its GPU's leading
blocks (`CacheIndex.num_leading_blocks_held`): once a block is found only in the CPU tier,
that replica's next blocks are looked up there alone, as the offloading connector does.

Example (block size 16, load_weight 1): a 64-token prompt whose first 3 blocks replica 1
caches while replica 1 has 2 outstanding requests and replica 0 has none and caches nothing:
scores are 0 - 0 = 0 and 3 - 2 = 1, so replica 1 gets it.
"""

from __future__ import annotations

from typing import Any

from sim.kv.types import NONE_HASH, chain_hash
from sim.routing.view import ReplicaView


def leading_blocks_held(content: Any, block_size: int, replicas: list[ReplicaView]) -> list[int]:
    """Per replica, how many of the prompt's leading full blocks it holds (until its first
    miss); the same as `num_leading_blocks_held(content.block_hashes(...))` for each."""
    held = [0] * len(replicas)
    matching = list(range(len(replicas)))
    #: Replicas whose prefix has left the GPU and continues in the CPU tier.
    on_cpu = [False] * len(replicas)
    parent = NONE_HASH
    for block in range(content.num_tokens // block_size):
        if not matching:
            break
        parent = chain_hash(parent, content.block_key(block, block_size))
        still = []
        for i in matching:
            view = replicas[i]
            if not on_cpu[i] and view.holds_block(parent):
                still.append(i)
            elif view.holds_cpu_block(parent):
                on_cpu[i] = True
                still.append(i)
        matching = still
        for i in matching:
            held[i] += 1
    return held


class PrefixCacheAware:
    def __init__(self, block_size: int, load_weight: float = 1.0) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.load_weight = load_weight

    def choose(self, request: Any, replicas: list[ReplicaView]) -> int:
        held = leading_blocks_held(request.seq.content, self.block_size, replicas)
        best_index = 0
        best_score = float("-inf")
        for i, view in enumerate(replicas):
            score = held[i] - self.load_weight * view.num_outstanding
            if score > best_score:  # strict: ties keep the lowest index
                best_index, best_score = i, score
        return best_index
