"""What `kvsim fuzz --vllm-version V --hybrid --async-mix` changes in a drawn case.

A `CaseVariant` is applied to a case's scenario data after `sim.ci.fuzz_cases` has drawn it,
from streams of its own (`np.random.SeedSequence(seed, spawn_key=...)`), so a case seed stands
for the same cache, scheduler and workload with or without a variant; only what the variant
names changes:

* `vllm_version`: every case runs that pin (`scheduler.vllm_version`); a disaggregated case is
  not drawn (kvsim's P/D flow is vLLM 0.11.0's, `fuzz_cases.generate_disagg_case`).
* `hybrid` (V1 engine): one case in `HYBRID_ONE_IN` without a KV connector becomes a hybrid
  model, half its layers sliding (window 1..6 blocks' worth of tokens) and half full
  attention, so the V1 engine builds two KV-cache groups over one pool
  (`sim.kv.v1_engine.hybrid_coordinator`). The pool grows by the full group's share of a
  max-length request, ``cdiv(max_model_len, bs) + 1`` blocks, so that the startup check
  (`sim.scenario.startup.check_cache_fits`) still passes for every drawn max_model_len.
  Example: bs 4, 20 blocks, max_model_len 40 -> 20 + 10 + 1 = 31 blocks.
* `group_types` (V1 engine, with `hybrid`): a hybrid case gives its layout as
  `cache.kv_cache_groups` instead, drawn from every group type kvsim models on the case's
  release (`group_layout`): 1-2 full groups and 1-2 groups of each of one or two types among
  sliding or chunked-local (one of them), Mamba, sink, R-SWA and circular buffer. Prefix caching stays as drawn where kvsim models
  it over the layout (no Mamba group; `sim.kv.v1_engine.variant_caching`), else off. The
  pool grows by each group's share of a max-length request and the sink blocks. Without a
  Mamba group, and with caching on over a variant, the full-type groups come first (kvsim
  refuses sliding or chunked group ids between full ones there).
  Example (bs 4, max_model_len 40, groups [full, rswa 5, circular buffer]): + 11 + 11 + 1.
* `async_mix` (V1 engine): `scheduler.async_scheduling` drawn as the release default (None),
  on or off, a third each; a case with a KV connector (CPU offloading) keeps the release
  default, because vLLM refuses async scheduling with a connector it cannot overlap
  (`sim.scheduler.v1.async_scheduler.make_v1_scheduler`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.kv.config import Design, KVCacheGroupSpec
from sim.kv.pins import VllmPin, resolve_pin
from sim.kv.types import cdiv
from sim.kv.v1_engine.variant_caching import split_variant_groups

#: One case in this many becomes hybrid under `--hybrid`.
HYBRID_ONE_IN = 2
#: Spawn keys of the variant's streams (after the sessions and disaggregation streams, 4 and 5).
_HYBRID_STREAM = 6
_ASYNC_STREAM = 7
_GROUPS_STREAM = 8

#: The geometry of the hybrid fuzz model: small, so its KV bytes and weights mean nothing with
#: a given pool and linear step times; only its layer pattern matters.
_HYBRID_MODEL = {
    "name": "fuzz-hybrid",
    "num_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "vocab_size": 1024,
    "max_position_embeddings": 1 << 20,
    "layer_pattern": "alternating",
}


@dataclass(frozen=True, slots=True)
class CaseVariant:
    """What a fuzz run varies beyond the base cases (all off: the base cases unchanged)."""

    vllm_version: str | None = None
    hybrid: bool = False
    async_mix: bool = False
    group_types: bool = False

    @property
    def is_base(self) -> bool:
        """True when the variant changes nothing (kvsim's own (no upstream counterpart))."""
        return (
            self.vllm_version is None
            and not self.hybrid
            and not self.async_mix
            and not self.group_types
        )

    def flags(self) -> str:
        """The `kvsim fuzz` options that select this variant, for replay commands."""
        parts = []
        if self.vllm_version is not None:
            parts.append(f" --vllm-version {self.vllm_version}")
        if self.hybrid:
            parts.append(" --hybrid")
        if self.async_mix:
            parts.append(" --async-mix")
        if self.group_types:
            parts.append(" --group-types")
        return "".join(parts)


def _stream(seed: int, key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,)))


def apply_variant(data: dict, design: Design, seed: int, variant: CaseVariant) -> None:
    """Change case `seed`'s scenario data in place as `variant` says (see the module doc)."""
    scheduler, cache = data["scheduler"], data["cache"]
    if variant.vllm_version is not None:
        scheduler["vllm_version"] = variant.vllm_version
    if design is not Design.V1_ENGINE:
        return
    has_connector = bool(cache.get("cpu_offload_gib"))
    if variant.hybrid and data["model"] is None and not has_connector:
        rng = _stream(seed, _HYBRID_STREAM)
        if int(rng.integers(HYBRID_ONE_IN)) == 0 and variant.group_types:
            _apply_group_layout(data, _stream(seed, _GROUPS_STREAM))
        elif variant.group_types:
            pass
        elif int(rng.integers(HYBRID_ONE_IN)) == 0:
            block_size = cache["block_size"]
            window = int(rng.integers(1, 6 * block_size + 1))
            data["model"] = {**_HYBRID_MODEL, "sliding_window": window}
            cache["sliding_window"] = "model"
            cache["num_gpu_blocks"] += cdiv(scheduler["max_model_len"], block_size) + 1
    if variant.async_mix and not has_connector:
        choice = int(_stream(seed, _ASYNC_STREAM).integers(3))
        if choice:
            scheduler["async_scheduling"] = choice == 1


#: No variant: the base cases.
BASE_CASES = CaseVariant()


def group_layout(rng: np.random.Generator, pin: VllmPin, block_size: int) -> list[dict]:
    """`cache.kv_cache_groups` of a `group_types` case: 1-2 full groups and 1-2 groups of each
    of one or two types kvsim models on `pin` (sliding or chunked-local, not both), shuffled. Example (0.33.0):
    ``[{}, {"rswa_window": 5}, {"circular_buffer": True}]``."""
    # One of sliding / chunked-local: kvsim's coordinator takes one other attention type.
    types = [str(rng.choice(["sliding", "chunked"]))]
    types += ["mamba"] if pin.models_mamba_groups else []
    types += ["sink"] if pin.models_sink_groups else []
    types += ["rswa"] if pin.models_rswa_groups else []
    types += ["ring"] if pin.models_circular_buffer_groups else []
    groups: list[dict] = [{}] * int(rng.integers(1, 3))
    for kind in rng.choice(types, size=int(rng.integers(1, 3)), replace=False):
        spec = _group_of(str(kind), rng, block_size)
        groups += [spec] * int(rng.integers(1, 3))
    order = rng.permutation(len(groups))
    return [groups[i] for i in order]


def _group_of(kind: str, rng: np.random.Generator, block_size: int) -> dict:
    """One group spec of `kind`, in the scenario's spelling (windows up to 6 blocks)."""
    tokens = int(rng.integers(1, 6 * block_size + 1))
    if kind == "sliding":
        return {"sliding_window": tokens}
    if kind == "chunked":
        return {"attention_chunk_size": tokens}
    if kind == "sink":
        return {"sink_len": block_size * int(rng.integers(1, 4))}
    if kind == "rswa":
        return {"rswa_window": tokens}
    return {"mamba": True} if kind == "mamba" else {"circular_buffer": True}


def _apply_group_layout(data: dict, rng: np.random.Generator) -> None:
    """Give case `data` a `group_layout` (module docstring). A case routed
    prefix_cache_aware needs caching (`fuzz_cases._cluster`): its layout is redrawn until
    kvsim models caching over it (no Mamba group), up to 20 times, else left as it was."""
    scheduler, cache = data["scheduler"], data["cache"]
    pin = resolve_pin(Design.V1_ENGINE, scheduler.get("vllm_version"))
    block_size, max_model_len = cache["block_size"], scheduler["max_model_len"]
    needs_caching = (data.get("engine") or {}).get("router") == "prefix_cache_aware"
    for _ in range(20):
        groups = group_layout(rng, pin, block_size)
        specs = tuple(KVCacheGroupSpec(**g) for g in groups)
        if _caching_modelled(specs) or not needs_caching:
            break
    else:
        return
    if not _caching_modelled(specs):
        cache["enable_prefix_caching"] = False
    any_order = any(s.mamba for s in specs) or (
        any(s.is_full_variant for s in specs) and not cache.get("enable_prefix_caching")
    )
    if not any_order:
        # kvsim's hybrid coordinator refuses full and sliding / chunked group ids that
        # interleave (the 0.11.0 rule it follows): full-type groups first.
        keyed = sorted(zip(specs, groups, strict=True), key=lambda p: not _is_full_type(p[0]))
        groups = [group for _, group in keyed]
    cache["kv_cache_groups"] = groups
    cache["sliding_window"] = None
    per_request = cdiv(max_model_len, block_size) + 1
    cache["num_gpu_blocks"] += sum(
        1 if s.mamba or s.circular_buffer else per_request + (s.sink_len or 0) // block_size
        for s in specs
    )


def _caching_modelled(specs: tuple[KVCacheGroupSpec, ...]) -> bool:
    """Whether kvsim models prefix caching over the layout: no Mamba group (0.33.0's "align"
    mode is not modelled; earlier releases' takes full + Mamba only), and a variant layout
    `split_variant_groups` accepts."""
    if any(s.mamba for s in specs):
        return False
    if any(s.is_full_variant for s in specs):
        try:
            split_variant_groups(specs)
        except ValueError:
            return False
    return True


def _is_full_type(spec: KVCacheGroupSpec) -> bool:
    """Full attention, sink or R-SWA: a `FullAttentionSpec` upstream."""
    return spec.is_full_attention or spec.rswa_window is not None
