"""vLLM's real V1-engine `KVCacheManager` (vLLM 0.10+) behind kvsim's `V1KVCacheManager` API.

Each kvsim `Sequence` gets one real `vllm.v1.request.Request` (request_id = str(seq_id)) whose
prompt is ``seq.content.token_ids()``; generated tokens are appended with
`Request.append_output_token_ids`, so the block hashes come from vLLM's own hasher
(`get_request_block_hasher` with sha256, the 0.11 default `prefix_caching_hash_algo`). Before
each call the request's `num_computed_tokens` is copied from ours: kvsim's scheduler owns it.

The manager is built over one KV-cache group: `FullAttentionSpec`, or `SlidingWindowSpec` when
`config.sliding_window` is set (an all-SWA model such as Mistral-7B-v0.1), with 1 head of size 1
(page size does not matter to the manager); or over `config.kv_cache_groups` (a hybrid model,
one layer per group), where block ids cross the API flat, group 0's first, as kvsim's
`HybridKVCacheManager` passes them.

Worked example (spec vector 6, bs=16, 11 blocks, no caching)::

    mgr = RealKVCacheManager(KVCacheConfig(11, 16), vllm_version="0.11.0")
    mgr.allocate_slots(A(112 tokens), 112)   # [1..7]; block 0 is the null block; free 3
    mgr.allocate_slots(B(64 tokens), 64)     # None
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sim.errors import InputError
from sim.kv.config import Design, KVCacheConfig
from sim.kv.pins import PINS_BY_DESIGN, V1_BASELINE, VllmPin
from sim.kv.protocol import PoolStats
from sim.kv.types import Sequence, SequenceStatus
from sim.vllm_real.errors import translate_error
from sim.vllm_real.loader import VllmInstall, import_vllm, load_vllm
from sim.vllm_real.v1_real_config import (
    accepted_kwargs,
    real_kv_cache_config,
    real_mamba_cache_mode,
    request_extra_kwargs,
    sha256_fn,
)

#: Used when the config has no max_model_len (the real manager needs an int).
_UNBOUNDED_MODEL_LEN = 1 << 40


class RealKVCacheManager:
    """A real vLLM V1-engine KVCacheManager with kvsim's V1KVCacheManager + PoolIntrospection."""

    def __init__(
        self,
        config: KVCacheConfig,
        *,
        vllm_root: str | Path | None = None,
        vllm_version: str | None = None,
        install: VllmInstall | None = None,
    ) -> None:
        self.install = install or load_vllm(vllm_root, vllm_version)
        if self.install.version_tuple < (0, 10):
            raise InputError(
                f"the V1-engine adapter needs vLLM >= 0.10, got {self.install.version}"
            )

        iface = import_vllm("v1.kv_cache_interface", self.install)
        self._kcu = import_vllm("v1.core.kv_cache_utils", self.install)
        self._req_mod = import_vllm("v1.request", self.install)
        self._sp_mod = import_vllm("sampling_params", self.install)
        mgr_mod = import_vllm("v1.core.kv_cache_manager", self.install)
        self.config = config
        self.block_size = config.block_size
        self.watermark_blocks = 0
        self.num_groups = len(config.group_specs)
        self.real = self._real_manager(iface, mgr_mod)
        self._kv_blocks_cls = mgr_mod.KVCacheBlocks
        hash_fn = sha256_fn(self.install)
        if not hasattr(self._kcu, "NONE_HASH"):
            # vLLM's engine does this once at startup; the seed is process-wide.
            self._kcu.init_none_hash(hash_fn)
        self._hasher = self._kcu.get_request_block_hasher(config.block_size, hash_fn)
        self._requests: dict[int, Any] = {}
        #: The last lookup's shared-prefix junction (0.33.0's third value of
        #: `get_computed_blocks`, which the scheduler keeps on the request; 0 before).
        self.last_shared_prefix_boundary = 0
        self._last_hit_tokens = 0

    def _real_manager(self, iface: Any, mgr_mod: Any) -> Any:
        """vLLM's `KVCacheManager` over `self.config`'s pool and groups, given the arguments
        the installed release's constructor accepts (`iface` and `mgr_mod`: its
        `v1.kv_cache_interface` and `v1.core.kv_cache_manager` modules)."""
        config = self.config
        kv_config = real_kv_cache_config(
            iface,
            config.block_size,
            config.num_gpu_blocks,
            config.group_specs,
            config.max_model_len,
            mamba_cache_mode=real_mamba_cache_mode(config),
            mamba_prefill_checkpoint_blocks=config.mamba_prefill_checkpoint_blocks,
            prefix_cache_retention_interval=config.prefix_cache_retention_interval,
        )
        # Several block sizes (a Mamba group's is max_model_len): the scheduler's is their
        # lcm, and so is the hash block size with caching off (`resolve_kv_cache_block_sizes`,
        # `vllm/v1/core/kv_cache_utils.py:L816-918 (0.33.0)`).
        scheduler_block_size = math.lcm(
            *(spec.kv_cache_spec.block_size for spec in kv_config.kv_cache_groups)
        )
        # 0.19.1 on take the hash block size, 0.25.1 on the scheduler's too (0.33.0 splits the
        # block size in three: kernel, scheduler, hash); one pool of one block size uses the
        # same for all, as vLLM's unit tests do. 0.20.0 / 0.25.1 build the sliding-window cap
        # from `max_num_batched_tokens` (0.20.0 applies it in every count, `sim.kv.pins`).
        optional = {
            "scheduler_block_size": scheduler_block_size,
            "hash_block_size": scheduler_block_size,
            "max_num_batched_tokens": config.max_num_batched_tokens,
        }
        return mgr_mod.KVCacheManager(
            kv_config,
            max_model_len=config.max_model_len or _UNBOUNDED_MODEL_LEN,
            enable_caching=config.enable_prefix_caching,
            **accepted_kwargs(mgr_mod.KVCacheManager, optional),
        )

    # ------------------------------------------------------------------ kvsim -> vLLM objects
    def _request(self, seq: Sequence):
        req = self._requests.get(seq.seq_id)
        if req is None or req.num_tokens > seq.num_tokens:
            req = self._req_mod.Request(
                request_id=str(seq.seq_id),
                prompt_token_ids=seq.content.token_ids(0, seq.prompt_len),
                sampling_params=self._sp_mod.SamplingParams(max_tokens=1 << 30),
                pooling_params=None,
                arrival_time=0.0,
                block_hasher=self._hasher,
                **request_extra_kwargs(self.install),
            )
            self._requests[seq.seq_id] = req
        if req.num_tokens < seq.num_tokens:
            req.append_output_token_ids(seq.content.token_ids(req.num_tokens, seq.num_tokens))
        req.num_computed_tokens = seq.num_computed_tokens
        if hasattr(req, "num_in_flight_tokens"):
            # 0.33.0 frees sliding-window blocks on the processed basis, C minus the tokens
            # of steps still in flight (async scheduling; 0 in a synchronous engine).
            req.num_in_flight_tokens = seq.num_in_flight_tokens
        if hasattr(req, "shared_prefix_boundary"):
            # 0.33.0: the junction the walk (the scheduler's part) keeps on the request.
            req.shared_prefix_boundary = seq.shared_prefix_boundary
        if seq.status is SequenceStatus.RUNNING:
            req.status = self._req_mod.RequestStatus.RUNNING
        return req

    # ------------------------------------------------------------------ V1KVCacheManager API
    def get_computed_blocks(self, request: Sequence) -> tuple[list[int], int]:
        # 0.33.0 appends a third value (a shared-prefix boundary for sparse groups).
        found = self.real.get_computed_blocks(self._request(request))
        blocks, num_tokens = found[:2]
        self.last_shared_prefix_boundary = found[2] if len(found) > 2 else 0
        self._last_hit_tokens = num_tokens
        return [b.block_id for group in blocks.blocks for b in group], num_tokens

    @property
    def num_uncached_common_prefix_tokens(self) -> int:
        """The last lookup's uncached shared prefix, as kvsim's scheduler reads it from its own
        manager (`sim.scheduler.v1.scheduler._note_shared_prefix`): 0.33.0's junction less the
        hit (`kv_cache_manager.py:L303-328`), 0 without a junction or before 0.33.0.
        Regression: the real adapter had no such attribute, so under kvsim's scheduler vLLM's
        0.33.0 manager never got a junction and cached a sliding window densely where the model
        kept it (fuzz case seed 1956387801: 24 hit tokens in the model, 0 on vLLM)."""
        boundary = self.last_shared_prefix_boundary
        return boundary - self._last_hit_tokens if boundary else 0

    def allocate_slots(
        self,
        request: Sequence,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_block_ids: list[int] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        hits = self._hit_blocks(new_computed_block_ids)
        out = self._call(
            self.real.allocate_slots,
            self._request(request),
            num_new_tokens,
            num_new_computed_tokens=num_new_computed_tokens,
            new_computed_blocks=hits,
            num_lookahead_tokens=num_lookahead_tokens,
        )
        return None if out is None else [b.block_id for group in out.blocks for b in group]

    def new_step_starts(self) -> None:
        """The scheduler's call at the start of every step (0.19.1 on,
        `kv_cache_manager.py:L550-552`; a no-op on releases without it)."""
        step = getattr(self.real, "new_step_starts", None)
        if step is not None:
            self._call(step)

    def cache_blocks(self, request: Sequence, num_computed_tokens: int) -> None:
        """The async scheduler caches a step's blocks once its output is applied
        (`kv_cache_manager.py:L391-394 @0.11.0`, `L791-801 @0.33.0`)."""
        self._call(self.real.cache_blocks, self._request(request), num_computed_tokens)

    def free(self, request: Sequence) -> None:
        self._call(self.real.free, self._request(request))

    @property
    def pin(self) -> VllmPin:
        """The release whose scheduler rules run around this manager (`sim.kv.pins`): the
        install's version when kvsim pins it, else 4ac7713's (the rules kvsim's V1 model was
        written from). Before this property, every install ran 4ac7713's rules, so kvsim's
        scheduler gave 0.33.0's real manager no full-sequence gate (found by
        `kvsim fuzz --vllm-root .vllm/0.33.0` against the model's tables)."""
        for pin in PINS_BY_DESIGN[Design.V1_ENGINE]:
            if pin.value == self.install.version:
                return pin
        return V1_BASELINE

    def _hit_blocks(self, block_ids: list[int] | None):
        """vLLM's `KVCacheBlocks` for kvsim's flat hit ids (equal shares per group, in order;
        none for a circular buffer, which takes no part in a hit: `variant_caching`)."""
        if not block_ids:
            return None
        pool = self.real.block_pool.blocks
        takes = [not g.circular_buffer for g in self.config.group_specs]
        share = len(block_ids) // sum(takes)
        per_group, start = [], 0
        for takes_hits in takes:
            per_group.append([pool[i] for i in block_ids[start : start + share * takes_hits]])
            start += share * takes_hits
        return self._kv_blocks_cls(tuple(per_group))

    def num_blocks_to_admit(
        self,
        request: Sequence,
        new_computed_block_ids: list[int],
        max_in_flight_tokens: int | None,
    ) -> int:
        """The real full-sequence count (0.19.1 `can_fit_full_sequence`, `kv_cache_manager.py:
        L218-255`; 0.25.1 on `allocate_slots(full_sequence_must_fit=True)`, 0.33.0
        `L531-547`), without the watermark (default 0) and without allocating. vLLM bakes each
        sliding manager's admission cap in at construction (0.20.0 from the token budget,
        0.26.0 / 0.33.0 from `max_in_flight_tokens`, `single_type_kv_cache_manager.py:
        L2610-2650 @0.33.0`); kvsim's scheduler knows that only once it is built, so the caps
        are set here, from the same spec method, before the count (None: 0.19.1, no cap)."""
        real = self.real
        if max_in_flight_tokens is not None:
            self._set_admission_caps(max_in_flight_tokens)
        req = self._request(request)
        hits = self._hit_blocks(new_computed_block_ids)
        blocks = real.empty_kv_cache_blocks.blocks if hits is None else hits.blocks
        num_hit_tokens = len(blocks[0]) * self.block_size if hits is not None else 0
        num_local = req.num_computed_tokens + num_hit_tokens
        full = min(req.num_tokens, real.max_model_len)
        count = real.coordinator.get_num_blocks_to_allocate
        arguments = {
            "num_encoder_tokens": 0,
            "total_computed_tokens": min(num_local, real.max_model_len),
            "num_local_computed_tokens": num_local,
            "num_tokens_main_model": full,
            "apply_admission_cap": True,
            "prefill_end": max(req.num_prompt_tokens, req.num_tokens - 1),
        }
        return int(
            count(
                request_id=req.request_id,
                num_tokens=full,
                new_computed_blocks=blocks,
                **accepted_kwargs(count, arguments),
            )
        )

    def _set_admission_caps(self, cap_tokens: int) -> None:
        """Each capped manager's `max_admission_blocks_per_request` (0.33.0; private with a
        leading underscore at 0.20.0-0.26.0) from its spec on `cap_tokens`."""
        real = self.real
        for manager in real.coordinator.single_type_managers:
            spec_cap = getattr(manager.kv_cache_spec, "max_admission_blocks_per_request", None)
            if spec_cap is None:
                continue
            for name in ("max_admission_blocks_per_request", "_max_admission_blocks_per_request"):
                if getattr(manager, name, None) is not None:
                    basis = accepted_kwargs(
                        spec_cap,
                        {"max_in_flight_tokens": cap_tokens, "max_num_batched_tokens": cap_tokens},
                    )
                    setattr(manager, name, spec_cap(max_model_len=real.max_model_len, **basis))

    def _call(self, fn, *args, **kwargs):
        """`fn(...)`, with what vLLM's code raised as kvsim's `ManagerError` (`errors`)."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            mapped = translate_error(exc, self.install.root / "vllm")
            if mapped is None or mapped is exc:
                raise
            raise mapped from exc

    def forget(self, request: Sequence) -> None:
        """Drop our real Request for a finished sequence (vLLM drops it from its request map)."""
        self._requests.pop(request.seq_id, None)

    @property
    def num_free_blocks(self) -> int:
        return self.real.block_pool.get_num_free_blocks()

    def get_block_ids(self, request_id: int) -> list[int]:
        return self.seq_block_ids(request_id)

    # ------------------------------------------------------------------ PoolIntrospection
    def block_refcounts(self) -> dict[int, int]:
        """Held blocks' refcounts; the null block reads 1, as in kvsim's pool (vLLM does not
        maintain its ref_cnt, `block_pool.py:L189-192 @0.33.0`, but never frees it)."""
        pool = self.real.block_pool
        counts = {b.block_id: b.ref_cnt for b in pool.blocks if b.ref_cnt > 0}
        counts[pool.null_block.block_id] = 1
        for block in self._sink_blocks():
            counts[block.block_id] = 1  # out of the queue for good, as kvsim's pool holds them
        return counts

    def _sink_blocks(self) -> list[Any]:
        """The blocks 0.19.1 / 0.20.0's sink managers took from the queue at construction
        (refcount 0 upstream, never free: `sim.kv.v1_engine.full_variants`)."""
        return [
            block
            for manager in self.real.coordinator.single_type_managers
            for block in getattr(manager, "sink_blocks", [])
        ]

    @property
    def num_reserved_blocks(self) -> int:
        """The null block and the sink blocks, as kvsim's manager counts them."""
        return 1 + len(self._sink_blocks())

    def pool_stats(self) -> PoolStats:
        free = self.num_free_blocks
        evictable = 0
        if self.config.enable_prefix_caching:
            evictable = sum(
                1
                for b in self.real.block_pool.blocks
                if b.ref_cnt == 0 and b.block_hash is not None
            )
        # The null block (in `block_refcounts` with 1) is never free: it counts as held.
        held = len(self.block_refcounts())
        return PoolStats(self.config.num_gpu_blocks, free, held, evictable)

    def group_block_ids(self, seq_id: int) -> tuple[list[int], ...]:
        return tuple(
            [b.block_id for b in manager.req_to_blocks.get(str(seq_id), [])]
            for manager in self.real.coordinator.single_type_managers
        )

    def seq_block_ids(self, seq_id: int) -> list[int]:
        return [block_id for table in self.group_block_ids(seq_id) for block_id in table]

    def block_id_at(self, seq_id: int, group: int, index: int) -> int | None:
        """As kvsim's manager's (`sim.audit.in_flight`); the null block is vLLM's block 0."""
        table = self.group_block_ids(seq_id)[group]
        if index >= len(table) or table[index] == self.real.block_pool.null_block.block_id:
            return None
        return table[index]

    def num_seq_blocks(self, seq_id: int) -> int:
        return len({b for b in self.seq_block_ids(seq_id) if b != 0})

    def max_seq_footprint(self, seq: Sequence) -> int | None:
        return None

    def recover_leaked_blocks(self) -> int:
        return 0  # allocate_slots checks before it takes: nothing can leak.


def make_real_v1(
    config: KVCacheConfig, vllm_root: str | Path | None = None, vllm_version: str | None = "0.11.0"
) -> RealKVCacheManager:
    """A real V1-engine manager from an install folder or from `.vllm/<version>` (default 0.11.0)."""
    if vllm_root is not None:
        vllm_version = None
    return RealKVCacheManager(config, vllm_root=vllm_root, vllm_version=vllm_version)
