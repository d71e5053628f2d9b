"""Prefix-cache-aware routing: send a prompt where its leading blocks are already cached.

score(replica) = leading full prompt blocks the replica holds - load_weight * outstanding;
the highest score wins, ties to the lowest index. This is the shape of llm-d's precise
prefix-cache scorer combined with a load scorer; the held blocks come from `ReplicaView`,
i.e. the router's index of the replicas' KV events (`sim.routing.cache_index`), which sees
them `engine.router_staleness_s` late.

Example (block size 16, load_weight 1): a 64-token prompt whose first 3 blocks replica 1
caches while replica 1 has 2 outstanding requests and replica 0 has none and caches nothing:
scores are 0 - 0 = 0 and 3 - 2 = 1, so replica 1 gets it.
"""

from __future__ import annotations

from typing import Any

from sim.routing.view import ReplicaView


class PrefixCacheAware:
    def __init__(self, block_size: int, load_weight: float = 1.0) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.load_weight = load_weight

    def choose(self, request: Any, replicas: list[ReplicaView]) -> int:
        prompt = request.seq.content
        hashes = prompt.block_hashes(self.block_size, prompt.num_tokens // self.block_size)
        best_index = 0
        best_score = float("-inf")
        for i, view in enumerate(replicas):
            held = view.num_leading_blocks_held(hashes)
            score = held - self.load_weight * view.num_outstanding
            if score > best_score:  # strict: ties keep the lowest index
                best_index, best_score = i, score
        return best_index
