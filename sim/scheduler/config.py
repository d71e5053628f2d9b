"""Scheduler settings, resolved to concrete numbers the way vLLM resolves its defaults."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Policy(enum.Enum):
    FCFS = "fcfs"
    #: Lower `priority` value first, then earlier arrival (vLLM #5958 / #19057).
    PRIORITY = "priority"


class PreemptionMode(enum.Enum):
    #: vLLM v0 default: recompute for single-sequence groups, swap otherwise.
    AUTO = "auto"
    RECOMPUTE = "recompute"
    SWAP = "swap"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Budgets and policies of one scheduler.

    `max_num_batched_tokens=None` resolves as vLLM does (spec 1.1 / 1.3): v0 uses 512 with
    chunked prefill and `max(max_model_len, 2048)` without; the V1 engine uses 2048 (chunked)
    or `max(max_model_len, 2048)`. Example: v0, max_model_len 4096, no chunking -> 4096.
    """

    max_model_len: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = False
    policy: Policy = Policy.FCFS
    preemption_mode: PreemptionMode = PreemptionMode.AUTO
    long_prefill_token_threshold: int = 0
    num_lookahead_slots: int = 0
    #: Skip manager calls on decode steps the manager declares quiet (see `decode_touch_len`).
    #: An optimisation that changes no result; turn it off to verify that.
    decode_fast_path: bool = True
    #: With the fast path, let the engine keep steady decodes in a `DecodeCohort` (the
    #: scheduler then visits only the requests whose step changes something). Same results.
    decode_cohort: bool = True
    #: V1 only: vLLM's `AsyncScheduler` behind the engine core's batch queue of 2
    #: (`sim.scheduler.v1.async_scheduler`); step N+1 is scheduled before step N's output.
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        if self.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}")
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens <= 0:
            raise ValueError(
                f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}"
            )

    @property
    def max_concurrent_batches(self) -> int:
        """`VllmConfig.max_concurrent_batches` (0.33.0 `config/vllm.py:L587-598`): 2 under
        async scheduling (step N+1 is scheduled while step N runs), else 1."""
        return 2 if self.async_scheduling else 1

    def token_budget(self, engine: str) -> int:
        """The resolved `max_num_batched_tokens` for the v0 or V1 engine."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if self.enable_chunked_prefill:
            return 512 if engine == "v0" else 2048
        return max(self.max_model_len, 2048)
