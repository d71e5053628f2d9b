"""Drive kvsim's model and vLLM's real block manager side by side and find the first divergence.

A *workload* is one manager configuration plus a seeded random walk of scheduler-like
operations (admit, decode, fork, swap out/in, recompute-preempt, finish). Each operation is
applied to both managers on the same kvsim `Sequence` objects, and after it we compare:

* the answer (AllocStatus, bool, block ids, CoW / swap mappings, None for a failed step),
* the exception class (after mapping vLLM's to kvsim's, see `v0_adapter.translate_error`),
* the free GPU and CPU block counts,
* the shape of every live table (its length) and, when `compare_ids`, its block ids.

The walk branches on the answers, so it is only defined while the two agree: the first
disagreement ends the run with a `Divergence`. An operation that raises on both sides (e.g.
the V2 sliding-window `NoFreeBlocksError`) is a *crash*: the real engine would die there,
so after comparing we start a new episode (fresh managers, same configuration).

Worked example: ``verify(root, "v0-v2", num_ops=10_000, seed=0)`` returns
``VerifyResult(design="v0-v2", num_ops=10000, num_workloads=..., divergence=None, ...)``,
whose `summary()` reads "identical over 10000 operations (...)".
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from sim.errors import InputError
from sim.kv.config import Design, KVCacheConfig, make_manager
from sim.kv.pins import AdmissionCap, VllmPin
from sim.vllm_real.lockstep_configs import (
    FULL_VARIANT_KINDS,
    random_config,
    random_hybrid_config,
)
from sim.vllm_real.lockstep_pair import Diverged, Divergence, Pair, VerifyResult
from sim.vllm_real.lockstep_walks import Crash, v0_episode, v1_episode

# ---------------------------------------------------------------------------- entry points
_DEFAULT_VERSION = {"v0-v1": "0.5.4", "v0-v2": "0.5.4", "v0-fixed": "0.5.4", "v1-engine": "0.11.0"}
#: The vLLM releases kvsim pins, by design: what `scripts/setup_vllm.sh` installs and the
#: lockstep tests run (0.5.4+7380 and 4ac7713 are model variants, not installs).
PINNED_RELEASES = {"v0-v1": ("0.5.4",), "v0-v2": ("0.5.4",), "v1-engine": ("0.11.0", "0.33.0")}
#: vLLM version each design's block ids are pinned to (ids compared by default only there).
_MODELLED_VERSION = {"v0-v1": (0, 5), "v0-v2": (0, 5), "v1-engine": (0, 10)}
#: kvsim's V1 pin for a loaded vLLM (major, minor) whose manager decides differently from
#: 4ac7713 (the pin a config without `vllm_pin` gets, and what 0.10/0.11 decide).
_V1_PIN_FOR_VERSION: dict[tuple[int, ...], str] = {
    (0, 19): "0.19.1",
    (0, 20): "0.20.0",
    (0, 25): "0.25.1",
    (0, 26): "0.26.0",
    (0, 33): "0.33.0",
}


def v1_pin_for(version: tuple[int, ...]) -> str | None:
    """The `KVCacheConfig.vllm_pin` that models a loaded vLLM: (0, 33, 0) -> "0.33.0";
    (0, 11, 0) -> None (4ac7713, which decides as 0.11.0 does)."""
    return _V1_PIN_FOR_VERSION.get(version[:2])


def make_real(design: str, config: KVCacheConfig, install):
    if design == "v1-engine":
        from sim.vllm_real.v1_adapter import RealKVCacheManager

        return RealKVCacheManager(config, install=install)
    from sim.vllm_real.v0_adapter import RealV0Manager

    kind = {"v0-v1": "v1", "v0-v2": "v2"}.get(design)
    if kind is None:
        raise InputError(f"design {design!r} has no vLLM counterpart (v0-fixed is kvsim's own fix)")
    return RealV0Manager(config, kind, install=install)


def verify(
    vllm_root: str | Path | None,
    design: str,
    num_ops: int = 10_000,
    seed: int = 0,
    *,
    vllm_version: str | None = None,
    ops_per_workload: int = 200,
    compare_ids: bool | None = None,
    config: KVCacheConfig | None = None,
    fork_after_window_drop: bool = False,
    hybrid: bool = False,
) -> VerifyResult:
    """Replay seeded random workloads through kvsim's `design` model and the real vLLM code.

    `config` fixes the manager configuration; otherwise each workload draws one
    (`random_config`). Stops at the first divergence. `compare_ids` defaults to True when the
    loaded vLLM is the version the design models (0.5.x for v0, 0.10/0.11 for the V1 engine).
    For v0-v1 that relies on the adapter pinning vLLM's `set(table)` free order (upstream it
    follows object addresses; see `v0_adapter._deterministic_block_sets`), which the model
    follows.

    `fork_after_window_drop=False` skips forking a sliding-window v0 sequence that has
    decoded: in real V2 that walks a `prev_block` chain through recycled block objects and
    either succeeds or recurses forever (RecursionError) depending on history; kvsim's model
    raises ValueError there by design (spec section 10).

    `hybrid=True` (v1-engine only) draws configs with several KV-cache groups
    (`random_hybrid_config`) instead.
    """
    from sim.vllm_real.loader import load_vllm

    design = _checked_design(design, hybrid)
    if vllm_root is None and vllm_version is None:
        vllm_version = _DEFAULT_VERSION[design]
    install = load_vllm(vllm_root, vllm_version if vllm_root is None else None)
    if compare_ids is None:
        compare_ids = _ids_comparable(design, install.version_tuple)
    rng = random.Random(seed)
    result = VerifyResult(design=design, vllm_version=install.version)
    next_id = [1]
    pin = v1_pin_for(install.version_tuple) if design == "v1-engine" else None
    while result.num_ops < num_ops:
        cfg = config or _random_config(rng, design, install.version_tuple, pin, hybrid)
        cfg = _pinned(cfg, pin, config is None, rng, result.num_workloads)
        pair = _pair(design, cfg, install, compare_ids, fork_after_window_drop, result)
        result.num_workloads += 1
        budget = min(ops_per_workload, num_ops - result.num_ops)
        ops_before = result.num_ops
        ok = _run_episode(pair, rng, budget, next_id, result)
        layout = layout_name(cfg)
        result.ops_by_layout[layout] = (
            result.ops_by_layout.get(layout, 0) + result.num_ops - ops_before
        )
        if not ok:
            break
    return result


def _random_config(
    rng: random.Random,
    design: str,
    version_tuple: tuple[int, ...],
    pin: str | None,
    hybrid: bool,
) -> KVCacheConfig:
    """One workload's drawn manager configuration: several KV-cache groups (`hybrid`), with
    the group kinds the loaded release has and kvsim models there, or one group."""
    if not hybrid:
        return random_config(rng, design)
    return random_hybrid_config(
        rng,
        chunked_local=version_tuple[:2] >= (0, 11),
        mamba=_models_mamba(version_tuple),
        mamba_align=pin is not None and VllmPin(pin).models_mamba_align,
        full_variants=full_variant_kinds(pin),
    )


def _pinned(
    cfg: KVCacheConfig, pin: str | None, drawn: bool, rng: random.Random, num_workloads: int
) -> KVCacheConfig:
    """`cfg` pinned to the release the loaded vLLM is compared as, where it names no pin;
    a drawn config (`drawn`) also gets the release's own draws: 0.33.0's Mamba "align" or
    sliding retention, 0.20.0's small token budget."""
    if (
        pin is None
        and cfg.vllm_pin is None
        and (cfg.has_chunked_local_group or cfg.has_mamba_group)
    ):
        # kvsim models chunked-local and Mamba groups from 0.11.0 on; 4ac7713 (the pin
        # 0.11.0 is otherwise compared as) is not compared with them.
        cfg = replace(cfg, vllm_pin=VllmPin.V0_11_0.value)
    if pin is not None and cfg.vllm_pin is None:
        cfg = replace(cfg, vllm_pin=pin)
        if drawn and cfg.enable_prefix_caching and cfg.has_mamba_group:
            cfg = _with_033_mamba_align(cfg, rng)
        elif drawn and cfg.enable_prefix_caching:
            cfg = _with_033_retention(cfg, num_workloads)
        if drawn and VllmPin(pin).admission_cap is AdmissionCap.EVERY_COUNT:
            # 0.20.0 caps every count on the token budget: draw one small enough to bite
            # (a budget above max_model_len caps nothing).
            cfg = replace(cfg, max_num_batched_tokens=rng.randint(1, 8 * cfg.block_size))
    return cfg


def _pair(
    design: str,
    cfg: KVCacheConfig,
    install,
    compare_ids: bool,
    fork_after_window_drop: bool,
    result: VerifyResult,
) -> Pair:
    """kvsim's manager and vLLM's real one built from `cfg`, side by side, recording into
    `result` (`fork_after_window_drop`: see `verify`)."""
    pair = Pair(
        make_manager(design, cfg),
        make_real(design, cfg, install),
        cfg,
        compare_ids,
        design == "v1-engine",
    )
    pair.result = result
    pair.skip_swa_fork = not fork_after_window_drop
    return pair


def _with_033_mamba_align(cfg: KVCacheConfig, rng: random.Random) -> KVCacheConfig:
    """On 0.33.0 (no "all" mode) a Mamba caching draw runs "align", two in three with a
    prefill checkpoint block, half with sparse retention (`prefix_cache_retention_interval`
    0, `vllm serve`'s default; `sim.kv.v1_engine.mamba_checkpoint`); other pins unchanged
    (no draw, so their walks stay as they were)."""
    if not VllmPin(cfg.vllm_pin).mamba_align_has_checkpoints:
        return cfg
    return replace(
        cfg,
        mamba_cache_mode="align",
        mamba_prefill_checkpoint_blocks=rng.choice([0, 1, 1]),
        prefix_cache_retention_interval=rng.choice([None, 0]),
    )


def _with_033_retention(cfg: KVCacheConfig, index: int) -> KVCacheConfig:
    """On 0.33.0 every other caching draw without a Mamba group runs sparse retention
    (`prefix_cache_retention_interval` 0, `vllm serve`'s default): a sliding group then
    caches only the window at the replay boundary and the junction
    (`sim.kv.v1_engine.sliding_retention`), full and chunked-local groups stay dense; by the
    workload's index, no rng draw, so the walks stay as they were."""
    if not VllmPin(cfg.vllm_pin).has_prefix_cache_retention or index % 2 == 0:
        return cfg
    return replace(cfg, prefix_cache_retention_interval=0)


def _models_mamba(version: tuple[int, ...]) -> bool:
    """Whether kvsim models Mamba groups on the loaded release (`VllmPin.models_mamba_groups`;
    0.10/0.11 load as 0.11.0)."""
    name = v1_pin_for(version) or VllmPin.V0_11_0.value
    return version[:2] >= (0, 10) and VllmPin(name).models_mamba_groups


def full_variant_kinds(pin: str | None) -> tuple[str, ...]:
    """The sink / R-SWA / circular-buffer kinds kvsim models on the loaded release (none
    before 0.19.1; `sim.kv.v1_engine.full_variants`)."""
    if pin is None:
        return ()
    release = VllmPin(pin)
    flags = (
        release.models_sink_groups,
        release.models_rswa_groups,
        release.models_circular_buffer_groups,
    )
    return tuple(kind for kind, on in zip(FULL_VARIANT_KINDS, flags, strict=True) if on)


def layout_name(config: KVCacheConfig) -> str:
    """The KV-cache layout of a config in words: 'one group', 'full + sliding window',
    'full + chunked-local', 'full + Mamba', 'full + sliding window + Mamba'; the first three
    with ' with sparse retention' under 0.33.0's interval 0."""
    sparse = " with sparse retention" if config.prefix_cache_retention_interval == 0 else ""
    if not config.kv_cache_groups:
        return "one group" + sparse
    if config.has_full_variant_group:
        return _full_variant_layout_name(config)
    if config.has_mamba_group:
        with_window = any(g.sliding_window is not None for g in config.kv_cache_groups)
        if config.enable_prefix_caching:
            return f"full + Mamba, caching ('{config.mamba_cache_mode or 'align'}')"
        return "full + sliding window + Mamba" if with_window else "full + Mamba"
    name = "full + chunked-local" if config.has_chunked_local_group else "full + sliding window"
    return name + sparse


def _full_variant_layout_name(config: KVCacheConfig) -> str:
    """'full + sink', 'full + R-SWA + circular buffer + sliding window + Mamba', ...: the
    types present, in a fixed order (Mamba last, so the Mamba tests' count reads it), then
    ' with caching' when prefix caching is on (`sim.kv.v1_engine.variant_caching`)."""
    groups = config.kv_cache_groups
    present = [
        ("sink", any(g.sink_len is not None for g in groups)),
        ("R-SWA", any(g.rswa_window is not None for g in groups)),
        ("circular buffer", any(g.circular_buffer for g in groups)),
        ("sliding window", any(g.sliding_window is not None for g in groups)),
        ("Mamba", config.has_mamba_group),
    ]
    name = " + ".join(["full"] + [name for name, on in present if on])
    return f"{name} with caching" if config.enable_prefix_caching else name


def _checked_design(design: str, hybrid: bool) -> str:
    """The design's name, or InputError for an unknown one (or `hybrid` outside v1-engine)."""
    try:
        design = Design(design).value
    except ValueError:
        choices = ", ".join(d.value for d in Design)
        raise InputError(f"--design {design!r}: expected one of {choices}") from None
    if hybrid and design != "v1-engine":
        raise InputError("--hybrid: KV-cache groups exist only in the V1 engine (v1-engine)")
    return design


def _ids_comparable(design: str, version: tuple[int, ...]) -> bool:
    """Block ids are compared where the loaded vLLM is the version the design models:
    0.5.x for v0, 0.10 and later for the V1 engine."""
    pinned = _MODELLED_VERSION.get(design)
    return pinned is not None and (
        version[:2] == pinned or (design == "v1-engine" and version[:2] >= (0, 10))
    )


def _run_episode(
    pair: Pair, rng: random.Random, budget: int, next_id: list[int], result: VerifyResult
) -> bool:
    """One workload's walk, its crash counted; False when it diverged (recorded in `result`)."""
    episode = v1_episode if pair.v1 else v0_episode
    try:
        if episode(pair, rng, budget, next_id):
            result.num_crashes += 1
    except Crash:
        result.num_crashes += 1
    except Diverged as d:
        result.divergence = d.divergence
        return False
    return True


__all__ = [
    "Divergence",
    "VerifyResult",
    "make_real",
    "random_config",
    "random_hybrid_config",
    "v1_pin_for",
    "verify",
]
