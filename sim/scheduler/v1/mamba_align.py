"""The V1 scheduler's block-aligned prefill split for Mamba prefix caching ("align" mode).

In the Mamba cache mode "align" a Mamba layer writes its state only at the end of a step, so
a state is cacheable only where a prefill chunk ends on a block boundary. The scheduler
therefore trims each prefill chunk of a hybrid model (`need_mamba_block_aligned_split`:
Mamba layers and `mamba_cache_mode == "align"`) before `allocate_slots`, for running and
waiting requests alike; a chunk trimmed to 0 tokens is not scheduled this step (running:
the loop moves on to the next request; waiting: the waiting loop stops).

``start`` = tokens computed (plus a waiting request's prefix hit), ``L`` = the request's
tokens, ``P`` its prompt, ``bs`` the attention block size (the Mamba block size in this
mode), ``last = L - L % bs`` the last cacheable boundary. Only while ``start < max(P, L - 1)``
(prefill, or a resumed request replaying its outputs):

* 0.19.1 / 0.20.0 (`sched/scheduler.py:L298-345 @0.19.1`, `L302-349 @0.20.0`): if
  ``start + n < last`` then ``n = n // bs * bs``; else if ``start < last < start + n`` then
  ``n = last - start`` (the last chunk stops at ``last`` so its state is cached); else ``n``
  (the last few tokens).
* 0.25.1 (`L338-394`): the same, then the "Marconi" rule for a waiting request: with
  ``u`` = the full-attention hit less the final hit (an uncached shared prefix,
  `kv_cache_coordinator.py:L737`), ``u >= bs`` and ``n > u``: ``n = u // bs * bs``, so the
  state at the end of the shared prefix is cached.
* 0.26.0 (`L355-423`): on chunk ends: ``end = start + n``; if ``end < last`` then ``end =
  end // bs * bs``; then the chunk stops at the earliest of these strictly inside
  ``(start, end)``: the next block boundary when ``start`` is mid-block, ``last``, and the
  request's shared-prefix junction ``J`` floored to blocks from ``start`` (``J`` = the hit
  plus ``u`` when ``u > 0``, else 0, set at every prefix lookup and kept on the request,
  `kv_cache_manager.py:L264-281`); ``n = max(end - start, 0)``.
* 0.33.0 (`L546-664`; one block size, so no fine-grained partial hits and no tail stop, no
  EAGLE, no shared-prefix checkpoint): ``E = max(P, L - 1)`` the prefill end, ``last = (L -
  1) // bs * bs`` (`get_mamba_prefill_checkpoint_position`: strictly below L, where 0.26.0
  had ``L - L % bs``); with prefill checkpoint blocks and a chunk reaching E whose
  checkpoint ``(E - 1) // bs * bs`` the kernel can export (`mamba_checkpoint.checkpoint_valid`)
  the manager keeps that state itself: ``last = 0`` and no next-boundary stop. While ``end <
  E`` the end is floored to the block grid (unless that leaves nothing and bs exceeds the
  prefill limit, `max_num_scheduled_tokens` capped by `long_prefill_token_threshold`:
  then the chunk runs sub-block). Then the earliest stop strictly inside ``(start, end)``:
  the next boundary when ``start`` is mid-block, ``last``, the junction floored from ``start``.

Worked example (bs=16, a 100-token prompt, budget 40, nothing cached): ``last = 96``. Step 1:
``start=0, n=40 -> 40 < 96 -> n = 32``. Step 2: ``start=32 -> n = 32``. Step 3:
``start=64, n=36 -> 100 > 96 -> n = 96 - 64 = 32``. Step 4: ``start=96, n=4`` (the last few
tokens). The Mamba states after 32, 64 and 96 tokens are cached; a budget of 8 (< bs) would
schedule nothing: ``8 // 16 * 16 = 0``. 0.33.0 with checkpoint blocks, same prompt: steps 1
and 2 alike (32, 32); step 3 ``start=64, n=36`` reaches E=100 with checkpoint 96 inside:
``n = 36`` (the manager's checkpoint block holds the state after 96 tokens).

Left out: EAGLE's one-block back-off of ``last`` (speculative decoding), hash lookahead, KV
connectors' external tokens (asserted 0 upstream), 0.26.0's and 0.33.0's fine-grained
partial-tail stops (a prefix-match unit below the block size, refused by kvsim), and 0.33.0's
opt-in shared-prefix checkpoint (`enable_mamba_shared_prefix_checkpoint`, EAGLE only).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sim.kv.pins import VllmPin
from sim.kv.v1_engine.mamba_checkpoint import checkpoint_position, checkpoint_valid


class SplitRule(enum.Enum):
    """Which release's `_mamba_block_aligned_split` applies."""

    #: 0.19.1 / 0.20.0: floor the chunk to whole blocks, stop at the last boundary.
    FLOOR = "floor"
    #: 0.25.1: FLOOR, then a waiting request's chunk stops at an uncached shared prefix.
    FLOOR_MARCONI = "floor+marconi"
    #: 0.26.0: chunk ends on the block grid, stops at the next boundary, the last one, or
    #: the request's shared-prefix junction.
    STOPS = "stops"
    #: 0.33.0: STOPS with the last boundary strictly below L, the floor only before the
    #: prefill end, and a final chunk the manager's checkpoint block lets run through.
    CHECKPOINTS = "checkpoints"


_RULES = {
    VllmPin.V0_19_1: SplitRule.FLOOR,
    VllmPin.V0_20_0: SplitRule.FLOOR,
    VllmPin.V0_25_1: SplitRule.FLOOR_MARCONI,
    VllmPin.V0_26_0: SplitRule.STOPS,
    VllmPin.V0_33_0: SplitRule.CHECKPOINTS,
}


def split_rule_for(pin: VllmPin) -> SplitRule | None:
    """The release's split rule; None where kvsim does not model Mamba prefix caching.

    kvsim's own (no upstream counterpart).
    """
    return _RULES.get(pin)


@dataclass(frozen=True, slots=True)
class MambaAlignedSplit:
    """The split of one scheduler (`rule`, the attention block size `block_size`; 0.33.0
    also reads the prefill limit and whether the Mamba specs have checkpoint blocks)."""

    rule: SplitRule
    block_size: int
    #: 0.33.0: `max_num_scheduled_tokens`, capped by a positive `long_prefill_token_threshold`.
    max_prefill_tokens: int = 0
    #: 0.33.0: `mamba_has_prefill_checkpoint_blocks` (`sched/scheduler.py:L445-449`).
    checkpoint_blocks: bool = False

    def split(
        self,
        num_new_tokens: int,
        start: int,
        num_tokens: int,
        num_prompt_tokens: int,
        *,
        uncached_prefix_tokens: int = 0,
        junction_tokens: int = 0,
    ) -> int:
        """The chunk `num_new_tokens` from `start` trimmed as the module docstring says.
        `uncached_prefix_tokens` is 0.25.1's ``u`` (a waiting request's lookup, else 0),
        `junction_tokens` 0.26.0's ``J``. Example (bs=16, L=P=100): start=0, n=40 -> 32;
        start=64, n=36 -> 32; start=96, n=4 -> 4.

        Upstream `Scheduler._mamba_block_aligned_split`:
        `vllm/v1/core/sched/scheduler.py:L298-345 (0.19.1)`, `L338-394 (0.25.1)`,
        `L355-423 (0.26.0)`, `L546-664 (0.33.0)`.
        """
        prefill_end = max(num_prompt_tokens, num_tokens - 1)
        if start >= prefill_end:
            return num_new_tokens
        bs = self.block_size
        if self.rule is SplitRule.CHECKPOINTS:
            return self._split_033(num_new_tokens, start, num_tokens, prefill_end, junction_tokens)
        last = num_tokens - num_tokens % bs
        if self.rule is SplitRule.STOPS:
            return _split_on_stops(num_new_tokens, start, last, bs, junction_tokens)
        end = start + num_new_tokens
        if end < last:
            num_new_tokens = num_new_tokens // bs * bs
        elif start < last < end:
            num_new_tokens = last - start
        if (
            self.rule is SplitRule.FLOOR_MARCONI
            and uncached_prefix_tokens >= bs
            and num_new_tokens > uncached_prefix_tokens
        ):
            num_new_tokens = uncached_prefix_tokens // bs * bs
        return num_new_tokens

    def _split_033(
        self, num_new_tokens: int, start: int, num_tokens: int, prefill_end: int, junction: int
    ) -> int:
        """0.33.0's chunk end (module docstring). Example (bs=16, L=P=100, checkpoint
        blocks): start=64, n=36 -> 36; without them -> 96 - 64 = 32 (``last = 99 // 16 * 16
        = 96``); start=0, n=40 -> 32 (floored, 40 < 100).

        Upstream `Scheduler._mamba_block_aligned_split`:
        `vllm/v1/core/sched/scheduler.py:L546-664 (0.33.0)`.
        """
        bs = self.block_size
        last = checkpoint_position(num_tokens, bs)
        end = start + num_new_tokens
        internal = (
            self.checkpoint_blocks
            and end >= prefill_end
            and checkpoint_valid(start, end, checkpoint_position(prefill_end, bs), bs)
        )
        if internal:
            last = 0
        if end < prefill_end:
            aligned_end = end // bs * bs
            if aligned_end > start or bs <= self.max_prefill_tokens:
                end = aligned_end
        next_block_boundary = (start // bs + 1) * bs
        stops = (
            next_block_boundary if start % bs != 0 and not internal else 0,
            last,
            start + (junction - start) // bs * bs if start < junction < end else 0,
        )
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)


def _split_on_stops(num_new_tokens: int, start: int, last: int, bs: int, junction: int) -> int:
    """0.26.0's chunk end: on the block grid before `last`, then the earliest mandatory stop
    inside the chunk. Example (bs=16, last=96, junction 48): start=0, n=90 -> end 80, stop
    48 -> 48.

    Upstream: `vllm/v1/core/sched/scheduler.py:L378-423 (0.26.0)`.
    """
    end = start + num_new_tokens
    if end < last:
        end = end // bs * bs
    next_block_boundary = (start // bs + 1) * bs
    stops = (
        next_block_boundary if start % bs != 0 and next_block_boundary <= last else 0,
        last,
        start + (junction - start) // bs * bs if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)
