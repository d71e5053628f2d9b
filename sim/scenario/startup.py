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
"""

from __future__ import annotations

from sim.catalog import ModelSpec
from sim.kv.config import Design
from sim.kv.pins import resolve_pin
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
