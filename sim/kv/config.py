"""Cache configuration shared by every block-manager design, and the design registry."""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from sim.kv.protocol import V0BlockManager, V1KVCacheManager


class Design(enum.Enum):
    """The block-manager designs kvsim models, each pinned to one upstream version."""

    #: v0 BlockSpaceManagerV1, vLLM 0.5.4 (same decisions at fc93e56; ring reuse for sliding
    #: window). Pins: `sim.kv.pins`.
    V0_V1 = "v0-v1"
    #: v0 BlockSpaceManagerV2, vLLM 0.5.4 release, or 0.5.4 + #7380 by `vllm_pin` (null-block
    #: drop; the can_allocate undercount).
    V0_V2 = "v0-v2"
    #: v0 V2 with a sliding-window block table that admits what it allocates (kvsim's fix).
    V0_FIXED = "v0-fixed"
    #: V1-engine KVCacheManager, vLLM ~0.10 @ 4ac7713, or a later release by `vllm_pin`
    #: ("0.11.0", "0.33.0"; see `sim.kv.pins`).
    V1_ENGINE = "v1-engine"

    @property
    def api(self) -> str:
        """The engine API the design's manager serves: 'v0' or 'v1'."""
        return "v1" if self is Design.V1_ENGINE else "v0"

    @property
    def upstream(self) -> str:
        """The vLLM release and engine this design models, for plot titles and reports.

        Example: ``Design("v0-v2").upstream == "vLLM 0.5.4 v0, BlockSpaceManagerV2"``.
        """
        return _UPSTREAM[self]

    def upstream_at(self, vllm_version: str | None) -> str:
        """`upstream`, naming the pinned release where the design has several.

        Example: ``Design("v1-engine").upstream_at("0.33.0") == "vLLM 0.33.0 V1 engine"``;
        ``Design("v0-v2").upstream_at("0.5.4+7380") == "vLLM 0.5.4 + #7380 v0, BlockSpaceManagerV2"``
        (`sim.kv.pins`).
        """
        if vllm_version is None:
            return self.upstream
        from sim.kv.pins import VllmPin, find_pin, resolve_pin

        if self is not Design.V1_ENGINE:
            words = resolve_pin(self, vllm_version).words
            if self is Design.V0_FIXED:
                return f"kvsim's corrected v0 on {words} v0 code (no vLLM release)"
            return f"{words} v0, {_V0_MANAGER[self]}"
        # A real run records the install's version, which may name no pin ('0.6.5.dev').
        if find_pin(vllm_version) is VllmPin.C4AC7713:
            return "vLLM ~0.10 V1 engine @ 4ac7713"
        return f"vLLM {vllm_version} V1 engine"


_V0_MANAGER = {Design.V0_V1: "BlockSpaceManagerV1", Design.V0_V2: "BlockSpaceManagerV2"}

#: The one place that says which vLLM each design follows (commits: see the class above).
_UPSTREAM = {
    Design.V0_V1: "vLLM 0.5.4 v0, BlockSpaceManagerV1",
    Design.V0_V2: "vLLM 0.5.4 v0, BlockSpaceManagerV2",
    Design.V0_FIXED: "kvsim's corrected v0 (no vLLM release)",
    Design.V1_ENGINE: "vLLM V1 engine (4ac7713, 0.11.0 or 0.33.0 by scheduler.vllm_version)",
}


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    """One KV-cache group of the V1 engine's hybrid allocator: full attention (nothing set),
    sliding-window attention of `sliding_window` tokens, chunked-local attention in chunks
    of `attention_chunk_size` tokens (Llama-4's RoPE layers; `ChunkedLocalAttentionSpec`,
    `vllm/v1/kv_cache_interface.py (0.11.0)`), or a Mamba / linear-attention state group
    (`mamba`; `MambaSpec`, `L1094-1166 (0.33.0)`: Qwen3.5-style hybrids, Nemotron-H, Jamba,
    `sim.kv.v1_engine.mamba`), or one of full attention's variants
    (`sim.kv.v1_engine.full_variants`): full attention with `sink_len` static sink tokens
    (`SinkFullAttentionSpec`, 0.19.1 on), reference sliding-window attention keeping the
    prompt and the last `rswa_window` generated tokens (`RSWASpec`, 0.25.1 on), or a
    `circular_buffer` of one block per request (`CircularBufferSpec`, 0.33.0); its layers
    share one block table."""

    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    mamba: bool = False
    sink_len: int | None = None
    rswa_window: int | None = None
    circular_buffer: bool = False

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, got {self.sliding_window}")
        if self.attention_chunk_size is not None and self.attention_chunk_size <= 0:
            raise ValueError(
                f"attention_chunk_size must be positive, got {self.attention_chunk_size}"
            )
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            raise ValueError("a KV-cache group is sliding-window or chunked-local, not both")
        if self.mamba and not (self.sliding_window is None and self.attention_chunk_size is None):
            raise ValueError("a Mamba KV-cache group has no sliding_window or attention_chunk_size")
        for name in ("sink_len", "rswa_window"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        kinds = [
            self.sliding_window is not None,
            self.attention_chunk_size is not None,
            self.mamba,
            self.sink_len is not None,
            self.rswa_window is not None,
            self.circular_buffer,
        ]
        if sum(kinds) > 1:
            raise ValueError(
                "a KV-cache group is one of sliding_window, attention_chunk_size, mamba, "
                "sink_len, rswa_window, circular_buffer"
            )

    @property
    def is_full_attention(self) -> bool:
        """Plain full attention or with static sinks (whose manager is full attention's):
        every earlier token is read, nothing is freed while running."""
        return (
            self.sliding_window is None
            and self.attention_chunk_size is None
            and not self.mamba
            and self.rswa_window is None
            and not self.circular_buffer
        )

    @property
    def is_full_variant(self) -> bool:
        """A sink, R-SWA or circular-buffer group (`sim.kv.v1_engine.full_variants`)."""
        return self.sink_len is not None or self.rswa_window is not None or self.circular_buffer

    @property
    def kind(self) -> str:
        """The group in words: 'full', 'sliding 4096', 'chunked 8192', 'mamba', 'sink 64',
        'rswa 128' or 'circular buffer' (errors, the terminal summary, the lockstep layouts)."""
        if self.mamba:
            return "mamba"
        if self.attention_chunk_size is not None:
            return f"chunked {self.attention_chunk_size}"
        if self.sliding_window is not None:
            return f"sliding {self.sliding_window}"
        if self.sink_len is not None:
            return f"sink {self.sink_len}"
        if self.rswa_window is not None:
            return f"rswa {self.rswa_window}"
        if self.circular_buffer:
            return "circular buffer"
        return "full"


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    """What a block manager is built from.

    `watermark` is a fraction of the GPU pool kept free at admission by the v0 designs
    (vLLM always uses 0.01; `int(0.01 * 10) == 0` blocks for a 10-block pool).
    """

    num_gpu_blocks: int
    block_size: int = 16
    num_cpu_blocks: int = 0
    sliding_window: int | None = None
    enable_prefix_caching: bool = False
    watermark: float = 0.01
    max_model_len: int | None = None
    #: The name of the `sim.kv.pins.VllmPin` the design follows (`manager_pin` resolves it;
    #: None: the behaviour a manager always had, `UNPINNED_MANAGER`). v0: "0.5.4" selects
    #: the vLLM 0.5.4 wheel's v0-V2 block table, which predates #7380 (see
    #: `sim.kv.v0_v2.block_table`); None and "0.5.4+7380" have the fix (a scenario's runs get
    #: "0.5.4" unless they name another). v1-engine: "4ac7713" (= None), "0.11.0" or "0.33.0".
    vllm_pin: str | None = None
    #: The V1 engine's KV-cache groups in group-id order, for a hybrid model (full,
    #: sliding-window, chunked-local or Mamba layers; `sim.kv.v1_engine.hybrid_layout`; a
    #: Mamba group's blocks are `max_model_len` tokens). Empty: one group, sliding
    #: when `sliding_window` is set. `num_gpu_blocks` is then the shared pool of all groups.
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = ()
    #: The scheduler's token budget, as vLLM 0.20.0's `KVCacheManager(max_num_batched_tokens=)`
    #: takes it for the sliding-window cap inside every block count (`sim.kv.pins.AdmissionCap`);
    #: None: max_model_len, as upstream defaults it. No other pin reads it here.
    max_num_batched_tokens: int | None = None
    #: With Mamba groups and prefix caching: vLLM's `mamba_cache_mode`, "align" (None means
    #: it) or "all" (0.19.1-0.26.0; `sim.kv.v1_engine.mamba`). Unread otherwise.
    mamba_cache_mode: str | None = None
    #: vLLM 0.33.0 "align" only: the Mamba spec's `num_prefill_checkpoint_blocks` (0 or 1; 1
    #: for Mamba2 layers and FlashInfer GDN, `sim.kv.v1_engine.mamba_checkpoint`).
    mamba_prefill_checkpoint_blocks: int = 0
    #: vLLM 0.33.0 only: `prefix_cache_retention_interval`, None (dense: every state a chunk
    #: end writes is cached, every sliding block a hit can reach; `KVCacheConfig`'s field
    #: default) or 0 (`vllm serve`'s default: only the replay boundary and the shared-prefix
    #: junction keep a Mamba state, `sim.kv.v1_engine.mamba_checkpoint`, or a sliding
    #: window's blocks, `sim.kv.v1_engine.sliding_retention`; full and chunked-local groups
    #: ignore it). A positive interval is refused.
    prefix_cache_retention_interval: int | None = None

    def __post_init__(self) -> None:
        if self.mamba_cache_mode not in (None, "align", "all"):
            raise ValueError(
                f"mamba_cache_mode must be 'align' or 'all', got {self.mamba_cache_mode!r}"
            )
        if self.mamba_prefill_checkpoint_blocks not in (0, 1):
            raise ValueError(
                "mamba_prefill_checkpoint_blocks must be 0 or 1, got "
                f"{self.mamba_prefill_checkpoint_blocks}"
            )
        if self.prefix_cache_retention_interval not in (None, 0):
            raise ValueError(
                "prefix_cache_retention_interval: a positive interval (periodic sparse "
                "retention) is not modelled; use 0 or None"
            )
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.num_gpu_blocks <= 0:
            raise ValueError(f"num_gpu_blocks must be positive, got {self.num_gpu_blocks}")
        if self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {self.num_cpu_blocks}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, got {self.sliding_window}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens <= 0:
            raise ValueError(
                f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}"
            )

    @property
    def group_windows(self) -> tuple[int | None, ...]:
        """Each KV-cache group's window in group-id order (None: full attention); one group,
        `sliding_window`'s, when there are no hybrid groups. Example: Gemma-2's layout ->
        (4096, None); a Mistral config -> (4096,); a full-attention one -> (None,)."""
        return tuple(g.sliding_window for g in self.kv_cache_groups) or (self.sliding_window,)

    @property
    def group_specs(self) -> tuple[KVCacheGroupSpec, ...]:
        """Each KV-cache group's spec in group-id order; one group, `sliding_window`'s, when
        there are no hybrid groups. Example: Llama-4-Scout's layout -> three chunked-local
        groups of 8,192-token chunks and one full group."""
        return self.kv_cache_groups or (KVCacheGroupSpec(sliding_window=self.sliding_window),)

    @property
    def has_chunked_local_group(self) -> bool:
        """Whether any group is chunked-local attention."""
        return any(g.attention_chunk_size is not None for g in self.kv_cache_groups)

    @property
    def has_mamba_group(self) -> bool:
        """Whether any group is a Mamba (linear-attention) state group."""
        return any(g.mamba for g in self.kv_cache_groups)

    @property
    def has_full_variant_group(self) -> bool:
        """Whether any group is a sink, R-SWA or circular-buffer group."""
        return any(g.is_full_variant for g in self.kv_cache_groups)

    @property
    def watermark_blocks(self) -> int:
        """`int(watermark * G)`: 20 blocks for G=2048 at 0.01 (vLLM truncates)."""
        return int(self.watermark * self.num_gpu_blocks)


_DESIGN_CLASSES = {
    Design.V0_V1: ("sim.kv.v0_v1.manager", "BlockSpaceManagerV1"),
    Design.V0_V2: ("sim.kv.v0_v2", "BlockSpaceManagerV2"),
    Design.V0_FIXED: ("sim.kv.v0_fixed.manager", "CorrectedBlockSpaceManager"),
    Design.V1_ENGINE: ("sim.kv.v1_engine", "make_kv_cache_manager"),
}


def make_manager(design: Design | str, config: KVCacheConfig) -> V0BlockManager | V1KVCacheManager:
    """Build the model of `design` over `config` (for the V1 engine, the hybrid manager when
    the config has several KV-cache groups)."""
    design = Design(design)
    module_name, class_name = _DESIGN_CLASSES[design]
    cls: Callable[[KVCacheConfig], V0BlockManager | V1KVCacheManager] = getattr(
        importlib.import_module(module_name), class_name
    )
    return cls(config)
