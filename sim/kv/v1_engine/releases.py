"""The vLLM releases whose V1 engine kvsim models, and how a scenario names one.

kvsim's V1 model was written against commit 4ac7713 (2025-07-23, about v0.10.0). Two releases
are pinned next to it; each behaviour that differs between them is a small strategy class,
chosen here by release (see docs/vllm-v1-changes.md for the full diff and what is modelled):

=================  ============================  ============================================
behaviour          4ac7713 and 0.11.0             0.33.0 (latest on the package index)
=================  ============================  ============================================
free-block reuse   `AppendInFreeOrder`            `UncachedFirst` (`free_order.py`)
admission gate     `FirstChunkGate`               `FullSequenceGate` (`sim/scheduler/v1_release`)
prompt > budget    `SkipOversized`                `StopAtOversized` (no chunked prefill)
priority victim    `KeepScheduledVictim`          `RefundScheduledVictim`
=================  ============================  ============================================

0.11.0 makes the same block and scheduling decisions as 4ac7713 for everything kvsim models
(its changes are in hashing, metrics and bookkeeping); it is a named pin so that a scenario can
say what it runs, and the manager lockstep drives the real 0.11.0 install against it.

`KVCacheConfig.vllm_pin` carries the release into the manager: None means 4ac7713, which keeps
every manager built without a pin (tests, the fuzzer) on the behaviour it always had. A scenario
that names no version gets `LATEST` (`resolve_release(None, default_latest=True)`).
"""

from __future__ import annotations

import enum


class VllmRelease(enum.Enum):
    """A pinned V1-engine version: a commit or a release on the package index."""

    #: Upstream main at 4ac7713e (2025-07-23), ~v0.10.0: the baseline of `sim.kv.v1_engine`.
    C4AC7713 = "4ac7713"
    #: vLLM 0.11.0 (2025-10-03).
    V0_11_0 = "0.11.0"
    #: vLLM 0.33.0, the latest release on the package index when this was written.
    V0_33_0 = "0.33.0"

    @property
    def has_full_sequence_gate(self) -> bool:
        """`scheduler_reserve_full_isl` (default True) exists from 0.33.0 on in kvsim's pins."""
        return self is VllmRelease.V0_33_0

    @property
    def caches_only_reachable_window_blocks(self) -> bool:
        """A sliding-window group caches only blocks a later hit can use (0.33.0's
        `SlidingWindowManager.reachable_block_mask`): with W = 1 a hit needs no earlier block,
        so none is cached."""
        return self is VllmRelease.V0_33_0

    @property
    def reuses_uncached_blocks_first(self) -> bool:
        """Freed blocks without a hash go to the head of the free queue (0.33.0)."""
        return self is VllmRelease.V0_33_0


#: The default of a scenario that names no version (the issue asks for the latest release).
LATEST = VllmRelease.V0_33_0
#: What a manager built without a pin follows (the commit kvsim's V1 model was written from).
BASELINE = VllmRelease.C4AC7713

RELEASE_NAMES = tuple(release.value for release in VllmRelease)


def resolve_release(pin: str | None, *, default_latest: bool = False) -> VllmRelease:
    """The release a pin names; None gives `LATEST` for scenarios, `BASELINE` otherwise.

    Example: ``resolve_release("0.11.0")`` -> `V0_11_0`; ``resolve_release(None)`` -> 4ac7713;
    ``resolve_release(None, default_latest=True)`` -> 0.33.0; ``resolve_release("0.9")`` raises.
    """
    if pin is None:
        return LATEST if default_latest else BASELINE
    try:
        return VllmRelease(pin)
    except ValueError:
        raise ValueError(
            f"unknown vLLM version {pin!r} for the V1 engine; pinned: {', '.join(RELEASE_NAMES)}"
        ) from None
