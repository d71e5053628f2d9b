"""Per-sequence prefix-caching bookkeeping of v0 V2 (`vllm/core/block/prefix_caching_block.py:L837-955 (0.5.4)`).

`ComputedBlocksTracker` caches each seq's computed block ids, skipping the last block.
It extends its list incrementally and, once a scan finds fewer computed blocks than
blocks (a "gap"), stops updating until the seq is freed. Example: blocks [4, 9, 2] with 4
and 2 computed -> scan of [4, 9] gives [4] and a gap, so later calls return [4].

`LastAccessBlocksTracker` remembers one access time per seq and stamps it onto the seq's
blocks only when the seq is freed (so the evictor sees the latest time).
"""

from __future__ import annotations

from sim.kv.v0_v2.cpu_gpu import CpuGpuBlockAllocator


class ComputedBlocksTracker:
    def __init__(self, allocator: CpuGpuBlockAllocator) -> None:
        self._allocator = allocator
        self._seq_to_computed: dict[int, tuple[list[int], bool]] = {}

    def add_seq(self, seq_id: int) -> None:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L861-865 (0.5.4)`."""
        assert seq_id not in self._seq_to_computed
        self._seq_to_computed[seq_id] = ([], False)

    def remove_seq(self, seq_id: int) -> None:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L867-871 (0.5.4)`."""
        del self._seq_to_computed[seq_id]

    def get_cached_computed_blocks_and_update(self, seq_id: int, block_ids: list[int]) -> list[int]:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L873-917 (0.5.4)`."""
        prev_ids, has_gap = self._seq_to_computed[seq_id]
        if has_gap:
            return prev_ids
        num_cur_blocks = len(block_ids) - 1
        assert num_cur_blocks >= 0
        if len(prev_ids) >= num_cur_blocks:
            return prev_ids
        computed_ids = self._allocator.get_computed_block_ids(prev_ids, block_ids, skip_last=True)
        self._seq_to_computed[seq_id] = (computed_ids, len(computed_ids) < num_cur_blocks)
        return computed_ids


class LastAccessBlocksTracker:
    def __init__(self, allocator: CpuGpuBlockAllocator) -> None:
        self._allocator = allocator
        self._seq_to_last_access_s: dict[int, float | None] = {}

    def add_seq(self, seq_id: int) -> None:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L929-933 (0.5.4)`."""
        assert seq_id not in self._seq_to_last_access_s
        self._seq_to_last_access_s[seq_id] = None

    def remove_seq(self, seq_id: int) -> None:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L935-939 (0.5.4)`."""
        del self._seq_to_last_access_s[seq_id]

    def has_access_time(self, seq_id: int) -> bool:
        """Whether `update_seq_blocks_last_access` would stamp anything (a KeyError if the seq
        is not tracked, as there).

        kvsim's own (no upstream counterpart).
        """
        return self._seq_to_last_access_s[seq_id] is not None

    def update_last_access(self, seq_id: int, now_s: float) -> None:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L941-943 (0.5.4)`."""
        assert seq_id in self._seq_to_last_access_s
        self._seq_to_last_access_s[seq_id] = now_s

    def update_seq_blocks_last_access(self, seq_id: int, block_ids: list[int]) -> None:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L945-955 (0.5.4)`."""
        now_s = self._seq_to_last_access_s[seq_id]
        if now_s is not None:
            self._allocator.mark_blocks_as_accessed(block_ids, now_s)
