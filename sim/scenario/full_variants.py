"""The scenario checks of full attention's variants (sink, R-SWA and circular-buffer groups,
`sim.kv.v1_engine.full_variants`): the caching layouts kvsim models
(`sim.kv.v1_engine.variant_caching`), whole-block sink lengths, and the sink blocks that
vLLM 0.19.1 / 0.20.0's startup check never counts.
"""

from __future__ import annotations

from sim.audit.violations import Violation, ViolationKind
from sim.kv.config import KVCacheConfig
from sim.kv.pins import VllmPin
from sim.kv.v1_engine.variant_caching import split_variant_groups
from sim.scenario.schema import ScenarioError


def check_full_variant_groups(config: KVCacheConfig) -> None:
    """A sink, R-SWA or circular-buffer group (`cache.kv_cache_groups`,
    `sim.kv.v1_engine.full_variants`) with prefix caching on is in a layout kvsim models
    (`variant_caching.split_variant_groups`: at most two attention types where a sink or
    R-SWA spec is one), and a sink group's `sink_len` is whole blocks (upstream asserts
    ``sink_len % block_size == 0``, `single_type_kv_cache_manager.py:L1109 @0.19.1`)."""
    if not config.has_full_variant_group:
        return
    if config.enable_prefix_caching and not config.has_mamba_group:
        try:
            split_variant_groups(config.kv_cache_groups)
        except ValueError as exc:
            raise ScenarioError(f"cache.{exc}; set cache.enable_prefix_caching: false") from None
    for group_id, group in enumerate(config.kv_cache_groups):
        if group.sink_len is not None and group.sink_len % config.block_size:
            raise ScenarioError(
                f"cache.kv_cache_groups[{group_id}].sink_len: {group.sink_len} is not a "
                f"multiple of cache.block_size {config.block_size}"
            )


def num_sink_blocks(release: VllmPin, kv: KVCacheConfig) -> int:
    """Blocks the release's sink groups take from the pool for good when the manager is built
    (`VllmPin.reserves_sink_blocks`: 0.19.1, 0.20.0): ``sink_len // bs`` per sink group.
    Example: two groups of 64 sink tokens, bs 16: 8."""
    if not release.reserves_sink_blocks:
        return 0
    return sum((g.sink_len or 0) // kv.block_size for g in kv.kv_cache_groups)


def sink_startup_mismatch(
    release: VllmPin, kv: KVCacheConfig, startup_blocks: int, pin: str
) -> Violation | None:
    """A `startup_gate_mismatch` from sink groups: the startup check charges a sink group as
    full attention over the whole pool (`FullAttentionSpec.max_memory_usage_bytes`), but
    building the manager then takes the sink blocks out of it (0.19.1, 0.20.0), so a
    max_model_len request that startup accepted may never fit what is left.

    Example (bs 16, groups [full, sink 64], max_model_len 1,024, 132 blocks): startup charges
    64 + 64 = 128 <= 131 usable; the sink group takes 4, leaving 127 < 128.
    """
    sinks = num_sink_blocks(release, kv)
    usable = kv.num_gpu_blocks - 1
    if not sinks or startup_blocks > usable or startup_blocks <= usable - sinks:
        return None
    return Violation(
        ViolationKind.STARTUP_GATE_MISMATCH,
        "startup",
        None,
        f"vLLM {pin}'s startup check accepts max_model_len ({startup_blocks} blocks of "
        f"{usable} usable), but its sink groups then take {sinks} blocks for good, leaving "
        f"{usable - sinks}: a max_model_len request would never be admitted",
        counted_blocks=startup_blocks,
        needed_blocks=startup_blocks,
        free_blocks=usable - sinks,
        time_s=0.0,
    )
