"""The in-flight read check: a sliding-window (or chunked-local) block freed while a step in
flight reads it.

Under async scheduling step N+1 is scheduled while step N runs. Before vLLM 0.26.0 the
scheduler prunes a sliding-window table on C, the computed-token count, which already counts
step N's tokens (`remove_skipped_blocks(request, request.num_computed_tokens)` inside
`allocate_slots`, `kv_cache_manager.py @0.25.1`), so it can free a block step N's attention
window still covers. A freed block may be handed to another request in the same schedule, or
filled by a KV load that is not ordered with the compute stream, while step N reads it: silent
KV corruption, no crash (vllm-ascend #13501; fixed in 0.26.0 by vllm PR #47728, which prunes
on C minus the in-flight tokens: `sim.kv.pins.VllmPin.frees_on_processed_basis`).

Worked example (window 128, block 32, 158 tokens processed): the step computing position 158
reads positions [158 - 128 + 1, 158] = [31, 158], so block 0 (positions 0-31) is read. Its
schedule advances C to 159; scheduling the next step prunes (159 - 128 + 1) // 32 = 1 block:
block 0, while the step still reads position 31. On the processed basis the prune counts
159 - 1 = 158: (158 - 127) // 32 = 0 blocks, and block 0 stays until the step's output is back.

What is checked: for each step in flight and each sliding-window group, the block holding
the lowest position the step reads (tables are pruned from the front, so if that block is
still there, so is every later one). It is checked after each `allocate_slots` of the same
request, the only call that prunes a running request's table. A request freed with a step in
flight (finished, aborted, preempted) is not reported: upstream frees those at once and defers
the free only for a KV consumer under P/D (vllm PR #45357), which kvsim refuses with async
scheduling. Full-attention groups are never pruned and are not tracked.

Chunked-local groups (chunks of A) are pruned on the same C (the shared `remove_skipped_blocks`
from 0.19.1), so the same race exists at each chunk boundary: the step computing position
A - 1 reads the whole chunk from 0, and scheduling the next step (C = A) frees the chunk's
blocks while it runs. Only the lowest position differs (`first_read_position`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sim.kv.config import KVCacheGroupSpec

#: (request id, group index, block index) -> the block id there, None for a null block or an
#: index past the table's end.
BlockIdAt = Callable[[int, int, int], int | None]


def first_read_position(group: KVCacheGroupSpec, position: int) -> int:
    """The lowest position the token at `position` reads in `group` (what a prune on C =
    `position` keeps): ``max(0, p - W + 1)`` for a window of W, ``p // A * A`` for chunks of
    A, 0 for full attention. Example (W=128): 158 -> 31; (A=8192): 8,192 -> 8,192."""
    if group.attention_chunk_size is not None:
        return position // group.attention_chunk_size * group.attention_chunk_size
    if group.sliding_window is not None:
        return max(0, position - group.sliding_window + 1)
    return 0


def _untracked(group: KVCacheGroupSpec) -> bool:
    """Groups whose in-flight reads this audit does not follow: full attention (sinks too)
    and Mamba are never pruned while running, a circular buffer holds one block for good, and
    an R-SWA group's reads are not one window (the prompt, then the last W tokens: its gap
    frees are left out of this audit, `sim.kv.v1_engine.full_variants`)."""
    return group.is_full_attention or group.mamba or group.is_full_variant


@dataclass(frozen=True, slots=True)
class InFlightRead:
    """The lowest block one in-flight step reads in one sliding-window group."""

    group: int
    block_index: int
    block_id: int
    #: The lowest token position the step's attention reads in this group.
    first_position: int


class InFlightReads:
    """Which sliding-window blocks each request's steps in flight read (module docstring).

    Example (window 128, block 32): `step_scheduled(r, 158, 159)` records group 0's block
    index (158 - 127) // 32 = 0, which a prune on C = 159 reaches ((159 - 127) // 32 = 1);
    after the next `allocate_slots(r)` nulled index 0, `pruned(r)` returns that record.
    """

    def __init__(
        self, groups: tuple[KVCacheGroupSpec, ...], block_size: int, block_id_at: BlockIdAt
    ) -> None:
        self.groups = groups
        self.block_size = block_size
        self.block_id_at = block_id_at
        #: request id -> the reads of each of its steps in flight at risk, by the step's first
        #: position (a step is settled by it, so steps with nothing at risk need no record).
        self._steps: dict[int, dict[int, list[InFlightRead]]] = {}

    @property
    def tracks_anything(self) -> bool:
        """False when every group is full attention or Mamba: nothing is ever pruned."""
        return any(not _untracked(group) for group in self.groups)

    def step_scheduled(self, request_id: int, first_position: int, computed_tokens: int) -> None:
        """A step computing positions [first_position, computed_tokens) was scheduled.

        Only a read a prune could reach is recorded: the request's next `allocate_slots`,
        the one call that prunes before the step settles, counts at most C =
        `computed_tokens` (the in-flight tokens included), so it nulls at most the first
        (C - W + 1) // bs blocks. A decode's lowest block is at risk once in bs steps.
        """
        reads = []
        for group, spec in enumerate(self.groups):
            if _untracked(spec):
                continue  # never pruned while running, or not by a window (`_untracked`)
            lowest = first_read_position(spec, first_position)
            index = lowest // self.block_size
            if index >= first_read_position(spec, computed_tokens) // self.block_size:
                continue  # beyond any prune before the step settles
            block_id = self.block_id_at(request_id, group, index)
            if block_id is not None:  # nothing live to protect (a dropped prefix hit)
                reads.append(InFlightRead(group, index, block_id, lowest))
        if reads:
            self._steps.setdefault(request_id, {})[first_position] = reads

    def step_settled(self, request_id: int, first_position: int) -> None:
        """The request's step from `first_position` returned its output."""
        steps = self._steps.get(request_id)
        if steps is not None:
            steps.pop(first_position, None)
            if not steps:
                del self._steps[request_id]

    def forget(self, request_id: int) -> None:
        """The request's blocks were freed (finished, aborted or preempted)."""
        self._steps.pop(request_id, None)

    def pruned(self, request_id: int) -> list[InFlightRead]:
        """The reads of the request's steps in flight whose block left its table; each is
        reported once (the step's record is dropped)."""
        steps = self._steps.get(request_id)
        if not steps:
            return []
        lost = []
        for reads in steps.values():
            for read in list(reads):
                if self.block_id_at(request_id, read.group, read.block_index) != read.block_id:
                    lost.append(read)
                    reads.remove(read)
        return lost
