"""The V1 engine's hybrid memory layout: which layers form which KV-cache group, and the pool.

Follows vLLM 0.11.0 `vllm/v1/core/kv_cache_utils.py`:

* layers are grouped by KV-cache spec, in order of first appearance (`L957-962`);
* `group_size` is the smallest layer count among the specs (the "1" of an n:1 pattern), and
  each spec's layers are split into ``cdiv(n, group_size)`` groups, group i taking
  ``layers[i::num_groups]``, the last one padded (`L964-1001`);
* every group draws from one block pool; ``group_size`` memory pools each hold one layer of
  every group, so one block spans ``group_size`` layers and
  ``num_blocks = available // page_size // group_size`` (`L1040-1064`, `get_num_blocks`
  `L813-827`);
* vLLM logs the pool as ``num_blocks // num_groups * block_size`` tokens (`L1078-1080`).

kvsim has one block size and one page size for all layers, which is what 0.11.0 requires
of a hybrid model (`L894-956`: uniform page size; a Mamba hybrid gets there by page-size
unification, `sim.kv.v1_engine.model_layout`). From 0.19.1 the largest layer count is the
`group_size` when it is under 1.5x the smallest (`VllmPin.pads_hybrid_groups_to_largest`;
`kv_cache_planning.py:L521-532 @0.33.0`): `group_layers(..., pad_to_largest=True)`. Equal
counts (Gemma-2, gpt-oss) give the same layout either way. Layers without a cache (Nemotron-H's
MLP layers) are in no group. Left out: 0.33.0's merge of same-type buckets whose
`FullAttentionSpec`s differ only in window or chunk (`L484-505`: only under
`--disable-hybrid-kv-cache-manager`, which kvsim does not model), and the packed layout of
mixed page sizes (`_get_packed_kv_cache_groups`, `L914-1041`: unreachable once pages are equal).

Worked example (Gemma-2-9B: 42 layers, even layers sliding with W=4096, odd layers full):
specs in order of appearance are sliding (layer 0) then full (layer 1), 21 layers each, so
``group_size = 21`` and there are 2 groups: group 0 = sliding layers 0, 2, ..., 40 and
group 1 = full layers 1, 3, ..., 41. With 20,000 blocks vLLM reports
``20,000 // 2 * 16 = 160,000`` tokens. Gemma-3-style 5:1 over 12 layers (layers 5 and 11
full): ``group_size = 2``, 5 sliding groups then 1 full group, 6 in all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.kv.config import KVCacheGroupSpec
from sim.kv.types import cdiv


@dataclass(frozen=True, slots=True)
class HybridLayout:
    """The groups of a model's layers (group ids are tuple indices)."""

    groups: tuple[KVCacheGroupSpec, ...]
    #: Layer indices of each group (the last group of a spec may hold fewer: padding).
    group_layers: tuple[tuple[int, ...], ...]
    #: Layers per group; one block spans this many layers.
    group_size: int

    @property
    def num_groups(self) -> int:
        """The number of KV-cache groups (kvsim's own (no upstream counterpart))."""
        return len(self.groups)

    @property
    def num_padding_layers(self) -> int:
        """Padding slots: memory vLLM reserves for layers that do not exist.

        kvsim's own (no upstream counterpart).
        """
        return sum(self.group_size - len(layers) for layers in self.group_layers)

    def num_blocks(self, available_bytes: int, page_bytes_per_layer: int) -> int:
        """``available // page // group_size`` (`get_num_blocks`, `kv_cache_utils.py:L813-827`)."""
        return int(available_bytes // page_bytes_per_layer // self.group_size)

    def reported_tokens(self, num_blocks: int, block_size: int) -> int:
        """What vLLM logs as "GPU KV cache size": ``num_blocks // num_groups * block_size``.

        kvsim's own (no upstream counterpart).
        """
        return num_blocks // self.num_groups * block_size


def hybrid_layout(layer_windows: Sequence[int | None]) -> HybridLayout:
    """Group layers given each layer's sliding window (None: full attention), 0.11.0's rule.

    Example: ``hybrid_layout([4096, None] * 21)`` -> 2 groups (sliding, full) of 21 layers.

    kvsim's own (no upstream counterpart).
    """
    return group_layers([KVCacheGroupSpec(sliding_window=w) for w in layer_windows])


def group_layers(
    layer_specs: Sequence[KVCacheGroupSpec | None], *, pad_to_largest: bool = False
) -> HybridLayout:
    """Group layers by spec as `_get_kv_cache_groups_uniform_page_size` does
    (`kv_cache_utils.py:L957-1001 @0.11.0`); None is a layer without a cache.
    `pad_to_largest`: 0.19.1's group size rule (`VllmPin.pads_hybrid_groups_to_largest`).

    Example: ``group_layers([S, S, F])`` (S sliding, F full) -> group 0 = layers (0,),
    group 1 = (1,), group 2 = (2,); with ``pad_to_largest`` (2 < 1.5 x 1 is false) the same.
    """
    by_spec: dict[KVCacheGroupSpec, list[int]] = {}
    for index, spec in enumerate(layer_specs):
        if spec is not None:
            by_spec.setdefault(spec, []).append(index)
    if not by_spec:
        raise ValueError("a model needs at least one attention layer")
    counts = [len(layers) for layers in by_spec.values()]
    group_size = min(counts)
    if pad_to_largest and max(counts) < group_size * 1.5:
        group_size = max(counts)
    groups: list[KVCacheGroupSpec] = []
    group_layers_: list[tuple[int, ...]] = []
    for spec, layers in by_spec.items():
        num_groups = cdiv(len(layers), group_size)
        for i in range(num_groups):
            groups.append(spec)
            group_layers_.append(tuple(layers[i::num_groups]))
    return HybridLayout(tuple(groups), tuple(group_layers_), group_size)


def alternating_layer_windows(num_layers: int, sliding_window: int) -> list[int | None]:
    """Gemma-2's pattern: even layers sliding, odd layers full (HF `is_sliding`).

    Example: ``alternating_layer_windows(4, 8)`` -> ``[8, None, 8, None]``.

    kvsim's own (no upstream counterpart).
    """
    return [sliding_window if index % 2 == 0 else None for index in range(num_layers)]
