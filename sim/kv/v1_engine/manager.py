"""The V1 engine's `KVCacheManager`: prefix-cache lookup, per-step slot allocation, free.

Models `KVCacheManager` (vLLM 0.11.0 `vllm/v1/core/kv_cache_manager.py:L85-396`; for one KV
group 4ac7713 `L67-410` matches, docs/vllm-v1-changes.md) over a `KVCacheCoordinator`, as
upstream: `UnitaryKVCacheCoordinator` for one KV group (full attention, or all layers
sliding-window when `config.sliding_window` is set, spec §6.2-6.4) and
`HybridKVCacheCoordinator` for several (`coordinator.make_coordinator`). Pinned per release by
`config.vllm_pin` (`sim.kv.pins`): the free order of the block pool (`free_order.py`) and the
full-sequence admission count (`admission.py`) differ by release.

There is no admission query. `allocate_slots` counts the blocks a step needs and takes them
with the same arithmetic, and returns None (changing nothing but the sliding-window frees of
step 1) when the free queue is short. Order of one call (spec §6.2, `L193-304 @0.11.0`):

1. `remove_skipped_blocks(req, C)` (SWA frees blocks outside the window; runs even on failure);
2. `need = min(C + hits_tokens + n + lookahead, max_model_len)`;
3. `k = get_num_blocks_to_allocate(req, need, hits)`; if `k > free`: return None;
4. touch the hits, start the table with them, allocate `cdiv(need, bs) - len(table)` blocks;
5. with caching, cache the blocks filled by `min(C + hits_tokens + n, num_tokens)` tokens.

Worked example (spec vector 6: 11 blocks, bs=16, W=16, no caching)::

    A: allocate_slots(A, 112)          -> blocks 1..7, free 3
    B: allocate_slots(B, 64)           -> None (4 > 3)
    B: allocate_slots(B, 32)           -> [8, 9], free 1
    B (C=32): allocate_slots(B, 32)    -> frees block 8 (outside the window) to the tail
                                          of the queue [10], then takes [10, 8]; free 0
    A (C=112, 113 tokens): allocate_slots(A, 1) -> frees 6 blocks, takes 1; A holds 2

Flat block ids at the API: with several groups, `get_computed_blocks`, `get_block_ids` and the
ids `allocate_slots` returns list group 0's blocks, then group 1's, and so on (upstream returns
`KVCacheBlocks`, one list per group). The request is a `Sequence`: its id is `seq_id`, its
length `num_tokens`, and C is `num_computed_tokens`, which the scheduler advances.

Left out versus upstream (`vllm/v1/core/kv_cache_manager.py (0.11.0)`): EAGLE's dropped last
hit block (`use_eagle`), decode context parallel (`dcp_world_size`), prefix-cache stats
(`make_prefix_cache_stats`, L142-152), `reset_prefix_cache` (L316-330), cascade attention's
`get_num_common_prefix_blocks` (L332-373) and `create_empty_block_list`; events go to a
`KVEventSink` instead of `take_events` (L375-381). Block hashes carry no extra keys
(multi-modal inputs, LoRA, cache salt: `kv_cache_utils.generate_block_hash_extra_keys`).
"""

from __future__ import annotations

from typing import Any

from sim.kv.config import Design, KVCacheConfig
from sim.kv.pins import V1_BASELINE, AdmissionCap, VllmPin, manager_pin
from sim.kv.types import Sequence, cdiv
from sim.kv.v1_engine.admission import num_blocks_to_admit
from sim.kv.v1_engine.block_pool import BlockPool
from sim.kv.v1_engine.chunked_local import ChunkedLocalAttentionManager
from sim.kv.v1_engine.coordinator import (
    GroupBlocks,
    KVCacheCoordinator,
    UnitaryKVCacheCoordinator,
)
from sim.kv.v1_engine.decode_shortcuts import DecodeShortcuts
from sim.kv.v1_engine.free_order import free_order_for
from sim.kv.v1_engine.full_variants import SinkFullAttentionManager
from sim.kv.v1_engine.hybrid_coordinator import HybridKVCacheCoordinator
from sim.kv.v1_engine.mamba_checkpoint import AlignCheckpoints
from sim.kv.v1_engine.pool_queries import PoolQueries
from sim.kv.v1_engine.single_type import SingleTypeManager, SlidingWindowManager
from sim.kv.v1_engine.sliding_retention import SparseWindowRetention


def _check_mamba_config(config: KVCacheConfig, pin: VllmPin) -> None:
    """The one-line refusals of a Mamba group kvsim does not model (`sim.kv.v1_engine.mamba`):
    a release whose `MambaManager` was not read, prefix caching where kvsim does not model
    the "align" mode (0.11.0 silently turns caching off for Mamba models, `model_executor/models/config.py:L290-297 @0.11.0`), and, caching
    off, no max_model_len (the group's block size).

    kvsim's own (no upstream counterpart).
    """
    if not pin.models_mamba_groups:
        raise ValueError(
            "kv_cache_groups: Mamba groups are modelled from vLLM 0.11.0 on; "
            f"pin one (this manager follows {pin.words})"
        )
    if config.enable_prefix_caching:
        if not pin.models_mamba_align:
            raise ValueError(
                "enable_prefix_caching: prefix caching over a Mamba group (vLLM's "
                "mamba_cache_mode 'align') is modelled on vLLM 0.19.1 to 0.33.0, not "
                f"{pin.words}; turn it off"
            )
        if config.prefix_cache_retention_interval is not None and not (
            pin.mamba_align_has_checkpoints and config.mamba_cache_mode in (None, "align")
        ):
            raise ValueError(
                "prefix_cache_retention_interval: sparse retention of a Mamba group is "
                "modelled in mode 'align' on vLLM 0.33.0 only; leave it None"
            )
        if config.mamba_cache_mode == "all" and not pin.has_mamba_mode_all:
            raise ValueError(
                f"mamba_cache_mode: {pin.words} has no 'all' mode (0.19.1-0.26.0 do); use 'align'"
            )
        return  # "align": the Mamba block size is the attention block size
    if config.max_model_len is None:
        raise ValueError("max_model_len: a Mamba group's block size is max_model_len; set it")


def _check_full_variant_config(config: KVCacheConfig, pin: VllmPin) -> None:
    """The one-line refusals of a sink, R-SWA or circular-buffer group kvsim does not model
    (`sim.kv.v1_engine.full_variants`): a release without that manager.

    kvsim's own (no upstream counterpart).
    """
    for group in config.kv_cache_groups:
        if group.sink_len is not None and pin.sink_manager_fails_to_build:
            raise ValueError(
                f"kv_cache_groups: {pin.words} cannot start a model with a '{group.kind}' "
                "group: its SinkFullAttentionManager raises TypeError when built (it takes "
                "fewer keywords than the coordinator passes; vllm PR #44951); pin 0.19.1 or "
                "0.20.0"
            )
        if group.sink_len is not None and not pin.models_sink_groups:
            release = "from vLLM 0.19.1 on"
        elif group.rswa_window is not None and not pin.models_rswa_groups:
            release = "from vLLM 0.25.1 on"
        elif group.circular_buffer and not pin.models_circular_buffer_groups:
            release = "on vLLM 0.33.0 only"
        else:
            continue
        raise ValueError(
            f"kv_cache_groups: {pin.words} has no '{group.kind}' group (its manager exists "
            f"{release}); pin a release that has it"
        )
    # Prefix caching: every release that builds one of these groups caches over it
    # (`sim.kv.v1_engine.variant_caching`, which refuses the layouts kvsim leaves out).


class KVCacheManager(DecodeShortcuts, PoolQueries):
    """vLLM's V1-engine KV cache manager over one coordinator (see module docstring).

    `KVCacheManager(config)` builds the unitary coordinator and refuses several groups;
    `make_kv_cache_manager` (or `KVCacheManager.hybrid`) builds the hybrid one.
    """

    def __init__(self, config: KVCacheConfig, *, hybrid: bool = False) -> None:
        if config.max_model_len is not None and config.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {config.max_model_len}")
        if config.kv_cache_groups and not hybrid:
            raise ValueError("KV-cache groups given: build with make_kv_cache_manager")
        if hybrid and config.sliding_window is not None:
            raise ValueError("a hybrid config sets each group's window, not sliding_window")
        self.config = config
        self.block_size = config.block_size
        #: The V1 engine has no watermark (spec §6.1).
        self.watermark_blocks = 0
        self.enable_caching = config.enable_prefix_caching
        self.max_model_len = config.max_model_len
        self.sliding_window = config.sliding_window
        #: The pinned vLLM code (`sim.kv.pins`); None in the config is 4ac7713.
        self.pin = manager_pin(Design.V1_ENGINE, config.vllm_pin)
        if (
            config.prefix_cache_retention_interval is not None
            and not self.pin.has_prefix_cache_retention
        ):
            raise ValueError(
                f"prefix_cache_retention_interval: {self.pin.words} has no such setting "
                "(sparse retention is vLLM 0.33.0's); leave it None"
            )
        self._frees_on_processed_basis = self.pin.frees_on_processed_basis
        self._drops_out_of_window_hits = self.pin.drops_out_of_window_hits
        #: 0.20.0: each sliding group's cap inside `allocate_slots`' own count, on the token
        #: budget the manager was built with (None: max_model_len); None: no cap in that count.
        self._count_cap_tokens: int | None = None
        if self.pin.admission_cap is AdmissionCap.EVERY_COUNT:
            self._count_cap_tokens = config.max_num_batched_tokens or config.max_model_len
        self.block_pool = BlockPool(
            config.num_gpu_blocks, self.enable_caching, free_order_for(self.pin)
        )
        only_reachable = self.pin.caches_only_reachable_window_blocks
        self.coordinator: KVCacheCoordinator[Any]
        #: The hybrid coordinator (None with one group): "align" Mamba groups need its
        #: main-model token counts and `new_step_starts`.
        self._hybrid: HybridKVCacheCoordinator | None = None
        if hybrid:
            if config.has_mamba_group:
                _check_mamba_config(config, self.pin)
            if config.has_full_variant_group:
                _check_full_variant_config(config, self.pin)
            mamba_cache_mode = "none"
            if config.has_mamba_group and self.enable_caching:
                mamba_cache_mode = config.mamba_cache_mode or "align"
            self._hybrid = HybridKVCacheCoordinator(
                self.block_pool,
                self.block_size,
                config.kv_cache_groups,
                only_reachable_cached=only_reachable,
                # A Mamba group's block is max_model_len tokens with caching off, the
                # attention block size with caching on (`mamba`).
                mamba_block_size=(
                    config.max_model_len if mamba_cache_mode == "none" else self.block_size
                ),
                mamba_cache_mode=mamba_cache_mode,
            )
            for mamba in self._hybrid.align_mamba_managers:
                mamba.tolerates_longer_table = self.pin.mamba_align_tolerates_longer_table
                if self.pin.mamba_align_has_checkpoints:
                    mamba.checkpoints = AlignCheckpoints(
                        self.block_size,
                        config.mamba_prefill_checkpoint_blocks,
                        sparse=config.prefix_cache_retention_interval == 0,
                    )
            self.coordinator = self._hybrid
        else:
            self.coordinator = UnitaryKVCacheCoordinator(
                self.block_pool,
                self.block_size,
                config.sliding_window,
                only_reachable_cached=only_reachable,
            )
        if config.has_chunked_local_group and self.pin is V1_BASELINE:
            raise ValueError(
                "chunked-local KV-cache groups are modelled from vLLM 0.11.0 on; "
                f"pin one (this manager follows {self.pin.words})"
            )
        for manager in self.coordinator.managers:
            if isinstance(manager, SinkFullAttentionManager) and self.pin.reserves_sink_blocks:
                # In group order, right after the groups are built, as upstream's
                # constructors take them (`full_variants`).
                manager.reserve_sink_blocks()
            if isinstance(manager, SlidingWindowManager):
                manager.clamps_skipped_to_table = self.pin.clamps_skipped_to_table
                if config.prefix_cache_retention_interval == 0 and self.enable_caching:
                    manager.retention = SparseWindowRetention(
                        self.block_size, cdiv(manager.sliding_window - 1, self.block_size)
                    )
            elif isinstance(manager, ChunkedLocalAttentionManager):
                manager.keeps_last_cached_block = not self.pin.clamps_skipped_to_table
        #: KV-cache groups (one block table per group per request).
        self.num_kv_cache_groups = len(self.coordinator.managers)
        # For the sliding-window footprint bound and the decode shortcuts: the C of the last
        # remove_skipped_blocks call and the largest slot count ever allocated, per request
        # holding blocks.
        self._req_to_skip_tokens: dict[int, int] = {}
        self._req_to_max_need_tokens: dict[int, int] = {}

    @classmethod
    def hybrid(cls, config: KVCacheConfig) -> KVCacheManager:
        """The manager over `HybridKVCacheCoordinator` (two or more groups in the config).

        kvsim's own (no upstream counterpart).
        """
        return cls(config, hybrid=True)

    @property
    def single_type_manager(self) -> SingleTypeManager:
        """Group 0's manager (the only one with one group).

        kvsim's own (no upstream counterpart).
        """
        return self.coordinator.managers[0]

    @property
    def req_to_block_hashes(self) -> dict[int, Any]:
        """Per request, its block hashes as the coordinator keeps them (one chain for one
        group, one key list per group for several).

        kvsim's own (no upstream counterpart).
        """
        return self.coordinator.req_to_block_hashes

    # ------------------------------------------------------------------------------ V1 API
    def get_computed_blocks(self, request: Sequence) -> tuple[list[int], int]:
        """Prefix-cache hit as (block ids, computed tokens); ([], 0) with caching off.

        The last token is always recomputed (its logits are needed), so the hit covers at most
        `num_tokens - 1` tokens; hits are whole blocks, so a fully cached 64-token prompt
        (bs=16) hits 3 blocks and recomputes the 4th (`L154-191 @0.11.0`). Sliding-window hits
        may start with null blocks (id 0).

        Upstream: `vllm/v1/core/kv_cache_manager.py:L154-191 (0.11.0)`.
        """
        if not self.enable_caching:
            return [], 0
        hits, num_hit_tokens = self.coordinator.find_longest_cache_hit(
            request, request.num_tokens - 1
        )
        return [block.block_id for group_hits in hits for block in group_hits], num_hit_tokens

    def allocate_slots(
        self,
        request: Sequence,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_block_ids: list[int] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Give the request slots for this step; the new block ids, or None if the pool is short.

        Example (bs=16, 11 blocks, full attention): a fresh 112-token request takes blocks
        1..7 (`cdiv(112, 16) = 7`), leaving 3 free; another asking for 64 tokens then needs 4
        and gets None, with nothing changed.

        Upstream: `vllm/v1/core/kv_cache_manager.py:L193-304 (0.11.0)`.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be greater than 0, got {num_new_tokens}")
        if num_new_computed_tokens < 0 or num_lookahead_tokens < 0:
            raise ValueError("num_new_computed_tokens and num_lookahead_tokens must be >= 0")
        coordinator = self.coordinator
        # Only a new request's first call can bring prefix hits.
        if new_computed_block_ids or num_new_computed_tokens:
            hits = self._resolve_hits(new_computed_block_ids or [], num_new_computed_tokens)
            if self._drops_out_of_window_hits:
                hits = self._without_out_of_window_hits(
                    hits, request.num_computed_tokens + num_new_computed_tokens
                )
        else:
            hits = coordinator.no_hits
        request_id = request.seq_id
        num_skip_tokens = request.num_computed_tokens
        if self._frees_on_processed_basis and request.num_in_flight_tokens:
            # 0.33.0 L558-568: below the processed tokens only (async scheduling's in-flight
            # steps still read their window); never in flight in a synchronous engine.
            num_skip_tokens = max(0, num_skip_tokens - request.num_in_flight_tokens)

        # Step 1: free out-of-window blocks first, so fewer cached blocks get evicted; this
        # stands even when the step then fails (`L247-254 @0.11.0`).
        # The prompt length: an R-SWA group frees the gap after it (0.25.1 on, `full_variants`).
        coordinator.remove_skipped_blocks(request_id, num_skip_tokens, request.prompt_len)
        self._req_to_skip_tokens[request_id] = num_skip_tokens

        # Steps 2-4: count and check with the arithmetic the allocation then uses.
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens + num_lookahead_tokens
        if self.max_model_len is not None and num_tokens_need_slot > self.max_model_len:
            num_tokens_need_slot = self.max_model_len
        hybrid = self._hybrid
        # "align" Mamba groups count the main model's tokens: no lookahead, not capped at
        # max_model_len (`num_tokens_main_model`, `kv_cache_manager.py:L361 @0.19.1`).
        num_tokens_main_model = None
        if hybrid is not None and hybrid.align_mamba_managers:
            computed = num_computed_tokens
            if self.max_model_len is not None and computed > self.max_model_len:
                computed = self.max_model_len
            num_tokens_main_model = computed + num_new_tokens
        if self._count_cap_tokens is not None:
            num_blocks_to_allocate = self._capped_count(
                request,
                num_tokens_need_slot,
                hits,
                num_computed_tokens,
                self._count_cap_tokens,
                num_tokens_main_model,
            )
        elif num_tokens_main_model is not None and hybrid is not None:
            num_blocks_to_allocate = hybrid.get_num_blocks_to_allocate(
                request_id,
                num_tokens_need_slot,
                hits,
                num_tokens_main_model,
                query_start=num_computed_tokens,
                prefill_end=max(request.prompt_len, request.num_tokens - 1),
            )
        else:
            num_blocks_to_allocate = coordinator.get_num_blocks_to_allocate(
                request_id, num_tokens_need_slot, hits
            )
        if num_blocks_to_allocate > len(self.block_pool.free_block_queue):
            return None
        if hits[0] or any(hits):  # a circular buffer's share is empty (`variant_caching`)
            coordinator.touch(hits)
        coordinator.save_new_computed_blocks(request_id, hits)
        if num_tokens_main_model is not None and hybrid is not None:
            new_block_ids = hybrid.allocate_new_block_ids(
                request_id, num_tokens_need_slot, num_tokens_main_model
            )
        else:
            new_block_ids = coordinator.allocate_new_block_ids(request_id, num_tokens_need_slot)
        if num_tokens_need_slot > self._req_to_max_need_tokens.get(request_id, 0):
            self._req_to_max_need_tokens[request_id] = num_tokens_need_slot

        # Step 5: cache blocks that this step's scheduled tokens fill, but never lookahead
        # (draft) slots: the cap at num_tokens keeps unfinalised tokens out of the cache.
        if self.enable_caching:
            coordinator.cache_blocks(
                request, min(num_computed_tokens + num_new_tokens, request.num_tokens)
            )
        return new_block_ids

    def _without_out_of_window_hits(
        self, hits: GroupBlocks, num_computed_tokens: int
    ) -> GroupBlocks:
        """Hits before each sliding or chunked-local group's window as nulls (0.19.1 on,
        `VllmPin.drops_out_of_window_hits`): neither touched nor counted nor held. Example
        (bs=16, W=1, a 32-token hit [null, b]): both blocks fall before the window, so the
        table starts [null, null] and b stays free.

        kvsim's own (no upstream counterpart).
        """
        null = self.block_pool.null_block
        out = []
        for manager, group_hits in zip(self.coordinator.managers, hits, strict=True):
            num_skipped = manager.num_skipped_tokens(num_computed_tokens) // self.block_size
            if num_skipped and any(not block.is_null for block in group_hits[:num_skipped]):
                kept = group_hits[num_skipped:]
                group_hits = [null] * (len(group_hits) - len(kept)) + kept
            out.append(group_hits)
        return tuple(out)

    def _resolve_hits(self, block_ids: list[int], num_new_computed_tokens: int) -> GroupBlocks:
        """The hit blocks of a flat id list, per group; checked against the token count."""
        if block_ids and not self.enable_caching:
            raise ValueError("new_computed_block_ids given but prefix caching is disabled")
        num_gpu_blocks = self.block_pool.num_gpu_blocks
        for block_id in block_ids:
            if not 0 <= block_id < num_gpu_blocks:
                raise ValueError(f"hit block id {block_id} outside 0..{num_gpu_blocks - 1}")
        blocks = [self.block_pool.block(block_id) for block_id in block_ids]
        return self.coordinator.split_hits(blocks, num_new_computed_tokens)

    def num_blocks_to_admit(
        self,
        request: Sequence,
        new_computed_block_ids: list[int],
        max_in_flight_tokens: int | None,
    ) -> int:
        """The full-sequence count for a waiting request (0.19.1 on,
        `sim.kv.v1_engine.admission`), summed over groups as `get_num_blocks_to_allocate`
        sums them; `max_in_flight_tokens` is what the sliding-window cap counts (None: no
        cap, 0.19.1). A pure query. Example (bs=16, one group, no hits): a 200-token prompt
        needs 13.

        kvsim's own (no upstream counterpart).
        """
        num_tokens = request.num_tokens
        if self.max_model_len is not None:
            num_tokens = min(num_tokens, self.max_model_len)
        # The groups that take a share of a hit (not a circular buffer: `variant_caching`).
        num_groups = self.num_kv_cache_groups
        if self._hybrid is not None:
            num_groups -= len(self._hybrid.uncached_group_ids)
        num_hit_tokens = len(new_computed_block_ids) // num_groups * self.block_size
        hits = self._resolve_hits(new_computed_block_ids, num_hit_tokens)
        num_computed = request.num_computed_tokens + num_hit_tokens
        return self._capped_count(request, num_tokens, hits, num_computed, max_in_flight_tokens)

    def _capped_count(
        self,
        request: Sequence,
        num_tokens: int,
        hits: GroupBlocks,
        num_computed_tokens: int,
        cap_tokens: int | None,
        num_tokens_main_model: int | None = None,
    ) -> int:
        """`get_num_blocks_to_allocate` with each sliding group capped on `cap_tokens`
        (0.20.0 `single_type_kv_cache_manager.py:L88-166`, 0.33.0 `L176-262`): the
        full-sequence check's count, and 0.20.0's count in every `allocate_slots` (where a
        running request past the cap counts 0 though its table still grows, vllm #45856).

        kvsim's own (no upstream counterpart).
        """
        total = 0
        for manager, group_hits in zip(self.coordinator.managers, hits, strict=True):
            cap = None
            if cap_tokens is not None:
                cap = manager.admission_cap_blocks(cap_tokens, self.max_model_len)
            total += num_blocks_to_admit(
                manager,
                request.seq_id,
                num_tokens,
                group_hits,
                num_computed_tokens,
                cap,
                num_tokens_main_model,
            )
        return total

    @property
    def mamba_align_block_size(self) -> int | None:
        """The block size prefill chunks align to with Mamba prefix caching ("align" mode;
        the attention block size, `sim.scheduler.v1.mamba_align`); None otherwise.

        kvsim's own (no upstream counterpart).
        """
        if self._hybrid is None or not self._hybrid.align_mamba_managers:
            return None
        return self.block_size

    @property
    def mamba_prefill_checkpoint_blocks(self) -> int:
        """0.33.0 "align": whether the Mamba groups have a prefill checkpoint block (1) or
        not (0), which the scheduler's split reads (`sim.kv.v1_engine.mamba_checkpoint`).

        kvsim's own (no upstream counterpart).
        """
        if self._hybrid is None or not self._hybrid.align_mamba_managers:
            return 0
        return self.config.mamba_prefill_checkpoint_blocks

    @property
    def num_uncached_common_prefix_tokens(self) -> int:
        """The last prefix lookup's full-attention hit less its final hit, in tokens (0.25.1
        `kv_cache_coordinator.py:L737`; 0 without an "align" Mamba group).

        kvsim's own (no upstream counterpart).
        """
        return 0 if self._hybrid is None else self._hybrid.num_uncached_common_prefix_tokens

    def new_step_starts(self) -> None:
        """The scheduler's call at the start of every step: "align" Mamba groups forget the
        blocks cached last step (a no-op otherwise).

        Upstream `KVCacheManager.new_step_starts`:
        `vllm/v1/core/kv_cache_manager.py:L550-552 (0.19.1)`.
        """
        if self._hybrid is not None:
            self._hybrid.new_step_starts()

    def cache_blocks(self, request: Sequence, num_computed_tokens: int) -> None:
        """Cache the blocks `num_computed_tokens` tokens fill, with caching on (the async
        scheduler's call once a step's output is applied). Example (bs=16): 35 tokens cache
        blocks 0 and 1.

        Upstream: `vllm/v1/core/kv_cache_manager.py:L391-394 (0.11.0)`.
        """
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def free(self, request: Sequence) -> None:
        """Free every group's table (group-id order, each in reverse so its tail is evicted
        first, `L306-314 @0.11.0`) and the request's counters.

        The request's block hashes are dropped too (upstream keeps them across preemption
        and drops them in `free_block_hashes` at finish); they are a pure function of the
        token content, so recomputing them later yields the same values.

        Upstream: `vllm/v1/core/kv_cache_manager.py:L306-314 (0.11.0)`.
        """
        request_id = request.seq_id
        self.coordinator.free(request_id)
        self.coordinator.free_block_hashes(request_id)
        self._req_to_skip_tokens.pop(request_id, None)
        self._req_to_max_need_tokens.pop(request_id, None)

    def free_block_hashes(self, request: Sequence) -> None:
        """Drop `request_id`'s block hashes (it has finished).

        kvsim's own (no upstream counterpart).
        """
        self.coordinator.free_block_hashes(request.seq_id)

    # ---------------------------------------------------------------------- introspection
    def group_block_ids(self, request_id: int) -> tuple[list[int], ...]:
        """The request's table in each group (null entries are block 0).

        kvsim's own (no upstream counterpart).
        """
        return tuple(
            [block.block_id for block in table] for table in self.coordinator.get_blocks(request_id)
        )

    def block_id_at(self, request_id: int, group: int, index: int) -> int | None:
        """The block at `index` of the request's table in `group`; None for the null block or
        past the table's end (the auditor's in-flight read check, `sim.audit.in_flight`).

        kvsim's own (no upstream counterpart).
        """
        table = self.coordinator.managers[group].req_to_blocks.get(request_id)
        if table is None or index >= len(table) or table[index].is_null:
            return None
        return table[index].block_id

    def get_block_ids(self, request_id: int) -> list[int]:
        """Upstream: `vllm/v1/core/kv_cache_manager.py:L387-389 (0.11.0)`."""
        return [block_id for table in self.group_block_ids(request_id) for block_id in table]

    def seq_block_ids(self, seq_id: int) -> list[int]:
        """`get_block_ids` of `seq` as one flat list (group 0 first).

        kvsim's own (no upstream counterpart).
        """
        return self.get_block_ids(seq_id)

    def num_seq_blocks(self, seq_id: int) -> int:
        """Non-null blocks in the request's tables: each table's length less its leading
        nulls (`SingleTypeManager.num_leading_null_blocks`, a kept count).

        kvsim's own (no upstream counterpart).
        """
        return self.coordinator.num_seq_blocks(seq_id)

    def group_num_held_blocks(self) -> list[int]:
        """Non-null blocks in each group's live tables (a prefix-shared block counts once per
        group that holds it, however many requests share it).

        kvsim's own (no upstream counterpart).
        """
        counts = []
        for manager in self.coordinator.managers:
            held: set[int] = set()
            for table in manager.req_to_blocks.values():
                held.update(block.block_id for block in table if not block.is_null)
            counts.append(len(held))
        return counts

    def group_peak_held_blocks(self) -> list[int]:
        """The most blocks each group's tables ever held at once (the summary's per-group
        block counts).

        kvsim's own (no upstream counterpart).
        """
        return self.coordinator.group_peak_held_blocks()

    def recover_leaked_blocks(self) -> int:
        """Never leaks: a failed `allocate_slots` takes nothing.

        kvsim's own (no upstream counterpart).
        """
        return 0
