"""Prefix caching over full attention's variants (sink, R-SWA, circular buffer), per release.

What each release's code does with caching on and one of these groups in the hybrid
coordinator (`sim.kv.v1_engine.full_variants` models the groups themselves):

* **Sink** (0.19.1, 0.20.0; later releases cannot build the manager,
  `VllmPin.sink_manager_fails_to_build`). `SinkFullAttentionSpec` subclasses
  `FullAttentionSpec` (`kv_cache_interface.py:L324 @0.19.1`, `L571 @0.20.0`) and
  `SinkFullAttentionManager` inherits full attention's hit and `cache_blocks`
  (`single_type_kv_cache_manager.py:L1091-1112 @0.19.1`, `L1112-1133 @0.20.0`): a sink
  group caches and hits exactly as a full group. Its spec differs from plain full
  attention's (`sink_len`), so `verify_and_split_kv_cache_groups`
  (`kv_cache_coordinator.py:L410-451 @0.19.1`, `L425-466 @0.20.0`) makes it an attention
  group of its own, sorted with the full ones (`L442 @0.19.1`, `L457 @0.20.0`).
* **R-SWA** (0.25.1, 0.26.0, 0.33.0). `RSWASpec(FullAttentionSpec)`
  (`kv_cache_interface.py:L441 @0.25.1`, `L459 @0.26.0`, `L816 @0.33.0`); `RSWAManager`
  overrides only `remove_skipped_blocks` (`single_type_kv_cache_manager.py:L625-666 @0.25.1`,
  `L806-850 @0.26.0`, `L900-944 @0.33.0`): full attention's hit and caching over a table
  whose gap entries are null (`cache_full_blocks` skips nulls, `block_pool.py:L284
  @0.25.1`). The one model with R-SWA layers turns caching off in its config hook
  (`UnlimitedOCRForCausalLMConfig`, `model_executor/models/config.py:L166 @0.25.1`,
  `L269 @0.33.0`), which kvsim's catalog does not carry: an explicit R-SWA group runs
  what the manager does.
* **Circular buffer** (0.33.0). `CircularBufferSpec.prefix_cacheable` is False
  (`kv_cache_interface.py:L998-1000 @0.33.0`): the coordinator leaves the group out of
  every hit lookup (`kv_cache_coordinator.py:L727-733`) and its share of a hit is empty
  (`kv_cache_manager.py:L818-830`); its manager neither hits nor caches
  (`single_type_kv_cache_manager.py:L1231-1253`). The other groups hit as without it.

The hit over two attention types, both full-attention specs (full + one sink or one R-SWA
spec), is the "simple hybrid" of `HybridKVCacheCoordinator.find_longest_cache_hit`
(`L493 @0.19.1`, `L512 @0.20.0`, `L667 @0.25.1`, `L709 @0.26.0`, `L838 @0.33.0`): the first
type's chained hit, the second's within it, one pass, the first truncated to the second.
Both are full-attention hits over chained keys, so this is the longest block prefix that
every group of the two has cached: kvsim's joint lookup over all full-type groups
(`HybridKVCacheCoordinator._full_hit`).

Refused (one line, by `split_variant_groups`): three or more attention types with a sink or
R-SWA spec among them (two sink lengths, or a sink / R-SWA group beside a sliding,
chunked-local or Mamba group). There the coordinator runs its fixed-point loop, and
0.19.1 to 0.26.0 truncate only the first attention type's hit to the final length
(`L534-540 @0.19.1`, `L570-576 @0.20.0`, `L727-733 @0.25.1`, `L789-799 @0.26.0`), leaving a
second full-type group's hit longer than the hit length; 0.33.0 truncates every
full-attention type (`L919-930`). kvsim does not model either.

Worked example (bs=4, groups [full, rswa 8], both with h0, h1 cached but only the full
group with h2; a 13-token prompt, max_length 12 -> 3 blocks): the full hit is h0..h2, the
R-SWA hit within 12 tokens h0, h1: 8 tokens, 2 blocks per group.
"""

from __future__ import annotations

from sim.kv.config import KVCacheGroupSpec


def split_variant_groups(
    groups: tuple[KVCacheGroupSpec, ...],
) -> tuple[list[int], list[int], list[int]]:
    """The group ids of a caching-on layout with sink, R-SWA or circular-buffer groups, as
    the coordinator's hit sees them: (full-type groups: full, sink, R-SWA; the one other
    type: sliding or chunked-local; groups left out of every hit: circular buffers), or
    ValueError naming what kvsim does not model (module docstring).

    Example: [full, rswa 8, circular buffer] -> ([0, 1], [], [2]).

    kvsim's own (upstream: `verify_and_split_kv_cache_groups`,
    `vllm/v1/core/kv_cache_coordinator.py:L718-773 (0.33.0)`).
    """
    uncached = [i for i, g in enumerate(groups) if g.circular_buffer]
    full_type = [
        i for i, g in enumerate(groups) if g.is_full_attention or g.rswa_window is not None
    ]
    other = [i for i in range(len(groups)) if i not in uncached and i not in full_type]
    if not full_type:
        raise ValueError(
            "enable_prefix_caching: a caching layout with circular-buffer groups needs a "
            "full-attention group; got " + ", ".join(g.kind for g in groups)
        )
    full_specs = {groups[i] for i in full_type}
    other_specs = {groups[i] for i in other}
    if len(other_specs) > 1:
        raise ValueError(
            "enable_prefix_caching: the hybrid hit takes full attention plus one sliding "
            "window or one chunk size; got " + ", ".join(g.kind for g in groups)
        )
    if len(full_specs) > 1 and len(full_specs) + len(other_specs) > 2:
        raise ValueError(
            "enable_prefix_caching: prefix caching over a sink or R-SWA group beside a "
            "third attention type is not modelled (vLLM's fixed-point hit, which before "
            "0.33.0 truncates only the first type's hit); got " + ", ".join(g.kind for g in groups)
        )
    return full_type, other, uncached
