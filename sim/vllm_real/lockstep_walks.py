# ruff: noqa: B023  (every lambda here is called at once by Pair.call, inside the loop)
"""The seeded random walks of the block-manager lockstep: prompts and scheduler operations.

`random_prompt` draws a prompt that may start with a shared prefix (the configurations the
walks run on are `lockstep_configs`'). `v0_episode` walks the v0 scheduler's operations
(admit, decode, fork, swap out/in, recompute-preempt, finish) and `v1_episode` the V1
engine's (computed-block lookup, allocate_slots, preempt, finish), each through a
`lockstep_pair.Pair` that applies every operation to both managers. A walk branches on the
answers, so it is only defined while the two agree.
"""

from __future__ import annotations

import abc
import enum
import random
from dataclasses import dataclass, field

from sim.kv.types import (
    AllocStatus,
    Segment,
    Sequence,
    SequenceGroup,
    SequenceStatus,
    TokenContent,
)
from sim.vllm_real.lockstep_pair import Pair

#: Prompt keys 0..NUM_SHARED_KEYS-1 are shared prefixes; unique tails use keys above UNIQUE_BASE.
NUM_SHARED_KEYS = 4
UNIQUE_BASE = 1_000


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


class After(enum.Enum):
    """What a walk does after one operation."""

    #: Compare the live sequences' tables.
    CHECK = "check"
    #: Go on without comparing (the operation was skipped).
    NEXT = "next"
    #: Both managers raised: the episode ends as a crash.
    CRASH = "crash"


@dataclass
class Walk(abc.ABC):
    """A seeded walk over one `Pair`: `step` draws and applies one scheduler operation;
    prompts are at most `max_prompt` tokens (drawn first: 1 to 14 blocks)."""

    pair: Pair
    rng: random.Random
    next_id: list[int]
    max_prompt: int = field(init=False)

    def __post_init__(self) -> None:
        self.max_prompt = self.rng.randint(1, 14) * self.pair.config.block_size

    @abc.abstractmethod
    def step(self) -> After:
        """Draw one operation, apply it to both managers, and say what follows."""

    @abc.abstractmethod
    def live_ids(self) -> list[int]:
        """The sequences whose block tables both managers must agree on."""

    def run(self, budget: int) -> bool:
        """Operations until `budget` more pair calls were made; True when one crashed."""
        start = self.pair.op_index
        while self.pair.op_index - start < budget:
            after = self.step()
            if after is After.CRASH:
                return True
            if after is After.CHECK:
                self.pair.check_tables(self.live_ids())
        return False


# ---------------------------------------------------------------------------- v0 episodes
def v0_episode(pair: Pair, rng: random.Random, budget: int, next_id: list[int]) -> bool:
    """Random v0 scheduler walk; returns True when it ended on a crash (both raised)."""
    return V0Walk(pair, rng, next_id).run(budget)


@dataclass
class V0Walk(Walk):
    """The queues of one v0 walk (admit, decode, fork, swap, preempt, finish)."""

    waiting: list[SequenceGroup] = field(default_factory=list)
    running: list[SequenceGroup] = field(default_factory=list)
    swapped: list[SequenceGroup] = field(default_factory=list)
    now: float = 0.0

    def live_ids(self) -> list[int]:
        groups = self.running + self.swapped
        return [s.seq_id for g in groups for s in g.seqs if not s.is_finished()]

    def step(self) -> After:
        self.now += 1.0
        rng, running = self.rng, self.running
        r = rng.random()
        if r < 0.25 or not (running or self.swapped or self.waiting):
            self.arrive()
        elif r < 0.45 and self.waiting:
            return self.admit(self.waiting[0])
        elif r < 0.75 and running:
            return self.decode(rng.choice(running))
        elif r < 0.80 and running:
            return self.fork(rng.choice(running))
        elif r < 0.88 and running:
            _preempt(self.pair, rng, rng.choice(running), running, self.waiting, self.swapped)
        elif r < 0.93 and self.swapped:
            return self.swap_in(self.swapped[0])
        elif running:
            return self.finish(rng.choice(running))
        return After.CHECK

    def arrive(self) -> None:
        """A new request (maybe n=2 sequences with the same prompt) joins the queue."""
        gid = self.next_id[0]
        self.next_id[0] += 1
        prompt = random_prompt(self.rng, gid, self.pair.config.block_size, self.max_prompt)
        seqs = [Sequence(gid * 4, prompt, prompt.num_tokens)]
        if self.rng.random() < 0.15:
            seqs.append(seqs[0].fork(gid * 4 + 1))
        self.waiting.append(SequenceGroup(gid, seqs, arrival_s=self.now))

    def admit(self, group: SequenceGroup) -> After:
        pair, rid = self.pair, group.request_id
        status = pair.call(
            f"can_allocate(g{rid},{group.seqs[0].num_tokens}tok)",
            rid,
            lambda m: m.can_allocate(group),
        )
        if status == ("ok", AllocStatus.OK):
            self.waiting.pop(0)
            if pair.call(f"allocate(g{rid})", rid, lambda m: m.allocate(group))[0] == "raise":
                return After.CRASH
            for s in group.seqs:
                s.status = SequenceStatus.RUNNING
                s.num_computed_tokens = 0
            self.running.append(group)
            _touch(pair, group, self.now)
        elif status[1] is AllocStatus.NEVER or (
            status[1] is AllocStatus.LATER and self.rng.random() < 0.3
        ):
            self.waiting.pop(0)  # the scheduler ignores a NEVER group; drop some LATERs too
        return After.CHECK

    def decode(self, group: SequenceGroup) -> After:
        pair, rid = self.pair, group.request_id
        # The previous step computed every token; the new sampled token is not computed.
        for s in group.get_seqs(SequenceStatus.RUNNING):
            s.num_computed_tokens = s.num_tokens
            s.append_tokens(1)
        ok = pair.call(f"can_append_slots(g{rid})", rid, lambda m: m.can_append_slots(group))
        if ok != ("ok", True):
            _preempt(pair, self.rng, group, self.running, self.waiting, self.swapped)
            return After.CHECK
        for s in group.get_seqs(SequenceStatus.RUNNING):
            out = pair.call(
                f"append_slots(s{s.seq_id},L={s.num_tokens})",
                rid,
                lambda m, s=s: m.append_slots(s),
            )
            if out[0] == "raise":
                return After.CRASH
        _touch(pair, group, self.now)
        return After.CHECK

    def fork(self, group: SequenceGroup) -> After:
        pair = self.pair
        parent = self.rng.choice(group.get_seqs(SequenceStatus.RUNNING))
        if pair.skip_swa_fork and pair.config.sliding_window is not None and parent.output_len > 0:
            return (
                After.NEXT
            )  # V2 fork after a null-block drop: real code is undefined (see verify)
        child = parent.fork(self.next_id[0] * 4 + 2)
        self.next_id[0] += 1
        group.seqs.append(child)
        pair.call(
            f"fork(s{parent.seq_id}->s{child.seq_id})",
            group.request_id,
            lambda m: m.fork(parent, child),
        )
        pair.check_tables([child.seq_id])
        return After.CHECK

    def swap_in(self, group: SequenceGroup) -> After:
        pair, rid = self.pair, group.request_id
        status = pair.call(f"can_swap_in(g{rid})", rid, lambda m: m.can_swap_in(group))
        if status == ("ok", AllocStatus.OK):
            if pair.call(f"swap_in(g{rid})", rid, lambda m: m.swap_in(group))[0] == "raise":
                return After.CRASH
            self.swapped.remove(group)
            for s in group.get_seqs(SequenceStatus.SWAPPED):
                s.status = SequenceStatus.RUNNING
            self.running.append(group)
        return After.CHECK

    def finish(self, group: SequenceGroup) -> After:
        """One sequence of the group, or all of them, stop."""
        seqs = group.get_seqs(SequenceStatus.RUNNING)
        victims = seqs if len(seqs) == 1 or self.rng.random() < 0.5 else [self.rng.choice(seqs)]
        for s in victims:
            s.status = SequenceStatus.FINISHED_STOPPED
            out = self.pair.call(f"free(s{s.seq_id})", group.request_id, lambda m, s=s: m.free(s))
            if out[0] == "raise":
                return After.CRASH
        if not group.get_seqs(SequenceStatus.RUNNING):
            self.running.remove(group)
        return After.CHECK


def _touch(pair: Pair, group: SequenceGroup, now: float) -> None:
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
                raise Crash()
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
            raise Crash()
        s.num_computed_tokens = 0
    running.remove(group)
    waiting.insert(0, group)


class Crash(Exception):
    """A preemption's call raised on both sides: the episode ends as a crash (`verify`)."""


# ---------------------------------------------------------------------------- V1-engine episodes
def v1_episode(pair: Pair, rng: random.Random, budget: int, next_id: list[int]) -> bool:
    """Random V1-engine walk; returns True when it ended on a crash (both raised)."""
    return V1Walk(pair, rng, next_id).run(budget)


@dataclass
class V1Walk(Walk):
    """The queues of one V1-engine walk (prefix hit and admit, advance or preempt, finish)."""

    waiting: list[Sequence] = field(default_factory=list)
    running: list[Sequence] = field(default_factory=list)

    def live_ids(self) -> list[int]:
        return [s.seq_id for s in self.running]

    def step(self) -> After:
        cfg = self.pair.config
        if cfg.enable_prefix_caching and cfg.has_mamba_group and self.rng.random() < 0.3:
            # A new scheduler step ("align" Mamba groups forget what was cached this step);
            # drawn only here, so other walks are unchanged.
            self.pair.call("new_step_starts()", None, lambda m: m.new_step_starts())
        r = self.rng.random()
        if r < 0.25 or not (self.running or self.waiting):
            self.arrive()
        elif r < 0.5 and self.waiting:
            self.admit(self.waiting[0])
        elif r < 0.85 and self.running:
            return self.advance(self.rng.choice(self.running))
        elif self.running:
            _v1_finish(self.pair, self.rng.choice(self.running), self.running)
        return After.CHECK

    def arrive(self) -> None:
        cfg = self.pair.config
        rid = self.next_id[0]
        self.next_id[0] += 1
        prompt = random_prompt(self.rng, rid, cfg.block_size, self.max_prompt)
        if cfg.max_model_len is not None and prompt.num_tokens >= cfg.max_model_len:
            prompt = prompt.truncated(max(1, cfg.max_model_len - 1))
        self.waiting.append(Sequence(rid, prompt, prompt.num_tokens))

    def admit(self, req: Sequence) -> None:
        """The queue head's prefix hit, then its first allocation (each side its own hit ids)."""
        pair, rng = self.pair, self.rng
        hit = pair.call(
            f"get_computed_blocks(r{req.seq_id})", req.seq_id, lambda m: m.get_computed_blocks(req)
        )
        hit_ids, hit_tokens = hit[1]
        real_hit_ids = pair.last_real[1][0]
        cfg = pair.config
        if cfg.prefix_cache_retention_interval is not None and (
            cfg.has_mamba_group or any(g.sliding_window for g in cfg.kv_cache_groups)
        ):
            _keep_junction(pair, req, hit_tokens)
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
        if out[0] == "raise":
            # Both raised (vllm #45856 at 0.20.0: the count passed, the pool ran dry): the
            # real engine is dead, so the episode ends as a crash, as in the v0 walks.
            raise Crash()
        if out[1] is not None:
            self.waiting.pop(0)
            req.status = SequenceStatus.RUNNING
            req.num_computed_tokens += hit_tokens + n
            self.running.append(req)
        elif rng.random() < 0.3:
            self.waiting.pop(0)
            pair.call(f"free(r{req.seq_id},rejected)", req.seq_id, lambda m: m.free(req))

    def advance(self, req: Sequence) -> After:
        """A decode or prefill chunk of a running request; refused: preempt it."""
        pair, rng, cfg = self.pair, self.rng, self.pair.config
        if req.num_computed_tokens >= req.num_tokens:
            if cfg.max_model_len is not None and req.num_tokens >= cfg.max_model_len:
                _v1_finish(pair, req, self.running)
                return After.NEXT
            req.append_tokens(1)
        remaining = req.num_tokens - req.num_computed_tokens
        n = remaining if rng.random() < 0.7 else rng.randint(1, remaining)
        k = rng.choice([0, 0, 0, 1, 3])
        out = pair.call(
            f"allocate_slots(r{req.seq_id},C={req.num_computed_tokens},n={n},k={k})",
            req.seq_id,
            lambda m: m.allocate_slots(req, n, 0, None, k),
        )
        if out[0] == "raise":
            raise Crash()  # as in `admit`
        if out[1] is not None:
            req.num_computed_tokens += n
            return After.CHECK
        # Preemption: free, forget what was computed, back to the head of the queue.
        pair.call(f"free(r{req.seq_id},preempt)", req.seq_id, lambda m: m.free(req))
        req.num_computed_tokens = 0
        req.status = SequenceStatus.PREEMPTED
        self.running.remove(req)
        self.waiting.insert(0, req)
        return After.CHECK


def _keep_junction(pair: Pair, req: Sequence, hit_tokens: int) -> None:
    """The scheduler's part after a lookup under sparse retention (0.33.0
    `sched/scheduler.py:L1110-1126`): keep the shared-prefix junction on the request, the hit
    plus the uncached common prefix (0 when none); both managers' junctions must agree."""
    uncached = pair.model.num_uncached_common_prefix_tokens
    ours = hit_tokens + uncached if uncached else 0
    theirs = pair.real.last_shared_prefix_boundary
    if ours != theirs:
        pair.fail(f"junction(r{req.seq_id})", req.seq_id, "different junctions", ours, theirs)
    req.shared_prefix_boundary = ours


def _v1_finish(pair: Pair, req: Sequence, running: list[Sequence]) -> None:
    req.status = SequenceStatus.FINISHED_STOPPED
    pair.call(f"free(r{req.seq_id})", req.seq_id, lambda m: m.free(req))
    running.remove(req)
