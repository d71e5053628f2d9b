# ruff: noqa: B023  (every lambda here is called at once by _Pair.call, inside the loop)
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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sim.errors import InputError
from sim.kv.config import Design, KVCacheConfig, KVCacheGroupSpec, make_manager
from sim.kv.types import (
    AllocStatus,
    ManagerError,
    Segment,
    Sequence,
    SequenceGroup,
    SequenceStatus,
    TokenContent,
)

#: Prompt keys 0..NUM_SHARED_KEYS-1 are shared prefixes; unique tails use keys above UNIQUE_BASE.
NUM_SHARED_KEYS = 4
UNIQUE_BASE = 1_000


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first operation on which model and real code disagreed."""

    op_index: int
    op: str
    request_id: int | None
    what: str
    model_answer: object
    real_answer: object
    model_free: tuple[int, int]
    real_free: tuple[int, int]
    config: KVCacheConfig
    history: tuple[str, ...]

    def describe(self) -> str:
        lines = [
            f"divergence at op {self.op_index}: {self.op} (request {self.request_id}): {self.what}",
            f"  model: {self.model_answer!r}   free gpu/cpu {self.model_free}",
            f"  real:  {self.real_answer!r}   free gpu/cpu {self.real_free}",
            f"  config: {self.config}",
            "  last operations of the workload:",
        ]
        lines += [f"    {h}" for h in self.history[-12:]]
        return "\n".join(lines)


@dataclass(slots=True)
class VerifyResult:
    design: str
    vllm_version: str
    num_ops: int = 0
    num_workloads: int = 0
    num_crashes: int = 0
    op_counts: dict[str, int] = field(default_factory=dict)
    divergence: Divergence | None = None

    @property
    def identical(self) -> bool:
        return self.divergence is None

    def summary(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(self.op_counts.items()))
        head = (
            f"{self.design} vs vLLM {self.vllm_version}: "
            + (
                f"identical over {self.num_ops} operations"
                if self.identical
                else f"DIVERGED after {self.num_ops} operations"
            )
            + f" ({self.num_workloads} workloads, {self.num_crashes} crashes seen on both sides; {counts})"
        )
        return head if self.identical else head + "\n" + self.divergence.describe()  # type: ignore[union-attr]


class _Diverged(Exception):
    def __init__(self, divergence: Divergence) -> None:
        self.divergence = divergence


def _outcome(fn: Callable[[], object]) -> tuple[str, object]:
    """("ok", value) or ("raise", exception class name; vLLM's own for a `RaisedByVllm`)."""
    try:
        return "ok", fn()
    except (
        ManagerError,
        ValueError,
        AssertionError,
        IndexError,
        KeyError,
        NotImplementedError,
        RecursionError,
    ) as exc:
        return "raise", getattr(exc, "upstream_type", type(exc).__name__)


# ---------------------------------------------------------------------------- configurations
def random_config(rng: random.Random, design: str) -> KVCacheConfig:
    """A small pool, a block size, maybe a window, maybe prefix caching (never both in v0)."""
    block_size = rng.choice([1, 2, 4, 8, 16, 16])
    num_gpu_blocks = rng.randint(4, 48)
    window = None
    caching = rng.random() < 0.4
    if rng.random() < 0.5:
        window = rng.randint(1, 6 * block_size)
        if design != "v1-engine":
            caching = False  # vLLM 0.5.4 rejects prefix caching with a sliding window
    watermark = rng.choice([0.0, 0.01, 0.01, 0.1])
    max_model_len = (
        rng.choice([None, None, rng.randint(8, 20 * block_size)]) if design == "v1-engine" else None
    )
    return KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        num_cpu_blocks=rng.randint(0, 48) if design != "v1-engine" else 0,
        sliding_window=window,
        enable_prefix_caching=caching,
        watermark=watermark,
        max_model_len=max_model_len,
        # The real v0 code installed is the 0.5.4 wheel: compare with its release behaviour.
        vllm_pin="0.5.4" if design != "v1-engine" else None,
    )


def random_hybrid_config(rng: random.Random) -> KVCacheConfig:
    """A V1-engine config with KV-cache groups: one full group and 1-3 sliding groups of one
    window (Gemma-2 and Gemma-3 shapes), the full group first or last, maybe caching."""
    block_size = rng.choice([1, 2, 4, 8, 16, 16])
    window = rng.randint(1, 6 * block_size)
    sliding = [KVCacheGroupSpec(window)] * rng.randint(1, 3)
    full = [KVCacheGroupSpec(None)]
    groups = tuple(sliding + full if rng.random() < 0.5 else full + sliding)
    return KVCacheConfig(
        num_gpu_blocks=rng.randint(4, 64),
        block_size=block_size,
        enable_prefix_caching=rng.random() < 0.6,
        max_model_len=rng.choice([None, None, rng.randint(8, 20 * block_size)]),
        kv_cache_groups=groups,
    )


def random_prompt(
    rng: random.Random, seq_id: int, block_size: int, max_tokens: int
) -> TokenContent:
    """A prompt that may start with a shared prefix (so prefix caching has hits to find)."""
    segments: list[Segment] = []
    if rng.random() < 0.6:
        segments.append(Segment(rng.randrange(NUM_SHARED_KEYS), rng.randint(1, max_tokens)))
    if not segments or rng.random() < 0.7:
        segments.append(Segment(UNIQUE_BASE + seq_id, rng.randint(1, max(1, max_tokens // 2))))
    return TokenContent.from_segments(segments)


# ---------------------------------------------------------------------------- the comparer
class _Pair:
    """Both managers of one episode and the comparison helpers."""

    def __init__(self, model, real, config: KVCacheConfig, compare_ids: bool, v1: bool) -> None:
        self.model, self.real, self.config = model, real, config
        self.compare_ids, self.v1 = compare_ids, v1
        self.history: list[str] = []
        self.op_index = 0
        self.result: VerifyResult | None = None
        #: The real side's outcome of the last `call` (ids may differ when not compared).
        self.last_real: tuple[str, Any] = ("ok", None)
        self.skip_swa_fork = False

    def free_counts(self, mgr) -> tuple[int, int]:
        if self.v1:
            return mgr.num_free_blocks, 0
        return mgr.get_num_free_gpu_blocks(), mgr.get_num_free_cpu_blocks()

    def fail(self, op: str, rid: int | None, what: str, a: object, b: object) -> None:
        raise _Diverged(
            Divergence(
                self.op_index,
                op,
                rid,
                what,
                a,
                b,
                self.free_counts(self.model),
                self.free_counts(self.real),
                self.config,
                tuple(self.history),
            )
        )

    def call(self, op: str, rid: int | None, fn: Callable[..., Any], ids: bool = True) -> Any:
        """Apply `fn` to both managers, compare outcome and free counts; return the outcome."""
        self.op_index += 1
        self.history.append(op)
        assert self.result is not None
        kind = op.split("(", 1)[0]
        self.result.op_counts[kind] = self.result.op_counts.get(kind, 0) + 1
        self.result.num_ops += 1
        got_model = _outcome(lambda: fn(self.model))
        got_real = _outcome(lambda: fn(self.real))
        if got_model[0] != got_real[0]:
            self.fail(op, rid, "one side raised", got_model, got_real)
        if got_model[0] == "raise" and got_model[1] != got_real[1]:
            self.fail(op, rid, "different exceptions", got_model[1], got_real[1])
        if got_model[0] == "ok":
            a, b = _normalise(got_model[1]), _normalise(got_real[1])
            if a != b and (ids or self.compare_ids):
                if _shape(a) != _shape(b):
                    self.fail(op, rid, "different answers", a, b)
                if self.compare_ids:
                    self.fail(op, rid, "different block ids", a, b)
        if self.free_counts(self.model) != self.free_counts(self.real):
            self.fail(
                op,
                rid,
                "different free counts",
                self.free_counts(self.model),
                self.free_counts(self.real),
            )
        self.last_real = got_real
        return got_model

    def check_tables(self, seq_ids: list[int]) -> None:
        for sid in seq_ids:
            a, b = self.model.seq_block_ids(sid), self.real.seq_block_ids(sid)
            if len(a) != len(b):
                self.fail(f"table({sid})", sid, "different table lengths", a, b)
            if self.compare_ids and a != b:
                self.fail(f"table({sid})", sid, "different table ids", a, b)
            if _pattern(a) != _pattern(b):
                self.fail(f"table({sid})", sid, "different table sharing pattern", a, b)


def _normalise(value: object) -> object:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], list):
        return (list(value[0]), value[1])
    if isinstance(value, list):
        return [tuple(v) if isinstance(v, (tuple, list)) else v for v in value]
    if hasattr(value, "name") and hasattr(value, "value"):
        return value.name
    return value


def _pattern(ids: list[int]) -> list[int]:
    """Block ids relabelled by first occurrence: [7, 6, 7, 6] -> [0, 1, 0, 1] (ring reuse)."""
    first: dict[int, int] = {}
    return [first.setdefault(b, len(first)) for b in ids]


def _shape(value: object) -> object:
    """What is compared when ids are not: None-ness, lengths, enum names, bools."""
    if isinstance(value, list):
        return ("list", len(value))
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], list):
        return ("hit", len(value[0]), value[1])
    return value


# ---------------------------------------------------------------------------- v0 episodes
def _v0_episode(pair: _Pair, rng: random.Random, budget: int, next_id: list[int]) -> bool:
    """Random v0 scheduler walk; returns True when it ended on a crash (both raised)."""
    cfg = pair.config
    bs = cfg.block_size
    max_prompt = rng.randint(1, 14) * bs
    waiting: list[SequenceGroup] = []
    running: list[SequenceGroup] = []
    swapped: list[SequenceGroup] = []
    now = 0.0
    start = pair.op_index

    def live_ids() -> list[int]:
        return [s.seq_id for g in running + swapped for s in g.seqs if not s.is_finished()]

    while pair.op_index - start < budget:
        now += 1.0
        r = rng.random()
        if r < 0.25 or not (running or swapped or waiting):
            # A new request (maybe n=2 sequences with the same prompt) joins the queue.
            gid = next_id[0]
            next_id[0] += 1
            prompt = random_prompt(rng, gid, bs, max_prompt)
            seqs = [Sequence(gid * 4, prompt, prompt.num_tokens)]
            if rng.random() < 0.15:
                seqs.append(seqs[0].fork(gid * 4 + 1))
            waiting.append(SequenceGroup(gid, seqs, arrival_s=now))
        elif r < 0.45 and waiting:
            group = waiting[0]
            status = pair.call(
                f"can_allocate(g{group.request_id},{group.seqs[0].num_tokens}tok)",
                group.request_id,
                lambda m, g=group: m.can_allocate(g),
            )
            if status == ("ok", AllocStatus.OK):
                waiting.pop(0)
                out = pair.call(
                    f"allocate(g{group.request_id})",
                    group.request_id,
                    lambda m, g=group: m.allocate(g),
                )
                if out[0] == "raise":
                    return True
                for s in group.seqs:
                    s.status = SequenceStatus.RUNNING
                    s.num_computed_tokens = 0
                running.append(group)
                _touch(pair, group, now)
            elif status[1] is AllocStatus.NEVER or (
                status[1] is AllocStatus.LATER and rng.random() < 0.3
            ):
                waiting.pop(0)  # the scheduler ignores a NEVER group; drop some LATERs too
        elif r < 0.75 and running:
            group = rng.choice(running)
            # The previous step computed every token; the new sampled token is not computed.
            for s in group.get_seqs(SequenceStatus.RUNNING):
                s.num_computed_tokens = s.num_tokens
                s.append_tokens(1)
            ok = pair.call(
                f"can_append_slots(g{group.request_id})",
                group.request_id,
                lambda m, g=group: m.can_append_slots(g),
            )
            if ok == ("ok", True):
                for s in group.get_seqs(SequenceStatus.RUNNING):
                    out = pair.call(
                        f"append_slots(s{s.seq_id},L={s.num_tokens})",
                        group.request_id,
                        lambda m, s=s: m.append_slots(s),
                    )
                    if out[0] == "raise":
                        return True
                _touch(pair, group, now)
            else:
                _preempt(pair, rng, group, running, waiting, swapped)
        elif r < 0.80 and running:
            group = rng.choice(running)
            parent = rng.choice(group.get_seqs(SequenceStatus.RUNNING))
            if pair.skip_swa_fork and cfg.sliding_window is not None and parent.output_len > 0:
                continue  # V2 fork after a null-block drop: real code is undefined (see verify)
            child = parent.fork(next_id[0] * 4 + 2)
            next_id[0] += 1
            group.seqs.append(child)
            pair.call(
                f"fork(s{parent.seq_id}->s{child.seq_id})",
                group.request_id,
                lambda m: m.fork(parent, child),
            )
            pair.check_tables([child.seq_id])
        elif r < 0.88 and running:
            group = rng.choice(running)
            _preempt(pair, rng, group, running, waiting, swapped)
        elif r < 0.93 and swapped:
            group = swapped[0]
            st = pair.call(
                f"can_swap_in(g{group.request_id})",
                group.request_id,
                lambda m, g=group: m.can_swap_in(g),
            )
            if st == ("ok", AllocStatus.OK):
                out = pair.call(
                    f"swap_in(g{group.request_id})",
                    group.request_id,
                    lambda m, g=group: m.swap_in(g),
                )
                if out[0] == "raise":
                    return True
                swapped.remove(group)
                for s in group.get_seqs(SequenceStatus.SWAPPED):
                    s.status = SequenceStatus.RUNNING
                running.append(group)
        elif running:
            group = rng.choice(running)
            seqs = group.get_seqs(SequenceStatus.RUNNING)
            victims = seqs if len(seqs) == 1 or rng.random() < 0.5 else [rng.choice(seqs)]
            for s in victims:
                s.status = SequenceStatus.FINISHED_STOPPED
                out = pair.call(f"free(s{s.seq_id})", group.request_id, lambda m, s=s: m.free(s))
                if out[0] == "raise":
                    return True
            if not group.get_seqs(SequenceStatus.RUNNING):
                running.remove(group)
        pair.check_tables(live_ids())
    return False


def _touch(pair: _Pair, group: SequenceGroup, now: float) -> None:
    """What the v0 scheduler does for every scheduled group when prefix caching is on."""
    if not pair.config.enable_prefix_caching:
        return
    for s in group.get_seqs(SequenceStatus.RUNNING):
        pair.call(
            f"access(s{s.seq_id},t={now})",
            group.request_id,
            lambda m, s=s: m.access_all_blocks_in_seq(s, now),
        )
    pair.call(
        f"mark_computed(g{group.request_id})",
        group.request_id,
        lambda m: m.mark_blocks_as_computed(group),
    )
    seqs = group.get_seqs(SequenceStatus.RUNNING)
    pair.call(
        f"common_computed(g{group.request_id})",
        group.request_id,
        lambda m: m.get_common_computed_block_ids(seqs),
    )


def _preempt(pair, rng, group, running, waiting, swapped) -> None:
    """Recompute (single-seq groups, as vLLM) or swap out (multi-seq, or by choice)."""
    seqs = group.get_seqs(SequenceStatus.RUNNING)
    use_swap = len(seqs) > 1 or (pair.config.num_cpu_blocks > 0 and rng.random() < 0.5)
    if use_swap:
        ok = pair.call(
            f"can_swap_out(g{group.request_id})", group.request_id, lambda m: m.can_swap_out(group)
        )
        if ok == ("ok", True):
            out = pair.call(
                f"swap_out(g{group.request_id})", group.request_id, lambda m: m.swap_out(group)
            )
            if out[0] == "raise":
                raise _Crash()
            for s in seqs:
                s.status = SequenceStatus.SWAPPED
            running.remove(group)
            swapped.append(group)
            return
        if len(seqs) > 1:
            return  # vLLM would abort it; leave it running
    for s in seqs:
        s.status = SequenceStatus.WAITING
        out = pair.call(f"free(s{s.seq_id},recompute)", group.request_id, lambda m, s=s: m.free(s))
        if out[0] == "raise":
            raise _Crash()
        s.num_computed_tokens = 0
    running.remove(group)
    waiting.insert(0, group)


class _Crash(Exception):
    pass


# ---------------------------------------------------------------------------- V1-engine episodes
def _v1_episode(pair: _Pair, rng: random.Random, budget: int, next_id: list[int]) -> bool:
    cfg = pair.config
    bs = cfg.block_size
    max_prompt = rng.randint(1, 14) * bs
    waiting: list[Sequence] = []
    running: list[Sequence] = []
    start = pair.op_index
    while pair.op_index - start < budget:
        r = rng.random()
        if r < 0.25 or not (running or waiting):
            rid = next_id[0]
            next_id[0] += 1
            prompt = random_prompt(rng, rid, bs, max_prompt)
            if cfg.max_model_len is not None and prompt.num_tokens >= cfg.max_model_len:
                prompt = prompt.truncated(max(1, cfg.max_model_len - 1))
            waiting.append(Sequence(rid, prompt, prompt.num_tokens))
        elif r < 0.5 and waiting:
            req = waiting[0]
            hit = pair.call(
                f"get_computed_blocks(r{req.seq_id})",
                req.seq_id,
                lambda m: m.get_computed_blocks(req),
            )
            hit_ids, hit_tokens = hit[1]
            real_hit_ids = pair.last_real[1][0]
            remaining = req.num_tokens - req.num_computed_tokens - hit_tokens
            n = remaining if rng.random() < 0.6 else rng.randint(1, remaining)
            k = rng.choice([0, 0, 0, 1, 2])
            out = pair.call(
                f"allocate_slots(r{req.seq_id},n={n},hit={hit_tokens},k={k})",
                req.seq_id,
                lambda m: m.allocate_slots(
                    req, n, hit_tokens, list(hit_ids if m is pair.model else real_hit_ids), k
                ),
            )
            if out[1] is not None:
                waiting.pop(0)
                req.status = SequenceStatus.RUNNING
                req.num_computed_tokens += hit_tokens + n
                running.append(req)
            elif rng.random() < 0.3:
                waiting.pop(0)
                pair.call(f"free(r{req.seq_id},rejected)", req.seq_id, lambda m: m.free(req))
        elif r < 0.85 and running:
            req = rng.choice(running)
            if req.num_computed_tokens >= req.num_tokens:
                if cfg.max_model_len is not None and req.num_tokens >= cfg.max_model_len:
                    _v1_finish(pair, req, running)
                    continue
                req.append_tokens(1)
            remaining = req.num_tokens - req.num_computed_tokens
            n = remaining if rng.random() < 0.7 else rng.randint(1, remaining)
            k = rng.choice([0, 0, 0, 1, 3])
            out = pair.call(
                f"allocate_slots(r{req.seq_id},C={req.num_computed_tokens},n={n},k={k})",
                req.seq_id,
                lambda m: m.allocate_slots(req, n, 0, None, k),
            )
            if out[1] is not None:
                req.num_computed_tokens += n
            else:
                # Preemption: free, forget what was computed, back to the head of the queue.
                pair.call(f"free(r{req.seq_id},preempt)", req.seq_id, lambda m: m.free(req))
                req.num_computed_tokens = 0
                req.status = SequenceStatus.PREEMPTED
                running.remove(req)
                waiting.insert(0, req)
        elif running:
            _v1_finish(pair, rng.choice(running), running)
        pair.check_tables([s.seq_id for s in running])
    return False


def _v1_finish(pair: _Pair, req: Sequence, running: list[Sequence]) -> None:
    req.status = SequenceStatus.FINISHED_STOPPED
    pair.call(f"free(r{req.seq_id})", req.seq_id, lambda m: m.free(req))
    running.remove(req)


# ---------------------------------------------------------------------------- entry points
_DEFAULT_VERSION = {"v0-v1": "0.5.4", "v0-v2": "0.5.4", "v0-fixed": "0.5.4", "v1-engine": "0.11.0"}
#: vLLM version each design's block ids are pinned to (ids compared by default only there).
_MODELLED_VERSION = {"v0-v1": (0, 5), "v0-v2": (0, 5), "v1-engine": (0, 10)}
#: kvsim's V1 pin for a loaded vLLM (major, minor) whose manager decides differently from
#: 4ac7713 (the pin a config without `vllm_pin` gets, and what 0.10/0.11 decide).
_V1_PIN_FOR_VERSION: dict[tuple[int, ...], str] = {(0, 33): "0.33.0"}


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

    try:
        design = Design(design).value
    except ValueError:
        choices = ", ".join(d.value for d in Design)
        raise InputError(f"--design {design!r}: expected one of {choices}") from None
    if hybrid and design != "v1-engine":
        raise InputError("--hybrid: KV-cache groups exist only in the V1 engine (v1-engine)")
    if vllm_root is None and vllm_version is None:
        vllm_version = _DEFAULT_VERSION[design]
    install = load_vllm(vllm_root, vllm_version if vllm_root is None else None)
    if compare_ids is None:
        pinned = _MODELLED_VERSION.get(design)
        compare_ids = pinned is not None and (
            install.version_tuple[:2] == pinned
            or (design == "v1-engine" and install.version_tuple[:2] >= (0, 10))
        )
    rng = random.Random(seed)
    result = VerifyResult(design=design, vllm_version=install.version)
    next_id = [1]
    v1 = design == "v1-engine"
    pin = v1_pin_for(install.version_tuple) if v1 else None
    while result.num_ops < num_ops:
        cfg = config or (random_hybrid_config(rng) if hybrid else random_config(rng, design))
        if pin is not None and cfg.vllm_pin is None:
            cfg = replace(cfg, vllm_pin=pin)
        pair = _Pair(
            make_manager(design, cfg), make_real(design, cfg, install), cfg, compare_ids, v1
        )
        pair.result = result
        pair.skip_swa_fork = not fork_after_window_drop
        result.num_workloads += 1
        budget = min(ops_per_workload, num_ops - result.num_ops)
        episode = _v1_episode if v1 else _v0_episode
        try:
            if episode(pair, rng, budget, next_id):
                result.num_crashes += 1
        except _Crash:
            result.num_crashes += 1
        except _Diverged as d:
            result.divergence = d.divergence
            break
    return result
