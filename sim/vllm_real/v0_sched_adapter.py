"""vLLM 0.5.4's real v0 `Scheduler` (`vllm/core/scheduler.py`, release commit 4db5176) and its
real block manager, driven on CPU step by step as `LLMEngine.step` drives them, no model.

Built without `vllm.config`: that module imports transformers and the model registry, which a
CPU-only lockstep neither has nor needs. The scheduler reads its two config objects as plain
attributes only (`Scheduler.__init__`, L264-332; `_get_prompt_limit`, L626-639; the budgets of
`_schedule_default` / `_schedule_chunked_prefill`; `_get_num_lookahead_slots`; `_passed_delay`),
so a stand-in `vllm.config` module names the three classes the scheduler imports, and
`_scheduler_config` / `_cache_config` carry exactly the attributes the real `SchedulerConfig`
and `CacheConfig` would hold for the case (vllm/config.py:L796-831, L445-463). Everything
that decides (the scheduler, `vllm.sequence`, both block managers) is vLLM's own code.

One engine step (`LLMEngine.step`, vllm/engine/llm_engine.py:L850-935, with
`_process_model_outputs`, L799-848, and the single-sequence path of
`SingleStepOutputProcessor._process_sequence_group_outputs`,
vllm/engine/output_processor/single_step.py:L82-105):

1. `scheduler.schedule()` under a clock that reads the step's time (the scheduler stamps
   `access_all_blocks_in_seq` with `time.time()`, L951; the lockstep needs it reproducible);
2. for each scheduled group: `update_num_computed_tokens(token_chunk_size)`; if its metadata
   says `do_sample`, append the next token of the request's content stream (`-(id + 1)`, as
   kvsim's `sample_token`), apply the stop checker's length rules (stop_checker.py:L79-87:
   past `max_model_len`, or `max_tokens` outputs; `ignore_eos`, no stop strings), and free a
   finished sequence (`free_seq`);
3. `free_finished_seq_groups()`.

Example (bs 16, 10 blocks, budget 128, no chunking, one 40-token prompt, 2 outputs): step 0
schedules [(0, 40)] as one prefill group (3 blocks), step 1 [(0, 1)] and finishes it: free
GPU blocks 10 -> 7 -> 7 -> 10.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from sim.kv.types import TokenContent
from sim.vllm_real.loader import VllmInstall, import_vllm, load_vllm
from sim.vllm_real.sched_case import RequestSpec
from sim.vllm_real.v0_adapter import _deterministic_block_sets
from sim.vllm_real.v0_sched_case import V0SchedCase, V0StepRecord
from sim.vllm_real.v1_sched_adapter import guard_real_call


class _StepClock:
    """Stands in for the `time` module inside vllm.core.scheduler: `time()` is the step's."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now


def _install_config_stand_in() -> None:
    """A `vllm.config` naming the classes `vllm.core.scheduler` imports (annotations only)."""
    if "vllm.config" in sys.modules:
        return
    module = types.ModuleType("vllm.config")
    for name in ("CacheConfig", "LoRAConfig", "SchedulerConfig"):
        setattr(module, name, type(name, (types.SimpleNamespace,), {}))
    sys.modules["vllm.config"] = module


def _scheduler_config(module: Any, case: V0SchedCase) -> Any:
    """`SchedulerConfig(...)`'s attributes for the case (vllm/config.py:L796-831)."""
    return module.SchedulerConfig(
        max_num_batched_tokens=case.max_num_batched_tokens,
        max_num_seqs=case.max_num_seqs,
        max_model_len=case.max_model_len,
        use_v2_block_manager=case.kind == "v2",
        num_lookahead_slots=0,
        delay_factor=0.0,
        chunked_prefill_enabled=case.enable_chunked_prefill,
        embedding_mode=False,
        preemption_mode=None if case.preemption_mode == "auto" else case.preemption_mode,
    )


def _cache_config(module: Any, case: V0SchedCase) -> Any:
    """`CacheConfig`'s attributes the scheduler reads, pools already sized (L445-463)."""
    return module.CacheConfig(
        block_size=case.block_size,
        num_gpu_blocks=case.num_blocks,
        num_cpu_blocks=case.num_cpu_blocks,
        sliding_window=case.sliding_window,
        enable_prefix_caching=case.enable_prefix_caching,
    )


class RecordingManager:
    """A v0 block manager (vLLM's real one, or kvsim's on the other side of the lockstep) with
    the calls that preempt and resume recorded while `events` is a list: inside `schedule()` a
    `free` is a recompute preemption (L1116-1125), `swap_out` a swap preemption (L1144-1158),
    `swap_in` a resumption (L1134-1142). Every call goes on to the manager unchanged; a
    wrapper, not a patched method, since the compiled core's classes (`sim.native`) have fixed
    methods. Request ids are recorded as ints (vLLM's are strings of kvsim's ints)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.events: list[tuple[str, int]] | None = None

    def free(self, seq: Any) -> None:
        if self.events is not None:
            self.events.append(("preempted", seq.seq_id))
        self._inner.free(seq)

    def swap_out(self, seq_group: Any) -> Any:
        if self.events is not None:
            self.events.append(("swapped_out", int(seq_group.request_id)))
        return self._inner.swap_out(seq_group)

    def swap_in(self, seq_group: Any) -> Any:
        if self.events is not None:
            self.events.append(("swapped_in", int(seq_group.request_id)))
        return self._inner.swap_in(seq_group)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class RealV0Scheduler:
    """vLLM 0.5.4's `Scheduler` over its real BlockSpaceManagerV1 or V2, one case."""

    def __init__(self, case: V0SchedCase, install: VllmInstall | None = None) -> None:
        case.check()
        self.install = install or load_vllm(vllm_version="0.5.4")
        self.case = case
        if case.kind == "v1":
            _deterministic_block_sets(self.install)  # see v0_adapter: set order of free()
        import_vllm("sequence", self.install)  # loads this root before the stand-in goes in
        _install_config_stand_in()
        self._sched_mod: Any = import_vllm("core.scheduler", self.install)
        self._seq_mod = import_vllm("sequence", self.install)
        config = sys.modules["vllm.config"]
        self.real = self._sched_mod.Scheduler(
            _scheduler_config(config, case), _cache_config(config, case), None
        )
        self._manager = RecordingManager(self.real.block_manager)
        self.real.block_manager = self._manager
        self._clock = _StepClock()
        self._contents: dict[int, TokenContent] = {}
        self._max_tokens: dict[int, int] = {}

    def add_request(self, spec: RequestSpec) -> None:
        """`LLMEngine._add_processed_request` (llm_engine.py:L571-612): one sequence whose
        seq_id is the request id, in a group of that request id."""
        content = spec.content()
        seq = self._seq_mod.Sequence(
            spec.request_id, {"prompt_token_ids": content.token_ids()}, self.case.block_size
        )
        group = self._seq_mod.SequenceGroup(str(spec.request_id), [seq], spec.arrival_s)
        self._contents[spec.request_id] = content
        self._max_tokens[spec.request_id] = spec.output_len
        self.real.add_seq_group(group)

    def _free_blocks(self) -> tuple[int, int]:
        manager = self._manager
        return manager.get_num_free_gpu_blocks(), manager.get_num_free_cpu_blocks()

    def step(self, now_s: float) -> V0StepRecord:
        """One `LLMEngine.step` (module docstring); `now_s` is what `time.time()` reads."""
        record = V0StepRecord()
        self._clock.now = now_s
        saved, self._sched_mod.time = self._sched_mod.time, self._clock
        self._manager.events = []
        try:
            metadata, outputs = self._guard("schedule", self.real.schedule)
        finally:
            self._sched_mod.time = saved
            events, self._manager.events = self._manager.events, None
        for kind, request_id in events:
            getattr(record, kind).append(request_id)
        record.scheduled = [
            (int(s.seq_group.request_id), s.token_chunk_size) for s in outputs.scheduled_seq_groups
        ]
        record.tables = [
            (int(meta.request_id), list(meta.block_tables[int(meta.request_id)]))
            for meta in metadata
        ]
        record.num_prefill_groups = outputs.num_prefill_groups
        record.ignored = [int(g.request_id) for g in outputs.ignored_seq_groups]
        record.free_gpu_after_schedule, record.free_cpu_after_schedule = self._free_blocks()
        for scheduled, meta in zip(outputs.scheduled_seq_groups, metadata, strict=True):
            scheduled.seq_group.update_num_computed_tokens(scheduled.token_chunk_size)
            if meta.do_sample and self._sample(scheduled.seq_group.seqs[0]):
                record.finished.append(scheduled.seq_group.seqs[0].seq_id)
        self._guard("free_finished_seq_groups", self.real.free_finished_seq_groups)
        record.free_gpu_after_update, record.free_cpu_after_update = self._free_blocks()
        record.queues = tuple(  # type: ignore[assignment]
            [int(g.request_id) for g in queue]
            for queue in (self.real.waiting, self.real.running, self.real.swapped)
        )
        return record

    def _sample(self, seq: Any) -> bool:
        """Append the next token, stop by length (stop_checker.py:L79-87), free a finished
        sequence (single_step.py:L90-105); True when it finished."""
        content = self._contents[seq.seq_id]
        content.append_output(-(seq.seq_id + 1), 1)
        n = content.num_tokens
        (token,) = content.token_ids(n - 1, n)
        seq.append_token_id(token, {token: self._seq_mod.Logprob(0.0)})
        if (
            seq.get_len() > self.case.max_model_len
            or seq.get_output_len() == self._max_tokens[seq.seq_id]
        ):
            seq.status = self._seq_mod.SequenceStatus.FINISHED_LENGTH_CAPPED
        if not seq.is_finished():
            return False
        self._guard("free_seq", self.real.free_seq, seq)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.real.has_unfinished_seqs())

    def _guard(self, phase: str, fn: Any, *args: Any) -> Any:
        return guard_real_call(self.install.root, phase, fn, *args)
