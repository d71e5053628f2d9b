"""The V1 manager's side of the decode fast path (`sim.kv.protocol.DecodeFastPath`) and the
sliding-window footprint bound: kvsim's queries, no upstream counterpart.

A one-token decode `allocate_slots(request, 1)` changes nothing but two per-request counters
until the first *touch point* of any KV-cache group: a new block (every group's table has the
same length), a block filling up with caching on, or, per sliding group, a block leaving its
window. The scheduler skips the quiet calls (`decode_touch_len`) and replays their counters
before the next real one (`sync_decode`); tests/scheduler/test_decode_fast_path.py and
tests/kv/test_kv_v1_hybrid.py prove the skipped calls would have changed nothing.

The counters (kept by `KVCacheManager.allocate_slots`): ``_req_to_skip_tokens`` is the C of
the last `remove_skipped_blocks` call, ``_req_to_max_need_tokens`` the largest slot count T
ever allocated.
"""

from __future__ import annotations

from typing import Any

from mypy_extensions import trait

from sim.kv.types import Sequence
from sim.kv.v1_engine.coordinator import KVCacheCoordinator


@trait  # a mixin of KVCacheManager: mypyc compiles mixins as traits
class DecodeShortcuts:
    """`decode_touch_len`, `sync_decode` and `max_seq_footprint` over the manager's state."""

    coordinator: KVCacheCoordinator[Any]
    block_size: int
    enable_caching: bool
    max_model_len: int | None
    num_kv_cache_groups: int
    _req_to_skip_tokens: dict[int, int]
    _req_to_max_need_tokens: dict[int, int]

    def decode_touch_len(self, request: Sequence) -> int | None:
        """The first decode length X (``C = X - 1``) at which `allocate_slots(request, 1)` may
        change anything; below it the call returns [] and changes nothing but the per-request
        counters that `sync_decode` replays.

        Touch points: ``len(table) * bs + 1`` (a new block); per sliding group, the first X
        whose first useful block ``(X - W) // bs`` passes the leading null entries (a free);
        with caching, ``(num_cached + 1) * bs`` (a block fills and is cached). The smallest
        over groups (`KVCacheCoordinator.table_touch_len`).

        Example (bs=16, W=24, no caching): after the decode at X=113 the table has 8 entries,
        0..4 null. Candidates 8*16 + 1 = 129 and (5 + 1)*16 + 24 = 120: decodes 114..119 are
        quiet, 120 is returned (block 5 leaves the window). None when the request holds no
        table or used lookahead slots.

        kvsim's own (no upstream counterpart).
        """
        request_id = request.seq_id
        max_need_tokens = self._req_to_max_need_tokens.get(request_id)
        if max_need_tokens is None:
            return None
        coordinator = self.coordinator
        touch_len = coordinator.table_touch_len(request_id)
        if touch_len is None:
            return None
        num_tokens = request.content.num_tokens
        if max_need_tokens > num_tokens:
            return None  # lookahead slots: not a plain decode
        if self.enable_caching:
            bs = self.block_size
            num_cached = coordinator.num_cached_blocks(request_id)
            num_hashed = coordinator.num_hashed_blocks(request_id)
            if num_hashed is None or num_hashed < num_cached or num_cached * bs > num_tokens:
                return num_tokens
            cache_touch_len = (num_cached + 1) * bs
            if cache_touch_len < touch_len:
                touch_len = cache_touch_len
        return touch_len if touch_len > num_tokens else num_tokens

    def sync_decode(self, request: Sequence) -> None:
        """Replay the per-request counters of skipped quiet one-token steps.

        A quiet step at C computed tokens sets the skip mark to C and the largest slot count to
        ``min(C + 1, max_model_len)``; nothing else. The last real call covered ``T`` slots
        (its largest slot count) and the scheduler advanced C to T; each skipped step advanced
        C by one more. So with C now above T, the last skipped step ran at ``C - 1``.
        Example (bs=16): last call at X=21 (T=21, skip 20), decodes 22..25 skipped, sync at
        L=26 (C=25) -> T=25, skip 24. A no-op when ``C <= T`` (nothing was skipped, e.g.
        between prefill chunks or after a failed call).

        kvsim's own (no upstream counterpart).
        """
        request_id = request.seq_id
        max_need_tokens = self._req_to_max_need_tokens.get(request_id)
        num_computed_tokens = request.num_computed_tokens
        if max_need_tokens is None or num_computed_tokens <= max_need_tokens:
            return
        # T = max(T, min(C, max_model_len)), with conditionals rather than builtin calls (hot).
        need_tokens = num_computed_tokens
        if self.max_model_len is not None and self.max_model_len < need_tokens:
            need_tokens = self.max_model_len
        if need_tokens > max_need_tokens:
            self._req_to_max_need_tokens[request_id] = need_tokens
        self._req_to_skip_tokens[request_id] = num_computed_tokens - 1

    def max_seq_footprint(self, seq: Sequence) -> int | None:
        """The per-step live-block bound of spec §6.3; None without a sliding or chunked-local
        group.

        Per group ``cdiv(T, bs)``, less ``floor(max(0, C - W + 1) / bs)`` for a sliding group,
        where C is the `num_computed_tokens` of the request's last `allocate_slots` call (what
        `remove_skipped_blocks` used) and T the largest slot count it was ever given (each
        table's length in blocks is `cdiv(T, bs)`, bs the group's own: 1 for a Mamba group). Exact after a step without prefix hits
        (hits' null padding makes it loose). In decode (T = C + 1) a sliding group's share
        never exceeds `cdiv(W - 1, bs) + 1`; e.g. bs=16, W=24, C=112: cdiv(113, 16) -
        floor(89 / 16) = 3, and with a full group as well 8 + 3 = 11. A request that holds
        nothing gets 0.

        kvsim's own (no upstream counterpart).
        """
        coordinator = self.coordinator
        if not coordinator.has_skipping_group:
            return None
        request_id = seq.seq_id
        need_tokens = self._req_to_max_need_tokens.get(request_id)
        if need_tokens is None:
            return 0
        num_skip_tokens = self._req_to_skip_tokens[request_id]
        footprint = 0
        for manager in coordinator.managers:
            # cdiv(T, bs) entries at the group's own block size (a Mamba group's is
            # max_model_len: one), less the floor(skipped / bs) blocks that left what this
            # group reads (sliding: C - W + 1; chunked-local: C // A * A; full, Mamba: none).
            # (R-SWA: less its gap; a circular buffer: one block).
            footprint += manager.num_required_blocks(need_tokens)
            footprint -= manager.num_freed_blocks_of(request_id, num_skip_tokens)
        return footprint if footprint > 0 else 0
