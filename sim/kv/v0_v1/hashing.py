"""Block identity in vLLM v0 `BlockSpaceManagerV1`: content hashes and set order.

Two things outside the manager decide which block it picks, and both live here:

* `SequenceBlockHasher`: vLLM `Sequence.hash_of_block` / `num_hashed_tokens_of_block`
  (`vllm/sequence.py:L317-328 (0.5.4)`, spec: vllm-semantics.md section 2.7), the key a
  prefix-cached block is stored under. Upstream hashes the token prefix anew on every call
  (O(L^2)); we chain the hashes of full blocks and keep them per sequence (full blocks never
  change): equal token prefixes still get equal keys.
* `set_order`: the order in which upstream frees ``set(table)``, i.e. how Python iterates a
  set of `PhysicalTokenBlock`s; with prefix caching it decides the evictor's order.

Models the vLLM 0.5.4 wheel, like `sim.kv.v0_v1.manager` (our own code).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

from sim.kv.types import NONE_HASH, Sequence, TokenContent, chain_hash
from sim.kv.v0_v1.alloc import BlockTable

_SET_KEY_OF = attrgetter("set_key")


@dataclass(slots=True)
class _HashCache:
    """Chained hashes of a sequence's full blocks; full blocks never change, so it only grows."""

    content: TokenContent  # identity compared: a sequence whose content was replaced starts over
    full_block_hashes: list[int] = field(default_factory=list)


def unique(blocks: BlockTable) -> BlockTable:
    """Distinct blocks in first-occurrence order (where the order does not matter).

    kvsim's own (no upstream counterpart).
    """
    return list(dict.fromkeys(blocks))


def set_order(blocks: BlockTable) -> BlockTable:
    """Distinct blocks in the order Python iterates ``set(blocks)`` under the block hash
    ``hash((device, block number))``.

    Upstream `_free_block_table` frees ``set(table)`` (`vllm/core/block_manager_v1.py:L597-610 (0.5.4)`);
    with prefix caching that order decides the LRU evictor's insertion order, hence which
    block a later allocation evicts. vLLM's own `PhysicalTokenBlock` hashes by object address
    (irreproducible), so the lockstep adapter pins it to ``hash((device.value, number))``
    (`sim/vllm_real/v0_adapter.py:_deterministic_block_sets`) and we follow that order: the
    same hashes inserted in the same order give the same set iteration order. Example: GPU
    table [0, 1, 2, 3, 4] frees as [2, 1, 4, 0, 3]; [9, 8, 7] as [7, 8, 9].

    The set members are the ``(device value, block number)`` tuples themselves (vLLM's
    `utils.Device` values, ``enum.auto()``: GPU = 1, CPU = 2; tuples of ints, so their hash
    never depends on PYTHONHASHSEED): the hashes are the blocks' hashes, inserted one by one
    in table order, and two tuples are equal exactly when their blocks are the same (one
    block object per device and number), so the set iterates in the order a set of the
    blocks would; a dict maps each tuple back to its block. No wrapper object per block:
    each block carries its tuple (`PhysicalBlock.set_key`), and the passes run in C (`map`).
    """
    keys = list(map(_SET_KEY_OF, blocks))
    block_of = dict(zip(keys, blocks, strict=True))
    return list(map(block_of.__getitem__, set(keys)))


class SequenceBlockHasher:
    """Content hashes of sequences' blocks for one block size; `forget` a freed sequence."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._seq_id_to_hashes: dict[int, _HashCache] = {}

    def full_block_hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """The chained hashes of `seq`'s first `num_blocks` full blocks (computed once each).

        kvsim's own (no upstream counterpart).
        """
        cache = self._seq_id_to_hashes.get(seq.seq_id)
        if cache is None or cache.content is not seq.content:
            cache = _HashCache(seq.content)
            self._seq_id_to_hashes[seq.seq_id] = cache
        hashes = cache.full_block_hashes
        while len(hashes) < num_blocks:
            parent = hashes[-1] if hashes else NONE_HASH
            hashes.append(chain_hash(parent, seq.content.block_key(len(hashes), self.block_size)))
        return hashes

    def hash_of_block(self, seq: Sequence, logical_idx: int) -> int:
        """vLLM `Sequence.hash_of_block`: hash of tokens ``[0, min((i+1)*bs, L))``.

        For a partial last block that is the whole sequence: bs=16, L=20, i=1 hashes 20
        tokens, so two identical 20-token prompts share block 1.

        Upstream `Sequence.hash_of_block`: `vllm/sequence.py:L317-325 (0.5.4)`.
        """
        end = (logical_idx + 1) * self.block_size
        if end <= seq.num_tokens:
            return self.full_block_hashes(seq, logical_idx + 1)[logical_idx]
        parent = self.full_block_hashes(seq, logical_idx)[-1] if logical_idx else NONE_HASH
        return chain_hash(
            parent, seq.content.span_key(logical_idx * self.block_size, seq.num_tokens)
        )

    def num_hashed_tokens_of_block(self, logical_idx: int) -> int:
        """Tokens that block `logical_idx`'s hash covers.

        Upstream `Sequence.num_hashed_tokens_of_block`: `vllm/sequence.py:L327-328 (0.5.4)`.
        """
        return (logical_idx + 1) * self.block_size

    def forget(self, seq_id: int) -> None:
        """Drop the cached hashes of a sequence that left the manager.

        kvsim's own (no upstream counterpart).
        """
        self._seq_id_to_hashes.pop(seq_id, None)
