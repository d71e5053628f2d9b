"""The router's own index of which replica caches which blocks, built only from KV events.

This is how llm-d's precise prefix-cache scorer learns the cache state: its KV-cache indexer
subscribes to the KV events vLLM publishes and keeps a near-real-time index of block hash ->
pods, which the scorer reads (llm-d docs, "KV-Cache Indexer",
https://llm-d.ai/docs/architecture/advanced/kv-management/kv-indexer; llm-d-kv-cache-manager
v0.2.1 README, https://pkg.go.dev/github.com/llm-d/llm-d-kv-cache-manager). Events reach a
real router late (publishing, transport, the indexer's queue); `staleness_s` models that: an
event emitted at time t is applied to the index at the first routing decision at or after
t + staleness_s, so a decision at time `now` sees exactly the events of times
<= now - staleness_s.

A replica may cache two blocks with the same hash (the V1 pool keeps duplicates) and vLLM
emits a `BlockStored` for each and a `BlockRemoved` for each eviction, so the index counts:
a hash is held while its stores outnumber its removals. (llm-d's index keeps a set of pods
per key; counting is what keeps a replica's entry while one copy of a duplicate survives.)
With staleness 0 the index is the replica's cache map at the moment of routing, so routing
from it equals reading the pool directly (`tests/test_kv_events_routing.py`).

Example (staleness 1 s): replica 0 stores h1 at t = 2.0 s. A decision at t = 2.5 s does not
see it (2.0 > 2.5 - 1); one at t = 3.0 s does (2.0 <= 2.0).
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.kv.types import BlockHash
from sim.kv_events.events import BlockRemoved, BlockStored
from sim.kv_events.stream import KVEventStream


class CacheIndex:
    """Per replica: block hash -> number of cached copies, as the events delivered so far say."""

    def __init__(self, streams: Sequence[KVEventStream | None], staleness_s: float = 0.0) -> None:
        if staleness_s < 0:
            raise ValueError(f"staleness_s must be >= 0, got {staleness_s}")
        self.staleness_s = staleness_s
        self._streams = list(streams)
        self._held: list[dict[BlockHash, int]] = [{} for _ in self._streams]

    def advance(self, now_s: float) -> None:
        """Apply every pending event emitted at or before `now_s - staleness_s`."""
        cutoff_s = now_s - self.staleness_s
        for stream, held in zip(self._streams, self._held, strict=True):
            pending = stream.pending if stream is not None else None
            while pending and pending[0].time_s <= cutoff_s:
                event = pending.popleft().event
                if isinstance(event, BlockStored):
                    for block_hash in event.block_hashes:
                        held[block_hash] = held.get(block_hash, 0) + 1
                elif isinstance(event, BlockRemoved):
                    for block_hash in event.block_hashes:
                        count = held[block_hash] - 1
                        if count:
                            held[block_hash] = count
                        else:
                            del held[block_hash]
                else:  # AllBlocksCleared
                    held.clear()

    def num_leading_blocks_held(self, replica: int, block_hashes: Sequence[BlockHash]) -> int:
        """How many of `block_hashes` (a prompt's chained full-block hashes, in order) the
        index says `replica` holds, counted from the first until the first miss.

        Example: hashes [h0, h1, h2] on a replica known to cache h0 and h2 but not h1: 1
        (h2 is unreachable without h1).
        """
        held = self._held[replica]
        if not held:
            return 0
        count = 0
        for block_hash in block_hashes:
            if block_hash not in held:
                break
            count += 1
        return count

    def num_hashes_held(self, replica: int) -> int:
        """Distinct hashes the index holds for `replica`."""
        return len(self._held[replica])
