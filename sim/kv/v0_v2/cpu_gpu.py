"""GPU + CPU allocators behind one id space (`vllm/core/block/cpu_gpu_block_allocator.py:L10-336 (0.5.4)`).

Absolute ids are GPU ``0..G-1`` then CPU ``G..G+C-1`` (`L55-57`); the physical id on a
device is the index within that device's sorted ids, so CPU absolute id ``G+j`` is CPU
physical ``j`` (`L220-232`). The null block (`L113-117`) is a real GPU block allocated the
first time a sliding-window table asks for it, shared by every table, and never freed:
`free(null)` is a no-op (`L173-185`).

Worked example (G=10, C=4): the first allocation gets GPU id 0; swapping a 1-block seq
out gives it CPU absolute id 10, reported as the pair ``(0, 0)`` (GPU phys 0 -> CPU phys 0).
"""

from __future__ import annotations

import enum

from sim.kv.types import ContentKey, NullBlockWriteError
from sim.kv.v0_v2.naive import Block, NaiveBlockAllocator
from sim.kv.v0_v2.prefix_caching import PrefixCachingBlockAllocator

DeviceAllocator = NaiveBlockAllocator | PrefixCachingBlockAllocator


class Device(enum.Enum):
    GPU = "gpu"
    CPU = "cpu"


class CpuGpuBlockAllocator:
    def __init__(
        self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int, enable_caching: bool
    ) -> None:
        cls = PrefixCachingBlockAllocator if enable_caching else NaiveBlockAllocator
        self.num_gpu_blocks = num_gpu_blocks
        self.gpu = cls(list(range(num_gpu_blocks)), block_size)
        self.cpu = cls(list(range(num_gpu_blocks, num_gpu_blocks + num_cpu_blocks)), block_size)
        self.null_block: Block | None = None

    def device_allocator(self, device: Device) -> DeviceAllocator:
        """The allocator of `device` (GPU or CPU) (kvsim's own (no upstream counterpart))."""
        return self.gpu if device is Device.GPU else self.cpu

    def allocator_of(self, block_id: int) -> DeviceAllocator:
        """The allocator that owns absolute block id `block_id`.

        kvsim's own (no upstream counterpart).
        """
        return self.gpu if block_id < self.num_gpu_blocks else self.cpu

    @property
    def uses_content_keys(self) -> bool:
        """Whether the allocators key full blocks by content (prefix caching).

        kvsim's own (no upstream counterpart).
        """
        return self.gpu.uses_content_keys

    def allocate_or_get_null_block(self) -> Block:
        """Upstream: `vllm/core/block/cpu_gpu_block_allocator.py:L113-117 (0.5.4)`."""
        if self.null_block is None:
            block = self.gpu.allocate_mutable_block(None)
            block.is_null = True
            self.null_block = block
        return self.null_block

    # The per-block entry points below pick the device inline (not via `device_allocator` /
    # `allocator_of`): they run once per allocated, written or freed block.
    def allocate_mutable_block(self, prev: Block | None, device: Device = Device.GPU) -> Block:
        """Upstream: `vllm/core/block/cpu_gpu_block_allocator.py:L119-131 (0.5.4)`."""
        alloc = self.gpu if device is Device.GPU else self.cpu
        return alloc.allocate_mutable_block(prev)

    def allocate_immutable_blocks(
        self, prev: Block | None, keys: list[ContentKey | None], device: Device = Device.GPU
    ) -> list[Block]:
        """Upstream: `vllm/core/block/cpu_gpu_block_allocator.py:L133-151 (0.5.4)`."""
        alloc = self.gpu if device is Device.GPU else self.cpu
        return alloc.allocate_immutable_blocks(prev, keys)

    def append_tokens(self, block: Block, num_tokens: int, key: ContentKey | None) -> None:
        """Write `tokens` into `block`, through its allocator.

        Upstream: `Block.append_token_ids` of both block kinds,
        `vllm/core/block/naive_block.py:L384-396 (0.5.4)` and
        `vllm/core/block/prefix_caching_block.py:L721-746 (0.5.4)`.
        """
        if block.is_null:
            raise NullBlockWriteError("null block should not be modified")
        block_id = block.block_id
        assert block_id is not None
        alloc = self.gpu if block_id < self.num_gpu_blocks else self.cpu
        alloc.append_tokens(block, num_tokens, key)

    def free(self, block: Block) -> None:
        """Upstream: `vllm/core/block/cpu_gpu_block_allocator.py:L173-185 (0.5.4)`."""
        if block.is_null:
            return
        block_id = block.block_id
        assert block_id is not None
        (self.gpu if block_id < self.num_gpu_blocks else self.cpu).free(block)

    def free_blocks(self, blocks: list[Block]) -> None:
        """`free` every block of `blocks` in order (a table's release): same effect, same errors.

        Runs of blocks of one device go through that allocator's `free_run` (one loop per
        run, not a device lookup per block). Example (G=10): [null, 3, 4] skips the null block and frees 3 then 4,
        so the GPU deque starts 4, 3, ...

        kvsim's own (no upstream counterpart).
        """
        idx, num = 0, len(blocks)
        while idx < num:
            block = blocks[idx]
            if block.is_null:
                idx += 1
                continue
            block_id = block.block_id
            assert block_id is not None
            alloc = self.gpu if block_id < self.num_gpu_blocks else self.cpu  # `allocator_of`
            end = alloc.free_run(blocks, idx)
            if end == idx:  # an id no pool holds: the per-block path raises as before
                alloc.free(block)
                end = idx + 1
            idx = end

    def refcount(self, block_id: int) -> int:
        """The refcount of an absolute id, on whichever device holds it.

        kvsim's own (no upstream counterpart).
        """
        alloc = self.gpu if block_id < self.num_gpu_blocks else self.cpu
        return alloc.refcounter.get(block_id)

    def fork(self, blocks: list[Block]) -> list[Block]:
        """Upstream: `vllm/core/block/cpu_gpu_block_allocator.py:L187-203 (0.5.4)`."""
        assert blocks and not blocks[-1].is_null and blocks[-1].block_id is not None
        return self.allocator_of(blocks[-1].block_id).fork(blocks)

    def num_free_blocks(self, device: Device) -> int:
        """Free blocks on `device`.

        Upstream `get_num_free_blocks`: `vllm/core/block/cpu_gpu_block_allocator.py:L205-215
        (0.5.4)`.
        """
        return self.device_allocator(device).num_free_blocks

    def num_total_blocks(self, device: Device) -> int:
        """All blocks on `device`.

        Upstream `get_num_total_blocks`: `vllm/core/block/cpu_gpu_block_allocator.py:L217-218
        (0.5.4)`.
        """
        return self.device_allocator(device).num_total_blocks

    def get_physical_block_id(self, device: Device, absolute_id: int) -> int:
        """Upstream: `vllm/core/block/cpu_gpu_block_allocator.py:L220-232 (0.5.4)`."""
        return absolute_id if device is Device.GPU else absolute_id - self.num_gpu_blocks

    def swap(self, blocks: list[Block], src: Device, dst: Device) -> dict[int, int]:
        """Free every block's src id, then give each block object a new dst id (L234-260).

        Upstream: `vllm/core/block/cpu_gpu_block_allocator.py:L234-260 (0.5.4)`.
        """
        src_ids = [b.block_id for b in blocks]
        self.device_allocator(src).swap_out(blocks)
        self.device_allocator(dst).swap_in(blocks)
        mapping: dict[int, int] = {}
        for src_id, block in zip(src_ids, blocks, strict=True):
            if src_id is not None and block.block_id is not None:
                mapping[src_id] = block.block_id
        return mapping

    def get_num_blocks_touched(
        self, blocks: list[Block], device: Device, num_lookahead_slots: int = 0
    ) -> int:
        """Upstream: `vllm/core/block/cpu_gpu_block_allocator.py:L262-280 (0.5.4)`."""
        return self.device_allocator(device).get_num_blocks_touched(blocks, num_lookahead_slots)

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """Upstream: `vllm/core/block/cpu_gpu_block_allocator.py:L282-292 (0.5.4)`."""
        return self.gpu.clear_copy_on_writes()

    def mark_blocks_as_accessed(self, block_ids: list[int], now: float) -> None:
        """Upstream: `vllm/core/block/cpu_gpu_block_allocator.py:L294-299 (0.5.4)`."""
        self.gpu.mark_blocks_as_accessed(block_ids, now)

    def get_computed_block_ids(
        self, prev_ids: list[int], block_ids: list[int], skip_last: bool
    ) -> list[int]:
        """Upstream: `vllm/core/block/cpu_gpu_block_allocator.py:L307-313 (0.5.4)`."""
        return self.gpu.get_computed_block_ids(prev_ids, block_ids, skip_last)

    def get_common_computed_block_ids(self, per_seq_ids: list[list[int]]) -> list[int]:
        """Upstream: `vllm/core/block/cpu_gpu_block_allocator.py:L315-320 (0.5.4)`."""
        return self.gpu.get_common_computed_block_ids(per_seq_ids)
