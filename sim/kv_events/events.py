"""The KV cache event types, in vLLM's format (`vllm/distributed/kv_events.py` @0.11.0).

vLLM 0.11.0 defines three events (`kv_events.py:L47-62`) and publishes them in batches
stamped with the wall time of the scheduler step that collected them (`EventBatch.ts`,
L24-32; `scheduler.py:L609-623` takes the block pool's queue once per `schedule()`):

* `BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium)`:
  blocks that became full and entered the prefix cache, in prompt order; the parent is the
  hash of the block before the first one (None at the start of a sequence). Emitted by
  `BlockPool.cache_full_blocks` (`vllm/v1/core/block_pool.py:L188-255`, the event at L235-255).
* `BlockRemoved(block_hashes, medium)`: a cached block evicted when its block was reused, one
  event per block (`_maybe_evict_cached_block`, L286-320, the event at L310-319).
* `AllBlocksCleared()`: the whole prefix cache was reset (`reset_prefix_cache`, L355-383, the event at L380-381).

`medium` is "GPU" for the block pool (`MEDIUM_GPU`, L44). With CPU offloading the connector
adds the CPU tier's events to the same batch (`scheduler.py:L612-618`; the connector's
`take_events`, `offloading_connector.py:L367-384 @0.11.0`): a `BlockStored` with medium "CPU",
no parent, no token ids and the offloaded block size for the blocks whose copy to the CPU
completed, and a `BlockRemoved` with medium "CPU" for the blocks evicted from the CPU tier to
make room for a store (`sim.kv_connector.cpu_tier`). kvsim differs in three ways:

* **Hashes** are kvsim's chained block hashes (`sim.kv.types.chain_hash`), not vLLM's
  sha256/cbor digests: the same chain structure (a block's hash covers its parent's), other
  values. A consumer only compares them with each other, so the values do not matter.
* **Token ids are not simulated**: a prompt is a list of content segments, not tokens.
  `BlockStored.num_tokens` (= block_size * len(block_hashes)) stands in for `token_ids`;
  the block hashes are what identifies the content.
* **Time**: every event carries the simulated time at which the pool acted (`TimedEvent`),
  which is the time of the scheduler call vLLM would stamp its batch with.

`lora_id` is always None (kvsim models no LoRA adapters).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.kv.types import BlockHash
from sim.kv_connector.cpu_tier import MEDIUM_CPU as MEDIUM_CPU  # the CPU tier's, re-exported

MEDIUM_GPU = "GPU"


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    #: In place of vLLM's `token_ids` (not simulated): how many tokens the blocks hold.
    num_tokens: int
    block_size: int
    lora_id: int | None = None
    medium: str = MEDIUM_GPU


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str = MEDIUM_GPU


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class TimedEvent:
    """One event of one replica, at the simulated time the block pool emitted it."""

    time_s: float
    replica: int
    event: KVCacheEvent
