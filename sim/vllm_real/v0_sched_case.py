"""One case of the v0 scheduler lockstep in kvsim's terms: the configuration both v0 schedulers
get (`V0SchedCase`), what one engine step decided (`V0StepRecord`), kvsim's scheduler and pool
for a case, resolved as a scenario's are (`v0_case_configs`), and the seeded random workloads
(`random_v0_workload`). Nothing here imports vLLM; `v0_sched_adapter` builds vLLM 0.5.4's real
`Scheduler` from the same case.

The draws keep to what vLLM 0.5.4 accepts at startup: prefix caching never with a sliding
window (`CacheConfig._verify_prefix_caching`, vllm/config.py:L492-499), chunked prefill with a
sliding window only on BlockSpaceManagerV2 (`EngineArgs.create_engine_config`,
vllm/engine/arg_utils.py:L855-860), `max_num_batched_tokens` at least `max_model_len` without
chunking and at least `max_num_seqs` (`SchedulerConfig._verify_args`, vllm/config.py:L833-848).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from sim.kv.config import Design, KVCacheConfig
from sim.scenario.configs import kv_cache_config_of, scheduler_config_of
from sim.scenario.schema import CacheSection, SchedulerSection
from sim.scheduler.config import PreemptionMode, SchedulerConfig
from sim.vllm_real.sched_case import RequestSpec
from sim.vllm_real.sched_workloads import _random_prompt

#: kvsim's design for each real 0.5.4 block manager (`use_v2_block_manager`).
DESIGN_OF_KIND = {"v1": Design.V0_V1, "v2": Design.V0_V2}
#: The kvsim pin whose v0 code is vLLM 0.5.4's release (`sim.kv.pins`).
V0_PIN = "0.5.4"


@dataclass(frozen=True, slots=True)
class V0SchedCase:
    """One v0 engine configuration, the same numbers for vLLM 0.5.4 and for kvsim."""

    kind: str  # "v1": BlockSpaceManagerV1 (kvsim v0-v1), "v2": BlockSpaceManagerV2 (v0-v2)
    num_blocks: int
    num_cpu_blocks: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool = False
    enable_prefix_caching: bool = False
    sliding_window: int | None = None
    preemption_mode: str = "auto"  # vLLM's None ("auto"), "recompute" or "swap"

    @property
    def design(self) -> Design:
        return DESIGN_OF_KIND[self.kind]

    def check(self) -> None:
        """Raise ValueError where vLLM 0.5.4 refuses the configuration at startup (the
        module docstring's three rules)."""
        if self.enable_prefix_caching and self.sliding_window is not None:
            raise ValueError("prefix caching with a sliding window (config.py:L496-499)")
        if self.sliding_window is not None and self.enable_chunked_prefill and self.kind == "v1":
            raise ValueError("chunked prefill with a sliding window on v1 (arg_utils.py:L855)")
        if self.max_num_batched_tokens < self.max_num_seqs or (
            not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError("max_num_batched_tokens too small (config.py:L833-848)")


@dataclass(frozen=True, slots=True)
class V0Workload:
    case: V0SchedCase
    requests: tuple[RequestSpec, ...]


@dataclass(slots=True)
class V0StepRecord:
    """What one v0 engine step decided, as comparable plain values (ids are request ids)."""

    #: (request id, token chunk size) in `SchedulerOutputs.scheduled_seq_groups` order:
    #: new prefills, running prefills, swapped-in prefills, running decodes, swapped-in
    #: decodes (vllm/core/scheduler.py:L899-903).
    scheduled: list[tuple[int, int]] = field(default_factory=list)
    num_prefill_groups: int = 0
    #: Preempted by recompute, swapped out, swapped in: in the order the manager saw them.
    preempted: list[int] = field(default_factory=list)
    swapped_out: list[int] = field(default_factory=list)
    swapped_in: list[int] = field(default_factory=list)
    ignored: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    free_gpu_after_schedule: int = 0
    free_cpu_after_schedule: int = 0
    free_gpu_after_update: int = 0
    free_cpu_after_update: int = 0
    #: (request id, GPU block table) of each scheduled group after `schedule()`, in
    #: `scheduled` order: which physical blocks (which cached ones, under prefix caching) the
    #: step's groups hold; the free counts alone cannot tell a reused cached block from an
    #: evicted and refilled one.
    tables: list[tuple[int, list[int]]] = field(default_factory=list)
    #: The three queues (waiting, running, swapped) after the step, front to back.
    queues: tuple[list[int], list[int], list[int]] | None = None
    #: kvsim's decode cohort only: one-token decodes run in bulk, not listed in `scheduled`.
    bulk_decodes: int = 0
    #: kvsim only: the engine died (or a request failed in the manager) in this step.
    fatal_error: str | None = None


def v0_case_configs(
    case: V0SchedCase, fast_path: bool = False
) -> tuple[SchedulerConfig, KVCacheConfig]:
    """kvsim's v0 scheduler and KV pool for `case`, resolved as a scenario's are
    (`sim.scenario.configs`), pinned to vLLM 0.5.4, the pools given; `fast_path` turns on
    the decode fast path and cohort.

    Example: ``v0_case_configs(V0SchedCase("v2", 20, 10, 16, 128, 4, 128))`` -> a v0-v2
    scheduler of 4 seqs and a 128-token budget, a pool of 20 GPU and 10 CPU blocks of 16.
    """
    section = SchedulerSection(
        design=case.design,
        vllm_version=V0_PIN,
        max_model_len=case.max_model_len,
        max_num_seqs=case.max_num_seqs,
        max_num_batched_tokens=case.max_num_batched_tokens,
        enable_chunked_prefill=case.enable_chunked_prefill,
        preemption_mode=PreemptionMode(case.preemption_mode),
        decode_fast_path=fast_path,
        decode_cohort=fast_path,
        long_prefill_token_threshold=0,
        async_scheduling=False,
    )
    cache = CacheSection(
        num_gpu_blocks=case.num_blocks,
        num_cpu_blocks=case.num_cpu_blocks,
        block_size=case.block_size,
        sliding_window=case.sliding_window,
        enable_prefix_caching=case.enable_prefix_caching,
    )
    kv = kv_cache_config_of(
        cache,
        num_gpu_blocks=case.num_blocks,
        num_cpu_blocks=case.num_cpu_blocks,
        sliding_window=case.sliding_window,
        max_model_len=case.max_model_len,
        vllm_pin=section.resolved_vllm_version,
        max_num_batched_tokens=case.max_num_batched_tokens,
    )
    return scheduler_config_of(section, case.max_model_len), kv


def _random_case(rng: random.Random, kind: str | None) -> V0SchedCase:
    """A small v0 case (draws in a fixed order; `kind` None draws it too)."""
    kind = kind or rng.choice(["v1", "v2"])
    block_size = rng.choice([4, 8, 16])
    max_model_len = rng.choice([64, 96, 128])
    min_blocks = -(-max_model_len // block_size) + 1  # one request alone always fits
    num_blocks = min_blocks + rng.randint(0, min_blocks)
    chunked = rng.random() < 0.5
    max_num_seqs = rng.randint(2, 6)
    budget = rng.choice([16, 24, 32, 64, 128]) if chunked else max_model_len + rng.choice([0, 32])
    caching = rng.random() < 0.5
    window = rng.choice([None, None, block_size * 2, block_size * 3 + 1])
    if caching or (chunked and kind == "v1"):
        window = None
    mode = rng.choice(["auto", "recompute", "swap"])
    return V0SchedCase(
        kind=kind,
        num_blocks=num_blocks,
        num_cpu_blocks=rng.choice([num_blocks // 2, num_blocks * 2]),
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(budget, max_num_seqs),
        enable_chunked_prefill=chunked,
        enable_prefix_caching=caching,
        sliding_window=window,
        preemption_mode=mode,
    )


def random_v0_workload(rng: random.Random, kind: str | None = None) -> V0Workload:
    """A small random v0 workload: `_random_case` and 3-10 requests (half with a shared
    prefix), each arriving before one of the first 9 steps, 1-24 output tokens."""
    case = _random_case(rng, kind)
    case.check()
    bs = case.block_size
    requests = []
    for rid in range(rng.randint(3, 10)):
        prompt = _random_prompt(rng, rid, case.max_model_len, 0.5, (bs, 2 * bs, 20))
        arrival_step = rng.randint(0, 8)
        requests.append(
            RequestSpec(rid, prompt, rng.randint(1, 24), arrival_step, arrival_step + rid / 1000)
        )
    return V0Workload(case, tuple(requests))


def random_v0_caching_workload(rng: random.Random, kind: str | None = None) -> V0Workload:
    """A workload that makes the prefix cache evict: `_random_case` with caching on, no
    window, and 8-16 requests over 24 steps, each starting with one of 6 shared prefixes of
    1-4 whole blocks (or none), so that which cached block the evictor takes decides later
    hits (the LRU order `access_all_blocks_in_seq` stamps)."""
    case = replace(_random_case(rng, kind), enable_prefix_caching=True, sliding_window=None)
    case.check()
    bs = case.block_size
    prefixes = [(key, bs * rng.randint(1, 4)) for key in range(6)]
    requests = []
    for rid in range(rng.randint(8, 16)):
        prompt: list[tuple[int, int]] = []
        if rng.random() < 0.8:
            prompt.append(rng.choice(prefixes))
        prompt.append((1000 + rid, rng.randint(1, bs * 2)))
        if sum(n for _, n in prompt) > case.max_model_len - 1:
            prompt = [(1000 + rid, case.max_model_len - 1)]
        arrival_step = rng.randint(0, 24)
        requests.append(
            RequestSpec(
                rid, tuple(prompt), rng.randint(1, 12), arrival_step, arrival_step + rid / 1000
            )
        )
    return V0Workload(case, tuple(requests))
