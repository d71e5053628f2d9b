"""What vLLM refuses at startup, refused by kvsim before a run (one line naming the field).

Each rule is the check of the pinned release the design follows (v0 designs: vLLM 0.5.4;
v1-engine: its `scheduler.vllm_version`, 4ac7713 / 0.11.0 / 0.33.0). The sources are the
installed copies under `.vllm/<version>/` (`scripts/setup_vllm.sh`):

* token budget (`SchedulerConfig`): `max_num_batched_tokens < max_model_len` without chunked
  prefill, and `max_num_batched_tokens < max_num_seqs`, are a ValueError:
  0.5.4 `vllm/config.py` `SchedulerConfig._verify_args` L834-849; 0.11.0
  `vllm/config/scheduler.py` `_verify_args` L234-249; 0.33.0 `vllm/config/scheduler.py`
  `verify_max_model_len` L317-335. (4ac7713, a ~0.10 commit with no copy installed, is held
  to the same two checks, which every release between 0.5.4 and 0.33.0 has.) kvsim used to
  raise the budget silently on v1-engine and ignore every prompt longer than it on v0.
* 0.33.0 also refuses `long_prefill_token_threshold > max_model_len` (`verify_max_model_len`
  L355-360); 0.11.0 only with `max_num_partial_prefills > 1` (L272-277), which kvsim has not.
* tensor parallelism (`ModelConfig.verify_with_parallel_config`): the attention heads must
  divide by the TP size (0.5.4 `vllm/config.py` L272-276; 0.11.0 `vllm/config/model.py`
  L1048-1052; 0.33.0 `vllm/config/model.py` L1559-1563). `QKVParallelLinear` then splits the
  KV heads with `divide` (0.5.4 `model_executor/layers/linear.py` L537-542, 0.11.0 L902-907,
  0.33.0 L1066-1070): TP divides them, or, where TP is larger, they divide TP (replicated).

Example: v0-v2, max_model_len 4096, `max_num_batched_tokens: 2048`, no chunked prefill ->
"scheduler.max_num_batched_tokens: 2048 is smaller than max_model_len 4096 ...".

The KV pool's own checks, once it is sized: a sliding window with what the v0 engine refuses
beside it (`check_v0_window`); one max_model_len request fitting the pool (`check_cache_fits`);
and, where the release's full-sequence admission gate charges such a request more than the
pool has although startup accepted it, a `startup_gate_mismatch` finding
(`full_sequence_reserve`, `startup_gate_mismatch`), recorded first in the run.
"""

from __future__ import annotations

from sim.audit.violations import Violation, ViolationKind
from sim.catalog import ModelSpec
from sim.kv.config import Design, KVCacheConfig
from sim.kv.pins import AdmissionCap, VllmPin, resolve_pin
from sim.planning.admission_reserve import AdmissionReserve, admission_reserve
from sim.scenario.full_variants import num_sink_blocks
from sim.scenario.schema import ScenarioError
from sim.scheduler import SchedulerConfig


def _budget_said(config: SchedulerConfig, token_budget: int, api: str) -> str:
    """'2048' when given, else '512 (the v0 default with chunked prefill)' and so on."""
    if config.max_num_batched_tokens is not None:
        return str(token_budget)
    mode = "with" if config.enable_chunked_prefill else "without"
    return f"{token_budget} (the {api} default {mode} chunked prefill)"


def check_token_budget(
    design: Design, release: str, config: SchedulerConfig, token_budget: int
) -> None:
    """vLLM's `SchedulerConfig` checks of the resolved budget (see the module docstring).

    >>> check_token_budget(Design.V0_V2, "0.5.4", SchedulerConfig(256, 16, 16, True), 16)
    >>> check_token_budget(Design.V0_V2, "0.5.4", SchedulerConfig(256, 16, 100), 100)
    Traceback (most recent call last):
    ...
    sim.scenario.schema.ScenarioError: scheduler.max_num_batched_tokens: 100 is smaller than \
max_model_len 256 without chunked prefill; vLLM 0.5.4 refuses to start (set \
scheduler.enable_chunked_prefill: true, or a budget of at least 256)
    """
    said = _budget_said(config, token_budget, design.api)
    where = "scheduler.max_num_batched_tokens"
    if token_budget < config.max_model_len and not config.enable_chunked_prefill:
        raise ScenarioError(
            f"{where}: {said} is smaller than max_model_len {config.max_model_len} without "
            f"chunked prefill; vLLM {release} refuses to start (set "
            f"scheduler.enable_chunked_prefill: true, or a budget of at least "
            f"{config.max_model_len})"
        )
    if token_budget < config.max_num_seqs:
        raise ScenarioError(
            f"{where}: {said} is smaller than scheduler.max_num_seqs {config.max_num_seqs}; "
            f"vLLM {release} refuses to start (a budget of at least {config.max_num_seqs})"
        )
    threshold = config.long_prefill_token_threshold
    if (
        resolve_pin(design, release).bounds_long_prefill_threshold
        and threshold > config.max_model_len
    ):
        raise ScenarioError(
            f"scheduler.long_prefill_token_threshold: {threshold} is larger than max_model_len "
            f"{config.max_model_len}; vLLM 0.33.0 refuses to start"
        )


def check_tensor_parallel(
    model: ModelSpec | None,
    tp: int,
    release: str | None,
    where: str = "hardware.tensor_parallel_size",
) -> None:
    """The heads split across `tp` GPUs as vLLM splits them, or refused (module docstring);
    `where` names the setting (`--tp` for `kvsim step`), `release` the vLLM (None: any).

    >>> from sim.catalog import get_model
    >>> check_tensor_parallel(get_model("llama-3.1-8b"), 16, "0.33.0")  # 8 KV heads, replicated
    >>> check_tensor_parallel(get_model("llama-3.1-8b"), 3, "0.33.0")
    Traceback (most recent call last):
    ...
    sim.scenario.schema.ScenarioError: hardware.tensor_parallel_size: 3 does not divide \
llama-3.1-8b's 32 attention heads; vLLM 0.33.0 refuses to start (use a divisor of 32)
    """
    if model is None or tp == 1:
        return
    heads, kv_heads = model.num_attention_heads, model.num_kv_heads
    vllm = f"vLLM {release}" if release else "vLLM (0.5.4, 0.11.0 and 0.33.0 alike)"
    if heads % tp:
        raise ScenarioError(
            f"{where}: {tp} does not divide {model.name}'s {heads} attention heads; "
            f"{vllm} refuses to start (use a divisor of {heads})"
        )
    if (kv_heads % tp if tp <= kv_heads else tp % kv_heads) != 0:
        raise ScenarioError(
            f"{where}: {tp} neither divides nor is a multiple of {model.name}'s {kv_heads} KV "
            f"heads; {vllm} cannot split them (QKVParallelLinear)"
        )


def check_v0_window(design: Design, kv: KVCacheConfig, chunked_prefill: bool) -> None:
    """Pairs vLLM 0.5.4's v0 engine refuses at startup with a sliding window: bad input, said
    before the block manager is built (which would raise as upstream does).

    * prefix caching, any v0 block manager (`CacheConfig._verify_prefix_caching`,
      config.py:L492-499 @v0.5.4);
    * chunked prefill with BlockSpaceManagerV1 (`EngineArgs.create_engine_config`,
      arg_utils.py:L855-860 @v0.5.4; the V2 manager is allowed).

    Regression: `--set cache.enable_prefix_caching=true` on the bundled Mistral (4,096-token
    window) scenario reached the v0 manager's ValueError and was reported as a kvsim bug; and
    v0-v1 ran chunked prefill with a window, which vLLM never does.
    """
    if design.api != "v0" or kv.sliding_window is None:
        return
    window = f"a sliding window (here {kv.sliding_window} tokens)"
    if kv.enable_prefix_caching:
        raise ScenarioError(
            f"cache.enable_prefix_caching: vLLM's v0 engine refuses prefix caching with "
            f"{window}; set it to false, or use scheduler.design: v1-engine"
        )
    if chunked_prefill and design is Design.V0_V1:
        raise ScenarioError(
            f"scheduler.enable_chunked_prefill: vLLM's v0 BlockSpaceManagerV1 refuses chunked "
            f"prefill with {window}; set it to false, or use scheduler.design: v0-v2"
        )


def full_sequence_reserve(
    release: VllmPin, kv: KVCacheConfig, max_model_len: int, bound_tokens: int
) -> AdmissionReserve | None:
    """The full-sequence gate's charge for a max_model_len request against what it holds
    once processed (`sim.planning.admission_reserve`, vllm #54703), where the release has
    the gate and a group has a window; None where nothing is reserved."""
    specs = kv.group_specs
    if not release.has_full_sequence_gate or all(g.is_full_attention for g in specs):
        return None
    in_flight = None if release.admission_cap is AdmissionCap.NONE else bound_tokens
    reserve = admission_reserve(
        tuple(g.sliding_window for g in specs),
        # A Mamba group's block is max_model_len tokens: charged one, holding one; so is a
        # circular buffer's one block (sink and R-SWA groups are charged as full attention).
        tuple(max_model_len if g.mamba or g.circular_buffer else kv.block_size for g in specs),
        kv.num_gpu_blocks - 1 - num_sink_blocks(release, kv),
        in_flight,
        max_model_len,
        chunk_sizes=tuple(g.attention_chunk_size for g in specs),
    )
    return reserve if reserve.reserved_blocks > 0 else None


def startup_gate_mismatch(
    reserve: AdmissionReserve, startup_blocks: int, pin: str
) -> Violation | None:
    """A `startup_gate_mismatch` where startup accepted max_model_len (`startup_blocks` fit the
    pool) but the gate charges such a request more than the pool has: it would never be
    admitted, and the engine would wait on it forever.

    Example (vLLM 0.19.1, whose gate is uncapped: full attention + a 4,096-token window,
    bs 16, T 8,192, max_model_len 32,768, 3,000 blocks): startup charges 2,048 + cdiv(4,095 +
    8,192, 16) + 1 = 2,817 <= 2,999 usable; the gate charges 2,048 + 2,048 = 4,096 > 2,999.
    From 0.20.0 the window's charge is capped like the startup check's: no mismatch.
    """
    if reserve.charged_blocks <= reserve.usable_blocks:
        return None
    return Violation(
        ViolationKind.STARTUP_GATE_MISMATCH,
        "startup",
        None,
        f"vLLM {pin}'s startup check accepts max_model_len {reserve.request_tokens} "
        f"({startup_blocks} blocks of {reserve.usable_blocks} usable), but its admission gate "
        f"charges such a request {reserve.charged_blocks} blocks: a request of "
        f"{reserve.request_tokens} tokens would never be admitted and wait forever",
        counted_blocks=startup_blocks,
        needed_blocks=reserve.charged_blocks,
        free_blocks=reserve.usable_blocks,
        time_s=0.0,
    )


def check_cache_fits(
    design: Design, kv: KVCacheConfig, max_model_len: int, token_budget: int
) -> int:
    """vLLM refuses to start when one max-length request cannot fit in the pool.

    v0 (`raise_if_cache_size_invalid`, worker.py @fc93e56): max_model_len <= block_size * G.
    V1 engine (`check_enough_kv_cache_memory`, kv_cache_utils.py:L651-696 @4ac7713): the
    request's blocks fit in G - 1 (block 0 is the null block); a sliding window needs only
    cdiv(min(W - 1 + T, max_model_len), bs) + 1 blocks, chunked-local attention in chunks of A
    cdiv(min(A + T, max_model_len), bs) (`kv_cache_interface.py:L376-400 @0.20.0`, the same
    arithmetic at 0.11.0 `L174-191`); a hybrid model needs the sum over its
    KV-cache groups (`max_memory_usage_bytes`, L624-631 @0.11.0), a Mamba group one block
    (`MambaSpec.max_memory_usage_bytes`, `kv_cache_interface.py:L1135-1141 @0.33.0`, L235-238
    @0.11.0: one page per request with caching off), a circular buffer one block, a sink or
    R-SWA group as full attention (`FullAttentionSpec`'s). T (`token_budget` here) is
    `max_num_batched_tokens`, from 0.26.0 `max_in_flight_tokens`, twice the budget under async
    scheduling (`VllmPin.window_bound_tokens`, `max_memory_usage_bytes` L946-958 @0.33.0).
    Example: bs=16, G=10, v0: max_model_len 160 is the most that starts.
    Returns the blocks the check charged one max_model_len request.
    """
    bs, num_blocks = kv.block_size, kv.num_gpu_blocks
    if design.api == "v0":
        if max_model_len > bs * num_blocks:
            raise ScenarioError(
                f"scheduler.max_model_len: {max_model_len} tokens is larger than the KV cache "
                f"holds ({num_blocks} blocks x {bs} tokens = {num_blocks * bs}); vLLM would refuse to start"
            )
        return -(-max_model_len // bs)
    # Hybrid: the sum over groups (vLLM sums the bytes of every layer, `group_size` per group).
    needed = 0
    for group in kv.group_specs:
        if group.circular_buffer:  # `CircularBufferSpec.max_memory_usage_bytes`: one page
            needed += 1  # (`L983-985 @0.33.0`)
        elif group.mamba:  # `MambaSpec.max_memory_usage_bytes` (L293-300 @0.19.1): one page,
            # two in "align" (three with 0.33.0's prefill checkpoint block, `L1135-1139
            # @0.33.0`), one per block of max_model_len in "all"
            if not kv.enable_prefix_caching:
                needed += 1
            elif kv.mamba_cache_mode == "all":
                needed += -(-max_model_len // bs)
            else:
                needed += 2 + kv.mamba_prefill_checkpoint_blocks
        elif group.attention_chunk_size is not None:  # `ChunkedLocalAttentionSpec`, no "+1"
            needed += -(-min(group.attention_chunk_size + token_budget, max_model_len) // bs)
        elif group.sliding_window is None:
            needed += -(-max_model_len // bs)
        else:
            window = group.sliding_window
            needed += -(-min(window - 1 + token_budget, max_model_len) // bs) + 1
    if needed > num_blocks - 1:
        raise ScenarioError(
            f"scheduler.max_model_len: one {max_model_len}-token request needs {needed} blocks but "
            f"only {num_blocks - 1} are usable (block 0 is the null block); vLLM would refuse to start"
        )
    return needed
