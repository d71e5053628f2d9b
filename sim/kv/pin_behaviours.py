"""What each vLLM pin does differently: `VllmPin`, one property per behaviour that differs
between the code bases a design can be pinned to, read by the model that has the
behaviour (nothing compares a version string). How a scenario names a pin, and which pin a
design gets by default, is `sim.kv.pins`.

v0 (the 0.5.4 wheel, release commit 4db5176 of 2024-08-05, is what `--vllm-root .vllm/0.5.4`
runs and the manager lockstep drives). Upstream main moved on within days (00c3d68 of
2024-08-13, fc93e56 of 2024-08-15; `git diff 4db5176 fc93e56 -- vllm/core`):

==========================  =================================  ==============================
behaviour                   0.5.4 release (4db5176)            00c3d68 / fc93e56
==========================  =================================  ==============================
empty append, full table    IndexError (#7371)                 returns (#7380)
evictor_v2 victim scan      every entry, `update` stays put    stops at a later time (#7193)
prefix-caching touched cnt  cached full block counts 0         counts 1 if in evictor (#6849)
block_manager_v1            --                                 same decisions (refactor only)
==========================  =================================  ==============================

kvsim models the release's evictor and touched count, and the empty append both ways, so
"0.5.4+7380" is the release plus #7380 and nothing else: it is *not* 00c3d68, which also has
#7193 and #6849. BlockSpaceManagerV1 makes the same decisions at the release and at fc93e56,
so v0-v1 has the one pin. v0-fixed's table writes nothing on an empty append (it fixes #7371
itself), so it too has the one pin.

V1 (kvsim's V1 model was written against upstream main at 4ac7713, 2025-07-23, about v0.10.0;
docs/vllm-v1-changes.md has the full diff):

========================  ========  ======  =======  =======  =======  =======
behaviour                 4ac7713,  0.19.1  0.20.0   0.25.1   0.26.0   0.33.0
                          0.11.0
========================  ========  ======  =======  =======  =======  =======
full-sequence gate        --        yes     yes      yes      yes      yes
sliding-window cap        --        --      every    gate     gate     gate
                                            count    only     only     only
cap counts                --        --      budget   budget   2 x b.*  2 x b.*
out-of-window hits        touched   dropped dropped  dropped  dropped  dropped
skipped past the table    raises    clamped clamped  clamped  clamped  clamped
reachable-block caching   --        --      --       yes      yes      yes
free-block reuse          append    append  append   uncached uncached uncached
                                                     first    first    first
frees below               C         C       C        C        C - in-f C - in-f
prompt > budget           skip      stop    stop     stop     stop     stop
PRIORITY victim           keep      refund  refund   refund   refund   refund,
                                    if sch. if sch.  if sch.  if sch.  by index
lone-request threshold    applied   applied applied  applied  applied  ignored
async: empty batch queued no        no      no       yes      yes      yes
async: last step skipped  no        yes     yes      yes      yes      yes
async: in-flight tokens   --        --      --       --       yes      yes
async: stale outputs      --        --      --       --       --       yes
chunked-local free        keeps **  shared  shared   shared   shared   shared
Mamba groups (caching     0.11.0    "none"  "none"   "none"   "none"   "none"
off) ***                  only      mode    mode     mode     mode     mode
Mamba prefix caching      --        align   align    align    align    refused
(mode "align")
sink groups ****          --        blocks  blocks   build    build    build
                                    taken   taken    fails    fails    fails
R-SWA groups ****         --        --      --       yes      yes      yes
circular buffer ****      --        --      --       --       --       yes
========================  ========  ======  =======  =======  =======  =======

(* `max_in_flight_tokens` = max_concurrent_batches x the budget: 2 x under async, else 1 x.
** 0.11.0's `ChunkedLocalAttentionManager` keeps the last cached block at a chunk boundary;
from 0.19.1 it frees through the shared walk-back, clamped at the table
(`sim.kv.v1_engine.chunked_local`). kvsim does not model chunked-local groups at 4ac7713:
a scenario with them is refused there.
*** One block of max_model_len tokens per request per Mamba group (`sim.kv.v1_engine.mamba`);
refused at 4ac7713 (not compared). With prefix caching on 0.19.1-0.26.0 run the "align"
mode (full + Mamba groups, block size the attention one); refused on 0.33.0 (its "align" has
prefill checkpoint blocks, not modelled) and 0.11.0 (which turns caching off for Mamba
models).
**** `sim.kv.v1_engine.full_variants`, caching off; "--": the release has no such manager,
and a scenario with the group is refused on it.)
The properties below cite each release's lines; every column was checked by the manager,
scheduler and async lockstep against that release's wheel (`tests/vllm_real/
test_vllm_2026_pins_lockstep.py`), which found three of the rows (dropped hits, the clamp,
0.25.1's free order). The middle releases' *serve defaults* follow 0.33.0's code
(`sim.scenario.vllm_defaults.RELEASES`), not compared with their own arg_utils.py.

0.11.0 makes the same block and scheduling decisions as 4ac7713 for everything kvsim models
(its changes are in hashing, metrics and bookkeeping); it is a named pin so that a scenario can
say what it runs, and the manager lockstep drives the real 0.11.0 install against it.
"""

from __future__ import annotations

import enum


class VllmPin(enum.Enum):
    """A vLLM code base a design follows: a release on the package index, a release plus one
    PR, or an upstream commit. The value is the name a scenario gives it."""

    #: The vLLM 0.5.4 wheel (release commit 4db5176, 2024-08-05).
    V0_5_4 = "0.5.4"
    #: The 0.5.4 release with PR #7380 (no IndexError on an empty append), nothing else.
    V0_5_4_PR_7380 = "0.5.4+7380"
    #: Upstream main at 4ac7713e (2025-07-23), ~v0.10.0: the baseline of `sim.kv.v1_engine`.
    C4AC7713 = "4ac7713"
    #: vLLM 0.11.0 (2025-10-03).
    V0_11_0 = "0.11.0"
    #: vLLM 0.19.1: the full-sequence admission gate without the sliding-window cap.
    V0_19_1 = "0.19.1"
    #: vLLM 0.20.0: the cap (PR #40946) applied inside every `get_num_blocks_to_allocate`.
    V0_20_0 = "0.20.0"
    #: vLLM 0.25.1, the last release before 0.26.0: the cap in the full-sequence check only.
    V0_25_1 = "0.25.1"
    #: vLLM 0.26.0: in-flight tokens, processed-basis frees, the cap on `max_in_flight_tokens`.
    V0_26_0 = "0.26.0"
    #: vLLM 0.33.0, the latest release on the package index when this was written.
    V0_33_0 = "0.33.0"

    @property
    def words(self) -> str:
        """How reports name it: 'vLLM 0.5.4', 'vLLM 0.5.4 + #7380', 'vLLM ~0.10 @ 4ac7713'."""
        return _WORDS[self]

    # -- v0 behaviours ---------------------------------------------------------------------
    @property
    def empty_append_raises(self) -> bool:
        """Whether an empty append to a full v0-V2 block table raises IndexError (#7371;
        `vllm/core/block/block_table.py:L148-150 (0.5.4)`, fixed upstream by #7380)."""
        return self is VllmPin.V0_5_4

    # -- V1 behaviours ---------------------------------------------------------------------
    @property
    def has_full_sequence_gate(self) -> bool:
        """`scheduler_reserve_full_isl` (default True): 0.19.1 `config/scheduler.py:L139`,
        the check `kv_cache_manager.py:L218-255` (`can_fit_full_sequence`); from 0.25.x it is
        `allocate_slots(full_sequence_must_fit=True)` (0.25.1 `L376-391`, 0.33.0 `L531-547`)."""
        return self in _FULL_SEQUENCE_GATE

    @property
    def admission_cap(self) -> AdmissionCap:
        """Where the sliding-window cap `max_admission_blocks_per_request` applies."""
        return _ADMISSION_CAP.get(self, AdmissionCap.NONE)

    @property
    def caps_on_in_flight_tokens(self) -> bool:
        """The cap counts `max_in_flight_tokens` (max_concurrent_batches x the token budget,
        0.26.0 `kv_cache_interface.py:L567-588`, `config/vllm.py:L525-533`), not the token
        budget alone (0.20.0 `L421-441`, 0.25.1 `L546-566`)."""
        return self in _PROCESSED_BASIS

    def window_bound_tokens(self, token_budget: int, max_concurrent_batches: int) -> int:
        """T of the sliding-window per-request bound `cdiv(min(W - 1 + T, max_model_len), bs)
        + 1`, which startup sizing charges (every V1 pin) and the gate caps at (0.20.0 on):
        the token budget, or from 0.26.0 `max_in_flight_tokens` = max_concurrent_batches x
        the budget. Example: 0.26.0 under async (2 batches), budget 8,192: 16,384."""
        if self.caps_on_in_flight_tokens:
            return max_concurrent_batches * token_budget
        return token_budget

    @property
    def drops_out_of_window_hits(self) -> bool:
        """A new request's prefix hits that fall before its sliding window are neither touched
        nor counted: its table starts with nulls there (0.19.1
        `single_type_kv_cache_manager.py:L177-204`, `allocate_new_computed_blocks`); 0.11.0
        touches every hit and frees the skipped ones after. They differ only where such a hit
        is a real block (W = 1 before 0.25.1's reachable mask: a hit is the last block alone).
        Found by the manager lockstep against 0.19.1."""
        return self in _FULL_SEQUENCE_GATE

    @property
    def models_mamba_groups(self) -> bool:
        """kvsim models Mamba state groups (caching off) on this release: 0.11.0
        (`MambaManager`, `single_type_kv_cache_manager.py:L529-603`), and mode "none" of
        0.19.1 (`L769-1041`), 0.20.0 (`L790-1062`), 0.25.1 (`L1026-1367`), 0.26.0 (`L1227-1686`)
        and 0.33.0 (`L1428-2136`), each lockstep-checked against its wheel
        (tests/vllm_real/test_mamba_lockstep.py); 4ac7713 is not compared with them
        (`sim.kv.v1_engine.mamba`)."""
        return self in _MAMBA_GROUPS

    @property
    def pads_hybrid_groups_to_largest(self) -> bool:
        """The hybrid layout's `group_size` is the largest layer count among the KV-cache specs
        when that is under 1.5x the smallest (gpt-oss + EAGLE: 12 sliding + 13 full -> groups
        of 13), else the smallest: 0.19.1 `kv_cache_utils.py:L1043-1047`, 0.20.0 `L1124-1128`,
        0.25.1 `L1192-1196`, 0.26.0 `L1221-1225`, 0.33.0 `kv_cache_planning.py:L521-532`;
        0.11.0 always takes the smallest (`L977`). `sim.kv.v1_engine.hybrid_layout`."""
        return self in _FULL_SEQUENCE_GATE

    @property
    def chunked_local_hybrid_by_default(self) -> bool:
        """`VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE` defaults to 1 (0.19.1
        `envs.py:L1459-1461`; 0.33.0 `L1931-1933`): a model with chunked-local attention
        (Llama-4) keeps its hybrid groups. 0.11.0 defaults it to 0 (`envs.py:L1389-1391`), so
        `VllmConfig` disables the hybrid manager (`config/__init__.py:L512-529`) and every layer
        becomes full attention in one group (`unify_hybrid_kv_cache_specs`, `L1096-1148`)."""
        return self in _FULL_SEQUENCE_GATE

    @property
    def aligns_mamba_block_to_block_size(self) -> bool:
        """Page-size unification of an attention + Mamba model rounds the attention block up
        to a multiple of max(the backend's smallest kernel block, the current block size)
        (0.20.0 `platforms/interface.py:L577-583`, 0.33.0 `L1068-1075`); 0.11.0
        (`model_executor/models/config.py:L367-368`) and 0.19.1 (`L218`, `L273-275`) to a
        multiple of 16 whatever the block size. `sim.kv.v1_engine.model_layout`."""
        return self in _FULL_SEQUENCE_GATE and self is not VllmPin.V0_19_1

    @property
    def models_mamba_align(self) -> bool:
        """kvsim models the Mamba cache mode "align" (prefix caching over Mamba states) on
        this release: 0.19.1 (`single_type_kv_cache_manager.py:L769-1041`), 0.20.0
        (`L790-1062`), 0.25.1 (`L1026-1367`) and 0.26.0 (`L1227-1686`, whose partial-tail
        copy-on-write needs a prefix-match unit below the block size, refused), each
        lockstep-checked against its wheel (tests/vllm_real/test_mamba_align_lockstep.py),
        and 0.33.0 (`L1428-2136`, with prefill checkpoint blocks and retired-block ranges,
        `mamba_align_has_checkpoints`); 0.11.0 has no Mamba prefix caching
        (`sim.kv.v1_engine.mamba`)."""
        return self in _MAMBA_ALIGN

    @property
    def has_mamba_mode_all(self) -> bool:
        """The Mamba cache mode "all" exists: 0.19.1-0.26.0 (0.33.0's `MambaCacheMode` is
        "none" or "align", `config/cache.py:L176`)."""
        return self in _MAMBA_ALIGN and self is not VllmPin.V0_33_0

    @property
    def mamba_align_has_checkpoints(self) -> bool:
        """ "align" has prefill checkpoint blocks and retired-block ranges: 0.33.0
        (`single_type_kv_cache_manager.py:L1608-1627, L1659-1923`;
        `sim.kv.v1_engine.mamba_checkpoint`)."""
        return self is VllmPin.V0_33_0

    @property
    def has_prefix_cache_retention(self) -> bool:
        """`prefix_cache_retention_interval` exists (0.33.0, `config/cache.py:L275-281`): sparse
        retention of sliding-window and Mamba groups (`sim.kv.v1_engine.sliding_retention`,
        `sim.kv.v1_engine.mamba_checkpoint`)."""
        return self is VllmPin.V0_33_0

    @property
    def mamba_align_tolerates_longer_table(self) -> bool:
        """ "align" `allocate_new_blocks` returns [] when the table is longer than needed
        (0.25.1 on, `L1253-1262 @0.25.1`); 0.19.1 and 0.20.0 assert it is not
        (`L942-949 @0.19.1`)."""
        return self not in (VllmPin.V0_19_1, VllmPin.V0_20_0)

    @property
    def models_sink_groups(self) -> bool:
        """kvsim models `SinkFullAttentionManager` (static sink tokens, caching off) on this
        release: 0.19.1 (`single_type_kv_cache_manager.py:L1091-1112`) and 0.20.0
        (`L1112-1133`), lockstep-checked against their wheels. 0.11.0 has no such manager;
        0.25.1 on cannot build it (`sink_manager_fails_to_build`)
        (`sim.kv.v1_engine.full_variants`)."""
        return self in _SINK_GROUPS

    @property
    def sink_manager_fails_to_build(self) -> bool:
        """`SinkFullAttentionManager.__init__` keeps fixed parameters while the coordinator
        passes every manager more keywords, so building it raises TypeError at startup for any
        sink model: `scheduler_block_size` on 0.25.1 (`kv_cache_coordinator.py:L108-118`
        against `single_type_kv_cache_manager.py:L1431-1453`), `needs_kv_cache_zeroing` on
        0.26.0 (`kv_cache_coordinator.py:L107-118`) and 0.33.0 (`L2199-2220`). Found by the
        manager lockstep (building vLLM's own manager); reported upstream as vllm PR #44951
        (closed), which fixed the first keyword only."""
        return self in _SINK_BUILD_FAILS

    @property
    def reserves_sink_blocks(self) -> bool:
        """`SinkFullAttentionManager.__init__` takes `sink_len // block_size` blocks from the
        head of the free queue for good (0.19.1 `L1109-1112`, 0.20.0 `L1130-1133`). 0.33.0's
        constructor takes none (only the assertion is left), but it is not built there."""
        return self in _SINK_GROUPS

    @property
    def models_rswa_groups(self) -> bool:
        """The release has `RSWAManager` (reference sliding-window attention): 0.25.1
        (`L625-666`), 0.26.0 (`L806-850`), 0.33.0 (`L900-944`)."""
        return self in _REACHABLE_MASK  # the same three releases

    @property
    def models_circular_buffer_groups(self) -> bool:
        """The release has `CircularBufferManager` (one ring block per request): 0.33.0 only
        (`L1186-1274`)."""
        return self is VllmPin.V0_33_0

    @property
    def clamps_skipped_to_table(self) -> bool:
        """`remove_skipped_blocks` caps the skipped blocks at the table's length (0.19.1 on,
        `single_type_kv_cache_manager.py:L404-410 @0.20.0`); 0.11.0 has no such cap. Found by
        the manager lockstep against 0.20.0 (a capped count leaves the table short)."""
        return self in _FULL_SEQUENCE_GATE

    @property
    def caches_only_reachable_window_blocks(self) -> bool:
        """A sliding-window group caches only blocks a later hit can use (0.25.1 / 0.26.0 /
        0.33.0 `SlidingWindowManager.reachable_block_mask`): with W = 1 a hit needs no earlier
        block, so none is cached."""
        return self in _REACHABLE_MASK

    @property
    def reuses_uncached_blocks_first(self) -> bool:
        """Freed blocks without a hash go to the head of the free queue (0.25.1
        `block_pool.py:L614-635`, 0.33.0 `L816-849`; 0.20.0 and earlier append every freed
        block). Found by the manager lockstep against 0.25.1."""
        return self in _UNCACHED_FIRST

    @property
    def frees_on_processed_basis(self) -> bool:
        """`allocate_slots` frees out-of-window blocks below the *processed* tokens, C minus
        the request's in-flight tokens (0.26.0 `kv_cache_manager.py:L440-447`, 0.33.0
        `L558-568`); 0.25.1 and earlier free below C (0.11.0 `L247-254`). In a synchronous
        engine nothing is in flight when a step is scheduled, so the two agree; under async
        scheduling they do not (vllm PR #47728)."""
        return self in _PROCESSED_BASIS

    @property
    def logs_capacity_from_concurrency(self) -> bool:
        """The logged "GPU KV cache size" is int(max concurrency x max_model_len) tokens
        (0.25.1 `kv_cache_utils.py:L1788-1798` `get_kv_cache_capacity`, logged at L2146-2150;
        0.26.0 `L1819`; 0.33.0 `L1120-1150`, on one line with the concurrency); 0.20.0 and
        earlier log num_blocks // num_groups x block_size (0.11.0 `L1080-1087`, 0.20.0
        `L1694-1711`). The concurrency is num_blocks / the startup check's blocks per request in
        every release (`get_max_concurrency_for_kv_cache_config`: 0.11.0 `L780-795`, 0.20.0
        `L872-890`, 0.25.1 `L919-937`, 0.33.0 `L1061-1094`)."""
        return self in _REACHABLE_MASK  # the same three releases

    @property
    def bounds_long_prefill_threshold(self) -> bool:
        """`long_prefill_token_threshold > max_model_len` is refused at start-up (0.33.0
        `config/scheduler.py:L355-360`; 0.26.0 and earlier only with partial prefills > 1)."""
        return self is VllmPin.V0_33_0

    # -- V1 engine core and async scheduling ------------------------------------------------
    @property
    def queues_empty_batches(self) -> bool:
        """`step_with_batch_queue` returns early when the queue has room and the batch ran
        tokens *or the scheduler still has requests* (0.25.1 `v1/engine/core.py:L576-581`,
        0.26.0 `L674-679`, 0.33.0 `L764-769`); 0.19.1 / 0.20.0 (`L477-485`, `L499-507`) and
        0.11.0 need tokens run (`sim.scheduler.v1.engine_core`)."""
        return self in _QUEUES_EMPTY_BATCHES

    @property
    def skips_request_with_last_step_in_flight(self) -> bool:
        """Async scheduling: a running request whose in-flight step already reaches
        max_tokens is not scheduled again (0.19.1 `sched/scheduler.py:L390-403`, 0.33.0
        `L798-812`); 0.11.0 schedules it once more."""
        return self in _FULL_SEQUENCE_GATE

    @property
    def counts_in_flight_tokens(self) -> bool:
        """`Request.num_in_flight_tokens` is kept (0.26.0 `sched/scheduler.py:L1250`,
        `L1656`; 0.33.0)."""
        return self in _PROCESSED_BASIS

    @property
    def drops_stale_outputs(self) -> bool:
        """A preempted request's in-flight output is stale and its placeholders are zeroed
        (0.33.0 `_preempt_request`, `sched/scheduler.py:L1826-1836`); 0.26.0 and earlier keep
        the placeholders and apply the output (0.26.0 `L1212-1233`)."""
        return self is VllmPin.V0_33_0


class AdmissionCap(enum.Enum):
    """Where a release applies the recycling-aware per-request cap of a sliding-window group,
    ``cdiv(min(W - 1 + T, max_model_len), bs) + 1`` blocks (T: the token budget, or from
    0.26.0 `max_in_flight_tokens`).

    Example (bs=16, W=32, T=64, a running request whose table has 8 entries asking for
    129 tokens): the cap is ``cdiv(95, 16) + 1 = 7``; without it the count is
    ``cdiv(129, 16) - 8 = 1``; with it in every count (0.20.0) it is ``max(7 - 8, 0) = 0``,
    while the allocation still takes 1 block (vllm #45856).
    """

    #: No cap: the full-sequence gate counts every block of the prompt (0.19.1, vllm #39734).
    NONE = "none"
    #: The cap inside every `get_num_blocks_to_allocate`, `allocate_slots`' own count
    #: included (0.20.0 `single_type_kv_cache_manager.py:L114-128`).
    EVERY_COUNT = "every count"
    #: The cap in the full-sequence check only (`apply_admission_cap=True`, 0.25.1
    #: `single_type_kv_cache_manager.py:L134-146`; 0.26.0, 0.33.0).
    GATE_ONLY = "full-sequence check only"


_MAMBA_ALIGN = frozenset(
    {VllmPin.V0_19_1, VllmPin.V0_20_0, VllmPin.V0_25_1, VllmPin.V0_26_0, VllmPin.V0_33_0}
)
_FULL_SEQUENCE_GATE = frozenset(
    {VllmPin.V0_19_1, VllmPin.V0_20_0, VllmPin.V0_25_1, VllmPin.V0_26_0, VllmPin.V0_33_0}
)
_ADMISSION_CAP = {
    VllmPin.V0_20_0: AdmissionCap.EVERY_COUNT,
    VllmPin.V0_25_1: AdmissionCap.GATE_ONLY,
    VllmPin.V0_26_0: AdmissionCap.GATE_ONLY,
    VllmPin.V0_33_0: AdmissionCap.GATE_ONLY,
}
_MAMBA_GROUPS = frozenset({VllmPin.V0_11_0, *_FULL_SEQUENCE_GATE})
_SINK_GROUPS = frozenset({VllmPin.V0_19_1, VllmPin.V0_20_0})
_SINK_BUILD_FAILS = frozenset({VllmPin.V0_25_1, VllmPin.V0_26_0, VllmPin.V0_33_0})
_REACHABLE_MASK = frozenset({VllmPin.V0_25_1, VllmPin.V0_26_0, VllmPin.V0_33_0})
_PROCESSED_BASIS = frozenset({VllmPin.V0_26_0, VllmPin.V0_33_0})
_UNCACHED_FIRST = frozenset({VllmPin.V0_25_1, VllmPin.V0_26_0, VllmPin.V0_33_0})
_QUEUES_EMPTY_BATCHES = frozenset({VllmPin.V0_25_1, VllmPin.V0_26_0, VllmPin.V0_33_0})

_WORDS = {
    VllmPin.V0_5_4: "vLLM 0.5.4",
    VllmPin.V0_5_4_PR_7380: "vLLM 0.5.4 + #7380",
    VllmPin.C4AC7713: "vLLM ~0.10 @ 4ac7713",
    VllmPin.V0_11_0: "vLLM 0.11.0",
    VllmPin.V0_19_1: "vLLM 0.19.1",
    VllmPin.V0_20_0: "vLLM 0.20.0",
    VllmPin.V0_25_1: "vLLM 0.25.1",
    VllmPin.V0_26_0: "vLLM 0.26.0",
    VllmPin.V0_33_0: "vLLM 0.33.0",
}
