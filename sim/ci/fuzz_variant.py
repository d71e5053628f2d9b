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
  (`sim.scenario.resolve._check_cache_fits`) still passes for every drawn max_model_len.
  Example: bs 4, 20 blocks, max_model_len 40 -> 20 + 10 + 1 = 31 blocks.
* `async_mix` (V1 engine): `scheduler.async_scheduling` drawn as the release default (None),
  on or off, a third each; a case with a KV connector (CPU offloading) keeps the release
  default, because vLLM refuses async scheduling with a connector it cannot overlap
  (`sim.scheduler.v1.async_scheduler.make_v1_scheduler`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.kv.config import Design
from sim.kv.types import cdiv

#: One case in this many becomes hybrid under `--hybrid`.
HYBRID_ONE_IN = 2
#: Spawn keys of the variant's streams (after the sessions and disaggregation streams, 4 and 5).
_HYBRID_STREAM = 6
_ASYNC_STREAM = 7

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

    @property
    def is_base(self) -> bool:
        """True when the variant changes nothing (kvsim's own (no upstream counterpart))."""
        return self.vllm_version is None and not self.hybrid and not self.async_mix

    def flags(self) -> str:
        """The `kvsim fuzz` options that select this variant, for replay commands."""
        parts = []
        if self.vllm_version is not None:
            parts.append(f" --vllm-version {self.vllm_version}")
        if self.hybrid:
            parts.append(" --hybrid")
        if self.async_mix:
            parts.append(" --async-mix")
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
        if int(rng.integers(HYBRID_ONE_IN)) == 0:
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
