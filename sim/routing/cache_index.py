"""The router's own index of which replica caches which blocks, built only from KV events.

This is how llm-d's precise prefix-cache scorer learns the cache state: its KV-cache indexer
subscribes to the KV events vLLM publishes and keeps a near-real-time index of block hash ->
pods, which the scorer reads (llm-d docs, "KV-Cache Indexer",
https://llm-d.ai/docs/architecture/advanced/kv-management/kv-indexer; llm-d-kv-cache-manager
v0.2.1 README, https://pkg.go.dev/github.com/llm-d/llm-d-kv-cache-manager). Events reach a
real router late (publishing, transport, the indexer's queue); `staleness_s` models that: an
event emitted at time t is applied to the index at the first routing decision at or after
t + staleness_s, so a decision at time `now` sees exactly the events of times
<= now - staleness_s. With staleness 0 each event is applied as it is emitted.

A replica may cache two blocks with the same hash (the V1 pool keeps duplicates) and vLLM
emits a `BlockStored` for each and a `BlockRemoved` for each eviction, so the index counts:
a hash is held while its stores outnumber its removals. (llm-d's index keeps a set of pods
per key; counting is what keeps a replica's entry while one copy of a duplicate survives.)
With staleness 0 the index is the replica's cache map at the moment of routing, so routing
from it equals reading the pool directly (`tests/kv_events/test_kv_events.py`).

With CPU offloading a replica also reports its CPU tier's blocks (medium "CPU",
`sim.kv_events.events`), which the index keeps apart (`ReplicaFeed.cpu_held`). A prompt's
cached prefix is what vLLM's scheduler would find: its leading blocks in the GPU cache, then,
where those stop, the following blocks in the CPU tier, which the offloading connector loads
(`get_num_new_matched_tokens`, `offloading_connector.py:L156-205 @0.11.0`). The CPU tier's
blocks are keyed by the hash of the last GPU block they cover, so they continue a GPU prefix
only when the offloaded block size equals the GPU block size; with a larger one (factor 2:
one CPU block per two GPU blocks) the router counts the GPU blocks only. The CPU tier holds one
copy per hash, so its events need no counting.

Example: GPU holds h0, the CPU tier holds h1 and h3: a prompt [h0, h1, h2, h3] has 2 leading
blocks cached (h0 on the GPU, h1 in the CPU tier; h3 is unreachable without h2).

Example (staleness 1 s): replica 0 stores h1 at t = 2.0 s. A decision at t = 2.5 s does not
see it (2.0 > 2.5 - 1); one at t = 3.0 s does (2.0 <= 2.0).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Sequence

from sim.kv.types import BlockHash
from sim.kv_connector.cpu_tier import MEDIUM_CPU


class _Op(enum.Enum):
    STORED = "stored"
    REMOVED = "removed"
    CLEARED = "cleared"
    CPU_STORED = "cpu_stored"
    CPU_REMOVED = "cpu_removed"


class ReplicaFeed:
    """The router's end of one replica's event stream (a `KVEventSink`): applies each event to
    `held` at once, or queues it until `deliver` when the index is stale."""

    __slots__ = ("held", "cpu_held", "cpu_block_size", "_pending", "_clock")

    def __init__(self, clock: Callable[[], float] | None) -> None:
        #: Block hash -> cached copies on the GPU, as far as the events delivered so far say.
        self.held: dict[BlockHash, int] = {}
        #: Block hashes the CPU tier holds (ready), as far as the events delivered so far say.
        self.cpu_held: set[BlockHash] = set()
        #: The CPU tier's block size, from its first delivered store (None: none yet).
        self.cpu_block_size: int | None = None
        #: None: staleness 0, nothing waits. Else (time emitted, op, hashes, block size).
        self._pending: deque[tuple[float, _Op, tuple[BlockHash, ...], int]] | None = (
            deque() if clock is not None else None
        )
        self._clock = clock

    def stored(self, block_hashes: Sequence[BlockHash], parent: BlockHash | None) -> None:
        if self._pending is not None:
            self._queue(_Op.STORED, tuple(block_hashes))
            return
        held = self.held
        for block_hash in block_hashes:
            held[block_hash] = held.get(block_hash, 0) + 1

    def removed(self, block_hash: BlockHash) -> None:
        if self._pending is not None:
            self._queue(_Op.REMOVED, (block_hash,))
            return
        count = self.held[block_hash] - 1
        if count:
            self.held[block_hash] = count
        else:
            del self.held[block_hash]

    def cleared(self) -> None:
        # vLLM's AllBlocksCleared comes from the GPU pool's reset; the CPU tier keeps its blocks.
        if self._pending is not None:
            self._queue(_Op.CLEARED, ())
            return
        self.held.clear()

    def tier_stored(self, block_hashes: Sequence[BlockHash], medium: str, block_size: int) -> None:
        _check_medium(medium)
        if self._pending is not None:
            self._queue(_Op.CPU_STORED, tuple(block_hashes), block_size)
            return
        self.cpu_block_size = block_size
        self.cpu_held.update(block_hashes)

    def tier_removed(self, block_hashes: Sequence[BlockHash], medium: str) -> None:
        _check_medium(medium)
        if self._pending is not None:
            self._queue(_Op.CPU_REMOVED, tuple(block_hashes))
            return
        cpu_held = self.cpu_held
        for block_hash in block_hashes:
            cpu_held.remove(block_hash)

    def _queue(self, op: _Op, block_hashes: tuple[BlockHash, ...], block_size: int = 0) -> None:
        assert self._pending is not None and self._clock is not None
        self._pending.append((self._clock(), op, block_hashes, block_size))

    def deliver(self, cutoff_s: float) -> None:
        """Apply the queued events emitted at or before `cutoff_s`, in order."""
        pending = self._pending
        if not pending:
            return
        self._pending = None  # apply through the instant path
        try:
            while pending and pending[0][0] <= cutoff_s:
                _, op, block_hashes, block_size = pending.popleft()
                if op is _Op.STORED:
                    self.stored(block_hashes, None)
                elif op is _Op.REMOVED:
                    self.removed(block_hashes[0])
                elif op is _Op.CLEARED:
                    self.cleared()
                elif op is _Op.CPU_STORED:
                    self.tier_stored(block_hashes, MEDIUM_CPU, block_size)
                else:
                    self.tier_removed(block_hashes, MEDIUM_CPU)
        finally:
            self._pending = pending


def _check_medium(medium: str) -> None:
    if medium != MEDIUM_CPU:
        raise AssertionError(f"KV events of medium {medium!r}: only a CPU tier is modelled")


class CacheIndex:
    """Per replica: which block hashes the router believes it caches (one `ReplicaFeed` each).

    `block_size` is the GPU block size: CPU-tier blocks of another size do not count.
    """

    def __init__(
        self,
        num_replicas: int,
        staleness_s: float = 0.0,
        clock: Callable[[], float] | None = None,
        block_size: int | None = None,
    ) -> None:
        if staleness_s < 0:
            raise ValueError(f"staleness_s must be >= 0, got {staleness_s}")
        if staleness_s > 0 and clock is None:
            raise ValueError("a stale index needs a clock to stamp the events it queues")
        self.staleness_s = staleness_s
        self.block_size = block_size
        self.feeds = [ReplicaFeed(clock if staleness_s > 0 else None) for _ in range(num_replicas)]

    def advance(self, now_s: float) -> None:
        """Deliver every queued event emitted at or before `now_s - staleness_s`."""
        if self.staleness_s > 0:
            cutoff_s = now_s - self.staleness_s
            for feed in self.feeds:
                feed.deliver(cutoff_s)

    def holds(self, replica: int, block_hash: BlockHash) -> bool:
        return block_hash in self.feeds[replica].held

    def holds_in_cpu(self, replica: int, block_hash: BlockHash) -> bool:
        """Whether `replica`'s CPU tier holds `block_hash` as a block that can continue a GPU
        prefix (False when its block size is not the GPU's)."""
        feed = self.feeds[replica]
        return feed.cpu_block_size == self.block_size and block_hash in feed.cpu_held

    def num_leading_blocks_held(self, replica: int, block_hashes: Sequence[BlockHash]) -> int:
        """How many of `block_hashes` (a prompt's chained full-block hashes, in order) the
        index says `replica` holds, counted from the first until the first miss.

        Then, where the GPU's stop, the blocks the replica's CPU tier holds, when its block
        size is the GPU's (module docstring).

        Example: hashes [h0, h1, h2] on a replica known to cache h0 and h2 but not h1: 1
        (h2 is unreachable without h1); if its CPU tier (same block size) holds h1: 2.
        """
        feed = self.feeds[replica]
        held = feed.held
        count = 0
        for block_hash in block_hashes:
            if block_hash not in held:
                break
            count += 1
        cpu_held = feed.cpu_held
        if cpu_held and feed.cpu_block_size == self.block_size:
            for block_hash in block_hashes[count:]:
                if block_hash not in cpu_held:
                    break
                count += 1
        return count

    def num_hashes_held(self, replica: int) -> int:
        """Distinct hashes the index holds for `replica`."""
        return len(self.feeds[replica].held)
