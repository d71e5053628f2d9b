"""The seeded random manager configurations of the block-manager lockstep.

`random_config` draws one v0 or V1 configuration (a small pool, a block size, maybe a window,
maybe prefix caching); `random_hybrid_config` a V1-engine one with KV-cache groups (sliding,
chunked-local, Mamba or full-attention variants beside the full group), through
`random_mamba_config` and `random_full_variant_config`. The walks that run on them are
`lockstep_walks`'.
"""

from __future__ import annotations

import random

from sim.kv.config import KVCacheConfig, KVCacheGroupSpec
from sim.kv.v1_engine.variant_caching import split_variant_groups


def random_config(rng: random.Random, design: str) -> KVCacheConfig:
    """A small pool, a block size, maybe a window, maybe prefix caching (never both in v0)."""
    block_size = rng.choice([1, 2, 4, 8, 16, 16])
    num_gpu_blocks = rng.randint(4, 48)
    window = None
    caching = rng.random() < 0.4
    if rng.random() < 0.5:
        window = rng.randint(1, 6 * block_size)
        if design != "v1-engine":
            caching = False  # vLLM 0.5.4 rejects prefix caching with a sliding window
    watermark = rng.choice([0.0, 0.01, 0.01, 0.1])
    max_model_len = (
        rng.choice([None, None, rng.randint(8, 20 * block_size)]) if design == "v1-engine" else None
    )
    return KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        num_cpu_blocks=rng.randint(0, 48) if design != "v1-engine" else 0,
        sliding_window=window,
        enable_prefix_caching=caching,
        watermark=watermark,
        max_model_len=max_model_len,
        # The real v0 code installed is the 0.5.4 wheel: compare with its release behaviour.
        vllm_pin="0.5.4" if design != "v1-engine" else None,
    )


def random_hybrid_config(
    rng: random.Random,
    *,
    chunked_local: bool = False,
    mamba: bool = False,
    mamba_align: bool = False,
    full_variants: tuple[str, ...] = (),
) -> KVCacheConfig:
    """A V1-engine config with KV-cache groups: one full group and 1-3 sliding groups of one
    window (Gemma-2 and Gemma-3 shapes), the full group first or last, maybe caching. With
    `chunked_local`, the other groups are chunked-local attention of one chunk size instead
    in a third of the draws (Llama-4's shape; chunks a multiple of the block size or not).
    With `mamba`, half the draws that would be sliding are `random_mamba_config`'s instead
    (the chunked-local share stays a third); with `mamba_align` too, some of those have
    prefix caching on (`random_mamba_config`); with `full_variants` (kinds of
    `random_full_variant_config`), 60% of the sliding draws left are that function's."""
    block_size = rng.choice([1, 2, 4, 8, 16, 16])
    window = rng.randint(1, 6 * block_size)
    other = KVCacheGroupSpec(window)
    if chunked_local and rng.random() < 1 / 3:
        chunk = rng.choice([block_size * rng.randint(1, 6), rng.randint(1, 6 * block_size)])
        other = KVCacheGroupSpec(attention_chunk_size=chunk)
    elif mamba and rng.random() < 0.5:
        return random_mamba_config(rng, align=mamba_align)
    elif full_variants and rng.random() < 0.6:
        return random_full_variant_config(rng, full_variants, mamba=mamba)
    sliding = [other] * rng.randint(1, 3)
    full = [KVCacheGroupSpec(None)]
    groups = tuple(sliding + full if rng.random() < 0.5 else full + sliding)
    return KVCacheConfig(
        num_gpu_blocks=rng.randint(4, 64),
        block_size=block_size,
        enable_prefix_caching=rng.random() < 0.6,
        max_model_len=rng.choice([None, None, rng.randint(8, 20 * block_size)]),
        kv_cache_groups=groups,
    )


def random_mamba_config(rng: random.Random, *, align: bool = False) -> KVCacheConfig:
    """Full attention with 1-3 Mamba state groups (Jamba, Nemotron-H, Qwen3.5-style hybrids),
    in half the draws also a sliding group, in any group order (vLLM's no-prefix-cache
    coordinator takes any mix); caching off (the default Mamba mode) and a max_model_len
    (the Mamba groups' block size), small enough that long prompts reach it. With `align`,
    60% of the draws have prefix caching on instead (the Mamba mode "align": full + Mamba
    groups only, the Mamba block size the attention one); without it the draws are
    unchanged. A third of those with caching run the mode "all" instead (0.19.1-0.26.0)."""
    block_size = rng.choice([1, 2, 4, 8, 16, 16])
    groups = [KVCacheGroupSpec()] * rng.randint(1, 2)
    groups += [KVCacheGroupSpec(mamba=True)] * rng.randint(1, 3)
    caching = align and rng.random() < 0.6
    if not caching and rng.random() < 0.5:
        groups.append(KVCacheGroupSpec(rng.randint(1, 6 * block_size)))
    rng.shuffle(groups)
    return KVCacheConfig(
        num_gpu_blocks=rng.randint(4, 64),
        block_size=block_size,
        enable_prefix_caching=caching,
        max_model_len=rng.randint(8, 20 * block_size),
        kv_cache_groups=tuple(groups),
        mamba_cache_mode=rng.choice(["align", "align", "all"]) if caching else None,
    )


#: The kinds `random_full_variant_config` draws, by name.
FULL_VARIANT_KINDS = ("sink", "rswa", "circular_buffer")


def _full_variant_group(kind: str, rng: random.Random, block_size: int) -> KVCacheGroupSpec:
    """One sink (1-3 blocks of sinks), R-SWA (a window of 1..6 blocks' tokens) or
    circular-buffer group."""
    if kind == "sink":
        return KVCacheGroupSpec(sink_len=block_size * rng.randint(1, 3))
    if kind == "rswa":  # short, so that decodes reach past prompt + window within a walk
        return KVCacheGroupSpec(rswa_window=rng.randint(1, 2 * block_size))
    return KVCacheGroupSpec(circular_buffer=True)


def random_full_variant_config(
    rng: random.Random, kinds: tuple[str, ...], *, mamba: bool = False
) -> KVCacheConfig:
    """Full attention with 1-2 groups of each of 1..all of `kinds` (sink, R-SWA, circular
    buffer: `sim.kv.v1_engine.full_variants`), sometimes a sliding group and (`mamba`) a
    Mamba group beside, in any group order; prefix caching on in 80% of the layouts kvsim
    models it for (`sim.kv.v1_engine.variant_caching`), a small max_model_len, and a pool
    with room for the sink groups' blocks."""
    block_size = rng.choice([1, 2, 4, 8, 16, 16])
    groups = [KVCacheGroupSpec()] * rng.randint(1, 2)
    for kind in rng.sample(kinds, rng.randint(1, len(kinds))):
        groups += [_full_variant_group(kind, rng, block_size)] * rng.randint(1, 2)
    if rng.random() < 0.3:
        groups.append(KVCacheGroupSpec(rng.randint(1, 6 * block_size)))
    if mamba and rng.random() < 0.3:
        groups.append(KVCacheGroupSpec(mamba=True))
    rng.shuffle(groups)
    num_sink_blocks = sum((g.sink_len or 0) // block_size for g in groups)
    has_rswa = any(g.rswa_window is not None for g in groups)
    return KVCacheConfig(
        num_gpu_blocks=num_sink_blocks + rng.randint(4, 64),
        block_size=block_size,
        enable_prefix_caching=rng.random() < 0.8 and _variant_caching_modelled(groups),
        # Longer with an R-SWA group: its gap opens only past prompt + window + a block.
        max_model_len=rng.randint(8, (40 if has_rswa else 20) * block_size),
        kv_cache_groups=tuple(groups),
    )


def _variant_caching_modelled(groups: list[KVCacheGroupSpec]) -> bool:
    """Whether kvsim models prefix caching over this layout (`variant_caching`)."""
    if any(g.mamba for g in groups):
        return False
    try:
        split_variant_groups(tuple(groups))
    except ValueError:
        return False
    return True
