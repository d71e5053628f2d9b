"""vLLM's real v0 block managers (BlockSpaceManagerV1 / V2, vLLM 0.5.x-0.6.x) behind kvsim's API.

`RealV0Manager` presents the real manager through `sim.kv.protocol.V0BlockManager` and
`PoolIntrospection`, so kvsim's auditor, schedulers and engine can run on top of it, and the
lockstep replayer can compare it with kvsim's models.

How kvsim objects map to vLLM's (`vllm/sequence.py (0.5.4)`):

* each kvsim `Sequence` gets one real `vllm.sequence.Sequence` (same seq_id), whose tokens are
  ``seq.content.token_ids()`` and whose computed-token count and status are copied from ours
  before every call (kvsim's scheduler owns them, as vLLM's does);
* each call that takes a `SequenceGroup` builds a fresh real `SequenceGroup` over those real
  sequences (it holds no block state, so rebuilding is exact and cheap);
* what vLLM's code raises becomes a kvsim `ManagerError` (`sim.vllm_real.errors`): an empty
  free list (V2 ``NoFreeBlocksError``, V1 "Out of memory!", evictor "No usable cache memory
  left") -> `NoFreeBlocksError`, "Double free!" -> `DoubleFreeError`, and so on; an exception
  raised by this adapter itself propagates unchanged (a kvsim bug, not a finding).

Worked example (the issue #7470 "4 vs 3" case, bs=16, W=24, G=10)::

    mgr = RealV0Manager(KVCacheConfig(10, 16, sliding_window=24), "v2", vllm_version="0.5.4")
    mgr.allocate(group_of(112 tokens))          # 7 blocks, free 3
    mgr.can_allocate(group_of(64 tokens))       # OK: min(4, M=3) = 3 <= 3
    mgr.allocate(...)                           # raises NoFreeBlocksError; free 0, 3 leaked
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.kv.config import KVCacheConfig
from sim.kv.protocol import PoolStats
from sim.kv.types import (
    AllocStatus,
    Sequence,
    SequenceGroup,
    SequenceStatus,
)
from sim.vllm_real.errors import translate_error
from sim.vllm_real.loader import VllmInstall, import_vllm, load_vllm


def _deterministic_block_sets(install: VllmInstall) -> None:
    """Make vLLM 0.5.4's BlockSpaceManagerV1 reproducible from run to run.

    Its `free` walks `set(block_table)` of `PhysicalTokenBlock`s, which hash by object address,
    so the order blocks return to the free list and the LRU evictor (and, with prefix caching,
    which cached block is evicted later) changes between runs of the same workload: 3 of 6
    10,000-operation lockstep runs of one seed diverged from kvsim's model. Hashing a block by
    (device, block number) fixes that order without changing what any block is: with it, the
    same runs are identical every time. Only the iteration order of a set vLLM leaves arbitrary
    changes.
    """
    block_module = import_vllm("block", install)
    cls = block_module.PhysicalTokenBlock
    if getattr(cls, "_kvsim_deterministic_hash", False):
        return
    cls.__hash__ = lambda self: hash((self.device.value, self.block_number))
    cls._kvsim_deterministic_hash = True


class RealV0Manager:
    """A real vLLM v0 block manager ("v1" = BlockSpaceManagerV1, "v2" = BlockSpaceManagerV2)."""

    def __init__(
        self,
        config: KVCacheConfig,
        kind: str,
        *,
        vllm_root: str | Path | None = None,
        vllm_version: str | None = None,
        install: VllmInstall | None = None,
    ) -> None:
        if kind not in ("v1", "v2"):
            raise ValueError(f"kind must be 'v1' or 'v2', got {kind!r}")
        self.install = install or load_vllm(vllm_root, vllm_version)
        self.kind = kind
        self.config = config
        if kind == "v1":
            _deterministic_block_sets(self.install)
        self._seq_mod = import_vllm("sequence", self.install)
        mod = import_vllm(f"core.block_manager_{kind}", self.install)
        cls = mod.BlockSpaceManagerV1 if kind == "v1" else mod.BlockSpaceManagerV2
        self.real = cls(
            block_size=config.block_size,
            num_gpu_blocks=config.num_gpu_blocks,
            num_cpu_blocks=config.num_cpu_blocks,
            watermark=config.watermark,
            sliding_window=config.sliding_window,
            enable_caching=config.enable_prefix_caching,
        )
        self.block_size = config.block_size
        self.watermark_blocks = self.real.watermark_blocks
        # The window in blocks as the real manager computed it (the auditor names it in its
        # messages): V1's `block_sliding_window`, V2's `max_block_sliding_window` (M).
        self.block_sliding_window = getattr(self.real, "block_sliding_window", None)
        self.max_block_sliding_window = getattr(self.real, "max_block_sliding_window", None)
        self.num_total_gpu_blocks = config.num_gpu_blocks
        self.num_total_cpu_blocks = config.num_cpu_blocks
        self._real_seqs: dict[int, Any] = {}
        # V1's uncached allocator creates every block up front; keep them to see leaked ones.
        self._v1_gpu_blocks = (
            list(self.real.gpu_allocator.free_blocks)
            if kind == "v1" and not config.enable_prefix_caching
            else []
        )

    # ------------------------------------------------------------------ kvsim -> vLLM objects
    def _real_seq(self, seq: Sequence):
        real = self._real_seqs.get(seq.seq_id)
        if real is None or real.get_len() > seq.num_tokens:
            prompt_ids = seq.content.token_ids(0, seq.prompt_len)
            real = self._seq_mod.Sequence(
                seq.seq_id, {"prompt_token_ids": prompt_ids}, self.block_size
            )
            self._real_seqs[seq.seq_id] = real
        have = real.get_len()
        if have < seq.num_tokens:
            for token_id in seq.content.token_ids(have, seq.num_tokens):
                real.data.append_token_id(token_id, 0.0)
        # The scheduler owns these (vLLM: Scheduler updates them); copy ours over.
        real.data._num_computed_tokens = seq.num_computed_tokens
        status = "WAITING" if seq.status is SequenceStatus.PREEMPTED else seq.status.name
        real.status = self._seq_mod.SequenceStatus[status]
        return real

    def _real_group(self, group: SequenceGroup):
        seqs = [self._real_seq(s) for s in group.seqs]
        return self._seq_mod.SequenceGroup(
            str(group.request_id), seqs, arrival_time=group.arrival_s
        )

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:
            mapped = translate_error(exc, self.install.root / "vllm")
            if mapped is None or mapped is exc:
                raise
            raise mapped from exc

    # ------------------------------------------------------------------ V0BlockManager API
    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        return AllocStatus[self._call(self.real.can_allocate, self._real_group(seq_group)).name]

    def allocate(self, seq_group: SequenceGroup) -> None:
        self._call(self.real.allocate, self._real_group(seq_group))

    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool:
        return bool(
            self._call(self.real.can_append_slots, self._real_group(seq_group), num_lookahead_slots)
        )

    def append_slots(self, seq: Sequence, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        out = self._call(self.real.append_slots, self._real_seq(seq), num_lookahead_slots)
        return [tuple(pair) for pair in out]

    def fork(self, parent_seq: Sequence, child_seq: Sequence) -> None:
        parent = self._real_seq(parent_seq)
        self._real_seqs[child_seq.seq_id] = parent.fork(child_seq.seq_id)
        self._call(self.real.fork, parent, self._real_seq(child_seq))

    def can_swap_in(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocStatus:
        status = self._call(self.real.can_swap_in, self._real_group(seq_group), num_lookahead_slots)
        return AllocStatus[status.name]

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        return [tuple(p) for p in self._call(self.real.swap_in, self._real_group(seq_group))]

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        return bool(self._call(self.real.can_swap_out, self._real_group(seq_group)))

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        return [tuple(p) for p in self._call(self.real.swap_out, self._real_group(seq_group))]

    def free(self, seq: Sequence) -> None:
        self._call(self.real.free, self._real_seq(seq))

    def get_block_table(self, seq: Sequence) -> list[int]:
        return list(self.real.get_block_table(self._real_seq(seq)))

    def get_num_free_gpu_blocks(self) -> int:
        return self.real.get_num_free_gpu_blocks()

    def get_num_free_cpu_blocks(self) -> int:
        return self.real.get_num_free_cpu_blocks()

    def access_all_blocks_in_seq(self, seq: Sequence, access_time: float) -> None:
        self.real.access_all_blocks_in_seq(self._real_seq(seq), access_time)

    def mark_blocks_as_computed(self, seq_group: SequenceGroup) -> None:
        self.real.mark_blocks_as_computed(self._real_group(seq_group))

    def get_common_computed_block_ids(self, seqs: list[Sequence]) -> list[int]:
        return list(self.real.get_common_computed_block_ids([self._real_seq(s) for s in seqs]))

    def admission_blocks(self, seq_group: SequenceGroup) -> int:
        """Blocks `can_allocate` compares with the free pool (the first WAITING seq, capped)."""
        seq = seq_group.get_seqs(SequenceStatus.WAITING)[0]
        need = seq.n_blocks(self.block_size)
        window = self.config.sliding_window
        if window is not None:
            cap = (
                -(-window // self.block_size)
                if self.kind == "v1"
                else window // self.block_size + 2
            )
            need = min(need, cap)
        return need

    # ------------------------------------------------------------------ PoolIntrospection
    def _gpu_allocator(self):
        if self.kind == "v1":
            return self.real.gpu_allocator
        return self.real.block_allocator._allocators[self._device().GPU]

    def _device(self):
        return import_vllm("utils", self.install).Device

    def _null_block_id(self) -> int | None:
        if self.kind == "v1":
            return None
        null = self.real.block_allocator._null_block
        return None if null is None else null.block_id

    def block_refcounts(self) -> dict[int, int]:
        if self.kind == "v2":
            counts = self._gpu_allocator()._refcounter._refcounts
            return {bid: rc for bid, rc in sorted(counts.items()) if rc > 0}
        if self._v1_gpu_blocks:
            return {b.block_number: b.ref_count for b in self._v1_gpu_blocks if b.ref_count > 0}
        # Cached V1 allocator: every block with ref > 0 sits in some table or in cached_blocks.
        blocks = {id(b): b for b in self.real.gpu_allocator.cached_blocks.values()}
        for table in self.real.block_tables.values():
            blocks.update({id(b): b for b in table if b.device == self._device().GPU})
        return {
            b.block_number: b.ref_count
            for b in sorted(blocks.values(), key=lambda b: b.block_number)
            if b.ref_count > 0
        }

    def pool_stats(self) -> PoolStats:
        free = self.real.get_num_free_gpu_blocks()
        if self.config.enable_prefix_caching:
            evictor = self._gpu_allocator().evictor
            evictable = evictor.num_blocks
        else:
            evictable = 0
        held = self.num_total_gpu_blocks - free
        if self.kind == "v2" or self._v1_gpu_blocks:
            held = len(self.block_refcounts())
        return PoolStats(self.num_total_gpu_blocks, free, held, evictable)

    def seq_block_ids(self, seq_id: int) -> list[int]:
        table = self.real.block_tables.get(seq_id)
        if table is None:
            return []
        if self.kind == "v1":
            if any(b.device != self._device().GPU for b in table):
                return []  # swapped out: no GPU table
            return [b.block_number for b in table]
        ids = list(table.physical_block_ids)
        # Absolute ids: GPU 0..G-1, CPU from G on
        # (`vllm/core/block/cpu_gpu_block_allocator.py:L56-70 (0.5.4)`).
        return [] if any(b >= self.num_total_gpu_blocks for b in ids) else ids

    def num_seq_blocks(self, seq_id: int) -> int:
        null = self._null_block_id()
        return len({b for b in self.seq_block_ids(seq_id) if b != null})

    def max_seq_footprint(self, seq: Sequence) -> int | None:
        # The real code has no notion of a bound; the auditor checks models, not vLLM.
        return None

    def leaked_block_ids(self) -> list[int]:
        """GPU blocks with a positive refcount that no table (nor the null block) owns."""
        owned: set[int] = set()
        for seq_id in self.real.block_tables:
            owned.update(self.seq_block_ids(seq_id))
        null = self._null_block_id()
        if null is not None:
            owned.add(null)
        if self.config.enable_prefix_caching and self.kind == "v1":
            return []  # lazily created blocks: an orphan is not observable
        if self.config.enable_prefix_caching:
            # Orphaned hashed blocks stay in _cached_blocks with ref 1; report them too.
            pass
        return sorted(b for b in self.block_refcounts() if b not in owned)

    def recover_leaked_blocks(self) -> int:
        """Give leaked ids back to the free list (naive V2 and uncached V1 only)."""
        leaked = self.leaked_block_ids()
        if not leaked or self.config.enable_prefix_caching:
            return 0
        if self.kind == "v2":
            alloc = self._gpu_allocator()
            for bid in leaked:
                alloc._refcounter._refcounts[bid] = 0
                alloc._free_block_indices.appendleft(bid)
        else:
            by_id = {b.block_number: b for b in self._v1_gpu_blocks}
            for bid in leaked:
                by_id[bid].ref_count = 0
                self.real.gpu_allocator.free_blocks.append(by_id[bid])
        return len(leaked)


def make_real_v0(
    config: KVCacheConfig,
    kind: str,
    vllm_root: str | Path | None = None,
    vllm_version: str | None = "0.5.4",
) -> RealV0Manager:
    """A real v0 manager from an install folder, or from `.vllm/<version>` (default 0.5.4)."""
    if vllm_root is not None:
        vllm_version = None
    return RealV0Manager(config, kind, vllm_root=vllm_root, vllm_version=vllm_version)
