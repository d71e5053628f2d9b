"""The vLLM code each design models, and how a scenario names it (`scheduler.vllm_version`).

One type, `VllmPin`, names every code base a design can be pinned to; each behaviour that
differs between pins is a property of it, read by the model that has the behaviour (nothing
compares a version string). `resolve_pin(design, name)` turns a scenario's
`scheduler.vllm_version` into a pin; `manager_pin(design, name)` does the same for a
`KVCacheConfig.vllm_pin`, where None keeps the behaviour a manager always had.

==========  ==========================  ================  ===================================
design      pins (scenario default *)   unpinned manager  source
==========  ==========================  ================  ===================================
v0-v1       0.5.4 *                     0.5.4             the 0.5.4 wheel (release 4db5176)
v0-v2       0.5.4 *, 0.5.4+7380         0.5.4+7380        the wheel; the wheel plus PR #7380
v0-fixed    0.5.4 *                     0.5.4             kvsim's fix over the wheel's V2
v1-engine   4ac7713, 0.11.0, 0.33.0 *   4ac7713           upstream main 4ac7713; releases
==========  ==========================  ================  ===================================

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

=================  ============================  ============================================
behaviour          4ac7713 and 0.11.0             0.33.0 (latest on the package index)
=================  ============================  ============================================
free-block reuse   `AppendInFreeOrder`            `UncachedFirst` (`v1_engine/free_order.py`)
admission gate     `FirstChunkGate`               `FullSequenceGate` (`sim/scheduler/v1`)
prompt > budget    `SkipOversized`                `StopAtOversized` (no chunked prefill)
priority victim    `KeepScheduledVictim`          `RefundScheduledVictim`
=================  ============================  ============================================

0.11.0 makes the same block and scheduling decisions as 4ac7713 for everything kvsim models
(its changes are in hashing, metrics and bookkeeping); it is a named pin so that a scenario can
say what it runs, and the manager lockstep drives the real 0.11.0 install against it.
"""

from __future__ import annotations

import enum

from sim.kv.config import Design


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
        """`scheduler_reserve_full_isl` (default True) exists from 0.33.0 on in kvsim's pins."""
        return self is VllmPin.V0_33_0

    @property
    def caches_only_reachable_window_blocks(self) -> bool:
        """A sliding-window group caches only blocks a later hit can use (0.33.0's
        `SlidingWindowManager.reachable_block_mask`): with W = 1 a hit needs no earlier block,
        so none is cached."""
        return self is VllmPin.V0_33_0

    @property
    def reuses_uncached_blocks_first(self) -> bool:
        """Freed blocks without a hash go to the head of the free queue (0.33.0)."""
        return self is VllmPin.V0_33_0

    @property
    def frees_on_processed_basis(self) -> bool:
        """`allocate_slots` frees out-of-window blocks below the *processed* tokens, C minus
        the request's in-flight tokens (0.33.0 `kv_cache_manager.py:L558-568`); 4ac7713 /
        0.11.0 free below C (0.11.0 `L247-254`). In a synchronous engine nothing is in flight
        when a step is scheduled, so the two agree; under async scheduling they do not."""
        return self is VllmPin.V0_33_0

    @property
    def bounds_long_prefill_threshold(self) -> bool:
        """`long_prefill_token_threshold > max_model_len` is refused at start-up (0.33.0)."""
        return self is VllmPin.V0_33_0


_WORDS = {
    VllmPin.V0_5_4: "vLLM 0.5.4",
    VllmPin.V0_5_4_PR_7380: "vLLM 0.5.4 + #7380",
    VllmPin.C4AC7713: "vLLM ~0.10 @ 4ac7713",
    VllmPin.V0_11_0: "vLLM 0.11.0",
    VllmPin.V0_33_0: "vLLM 0.33.0",
}

#: The pins each design can be given, in the order reports list them.
PINS_BY_DESIGN: dict[Design, tuple[VllmPin, ...]] = {
    Design.V0_V1: (VllmPin.V0_5_4,),
    Design.V0_V2: (VllmPin.V0_5_4, VllmPin.V0_5_4_PR_7380),
    Design.V0_FIXED: (VllmPin.V0_5_4,),
    Design.V1_ENGINE: (VllmPin.C4AC7713, VllmPin.V0_11_0, VllmPin.V0_33_0),
}

#: What a scenario that names no version gets: for v0 the release the real-code mode runs (so
#: model and real code agree when nothing is named), for the V1 engine the latest release.
SCENARIO_DEFAULT: dict[Design, VllmPin] = {
    Design.V0_V1: VllmPin.V0_5_4,
    Design.V0_V2: VllmPin.V0_5_4,
    Design.V0_FIXED: VllmPin.V0_5_4,
    Design.V1_ENGINE: VllmPin.V0_33_0,
}

#: What the V1 manager built without a pin follows (the commit kvsim's V1 model was written from).
V1_BASELINE = VllmPin.C4AC7713

#: What a manager built from a `KVCacheConfig` without `vllm_pin` follows: the behaviour it
#: always had, so tests and the fuzzer that name no pin are unchanged (v0-v2: with #7380).
UNPINNED_MANAGER: dict[Design, VllmPin] = {
    Design.V0_V1: VllmPin.V0_5_4,
    Design.V0_V2: VllmPin.V0_5_4_PR_7380,
    Design.V0_FIXED: VllmPin.V0_5_4,
    Design.V1_ENGINE: V1_BASELINE,
}


def _named(design: Design, name: str) -> VllmPin:
    """The pin of `design` called `name`, or the one-line error naming the design's pins."""
    allowed = PINS_BY_DESIGN[design]
    for pin in allowed:
        if pin.value == name:
            return pin
    where = "the V1 engine" if design is Design.V1_ENGINE else design.value
    names = ", ".join(pin.value for pin in allowed)
    raise ValueError(f"unknown vLLM version {name!r} for {where}; pinned: {names}")


def resolve_pin(design: Design | str, name: str | None) -> VllmPin:
    """The pin a scenario's `scheduler.vllm_version` names for `design`; None gives the
    design's `SCENARIO_DEFAULT`.

    Example: ``resolve_pin("v0-v2", "0.5.4+7380")`` -> `V0_5_4_PR_7380`;
    ``resolve_pin("v1-engine", None)`` -> `V0_33_0`; ``resolve_pin("v0-v1", "0.5.4+7380")``
    raises ValueError ("unknown vLLM version '0.5.4+7380' for v0-v1; pinned: 0.5.4").
    """
    design = Design(design)
    return SCENARIO_DEFAULT[design] if name is None else _named(design, name)


def manager_pin(design: Design | str, name: str | None) -> VllmPin:
    """The pin a manager of `design` follows for `KVCacheConfig.vllm_pin`; None gives the
    design's `UNPINNED_MANAGER` (``manager_pin("v1-engine", None)`` -> 4ac7713, not 0.33.0)."""
    design = Design(design)
    return UNPINNED_MANAGER[design] if name is None else _named(design, name)


def find_pin(name: str) -> VllmPin | None:
    """The pin called `name` whatever the design, or None (a real install's version string
    such as '0.6.5.dev' names no pin)."""
    return next((pin for pin in VllmPin if pin.value == name), None)
