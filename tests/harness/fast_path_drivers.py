"""Random workloads driven through a `Pair` (A: every call; B: the fast path), checked after
every real call (tests/scheduler/test_decode_fast_path.py).

`run_v0` admits, finishes, swaps, forks and decodes v0 sequences; `run_v1` admits (with
prefix-cache hits), finishes and steps V1-engine requests (chunked prefills and decodes). On
a decode B declared quiet, A's answer must be the quiet one and change nothing. The draws
from `random.Random(seed)` come in a fixed order, so one seed is one workload.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from sim.kv.config import KVCacheConfig
from sim.kv.types import AllocStatus, Sequence, SequenceGroup, SequenceStatus
from tests.harness.fast_path_pair import DETAIL, STRUCTURAL, Pair, make_prompt, same_outcome

#: At most this many sequences hold blocks at once.
MAX_LIVE = 6


def free_on_both(pair: Pair, seq: Sequence) -> None:
    """Free `seq` on A (synced first) and B; it has no touch length any more."""
    pair.sync(seq)
    pair.a.free(seq)
    pair.b.free(seq)
    pair.touch_len.pop(seq.seq_id, None)


# ----------------------------------------------------------------------------- v0 driver


@dataclass
class V0Driver:
    """One v0 workload: the queues and the draws (`allow_lookahead`: see `run_v0`)."""

    pair: Pair
    rng: random.Random
    allow_swap: bool
    allow_fork: bool
    allow_lookahead: bool
    groups: dict[int, SequenceGroup] = field(default_factory=dict)
    waiting: list[Sequence] = field(default_factory=list)
    running: list[Sequence] = field(default_factory=list)
    swapped: list[Sequence] = field(default_factory=list)
    next_id: int = 0

    def live(self) -> list[int]:
        return [s.seq_id for s in self.running + self.swapped]

    def drop(self, seq: Sequence) -> None:
        """Free a running/swapped seq (finish or recompute preemption)."""
        free_on_both(self.pair, seq)
        for queue in (self.running, self.swapped):
            if seq in queue:
                queue.remove(seq)

    def preempt(self, victim: Sequence) -> None:
        self.pair.num_refused += 1
        self.drop(victim)
        victim.status = SequenceStatus.WAITING
        victim.num_computed_tokens = 0
        self.waiting.append(victim)

    @staticmethod
    def advance(seq: Sequence) -> None:
        seq.num_computed_tokens = seq.num_tokens
        seq.append_tokens(1)

    def step(self) -> None:
        """One operation, drawn: admit, finish, swap out, fork, swap in, or decode."""
        rng, running, swapped = self.rng, self.running, self.swapped
        op = rng.random()
        if op < 0.12 and len(running) + len(swapped) < MAX_LIVE:
            self.admit()
        elif op < 0.16 and running:
            self.drop(rng.choice(running))  # finished
            self.pair.check(self.live())
        elif op < 0.19 and self.allow_swap and running:
            self.swap_out(rng.choice(running))
        elif op < 0.21 and self.allow_fork and running and len(running) + len(swapped) < MAX_LIVE:
            self.fork(rng.choice(running))
        elif op < 0.24 and swapped:
            self.swap_in(swapped[0])
        elif running:
            self.decode(rng.choice(running))

    def admit(self) -> None:
        """A waiting sequence (half the time) or a new one, if `can_allocate` says OK."""
        pair, a, b = self.pair, self.pair.a, self.pair.b
        if self.waiting and self.rng.random() < 0.5:
            seq = self.waiting.pop(0)
        else:
            config = pair.config
            max_prompt = 6 * config.block_size
            content = make_prompt(self.rng, self.next_id, max_prompt, config.enable_prefix_caching)
            seq = Sequence.new(self.next_id, content)
            self.groups[self.next_id] = SequenceGroup(self.next_id, [seq])
            self.next_id += 1
        group = self.groups[seq.seq_id]
        status = a.can_allocate(group)
        assert b.can_allocate(group) is status
        if status is not AllocStatus.OK:
            if status is AllocStatus.LATER:
                self.waiting.append(seq)
            return
        outcome = same_outcome(pair, "allocate", group)
        if isinstance(outcome, Exception):
            assert a.recover_leaked_blocks() == b.recover_leaked_blocks()
            pair.check(self.live())
            return
        self.start_running(seq)
        self.advance(seq)  # the prefill computes the prompt and samples a token

    def start_running(self, seq: Sequence) -> None:
        """`seq` runs on both managers now: its touch length is read, A and B compared."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self.pair.refresh(seq)
        self.pair.check(self.live(), seq.seq_id)

    def swap_out(self, seq: Sequence) -> None:
        pair = self.pair
        group = self.groups[seq.seq_id]
        ok = pair.a.can_swap_out(group)
        assert pair.b.can_swap_out(group) == ok
        if not ok:
            return
        pair.sync(seq)
        self.running.remove(seq)
        outcome = same_outcome(pair, "swap_out", group)
        if isinstance(outcome, Exception):
            pair.check(self.live())  # a faithful swap undercount, alike in A and B
            return
        seq.status = SequenceStatus.SWAPPED
        self.swapped.append(seq)
        pair.touch_len[seq.seq_id] = None
        pair.check(self.live(), seq.seq_id)

    def fork(self, parent: Sequence) -> None:
        """A fork shares every block: the next decode of either sequence copies on write."""
        pair = self.pair
        pair.sync(parent)
        child = parent.fork(self.next_id)
        self.groups[self.next_id] = SequenceGroup(self.next_id, [child])
        self.next_id += 1
        pair.a.fork(parent, child)
        pair.b.fork(parent, child)
        self.running.append(child)
        for seq in (parent, child):
            pair.refresh(seq)
            touch_len = pair.touch_len[seq.seq_id]
            # After lookahead slots a sequence is never quiet again (None).
            assert touch_len == seq.num_tokens or (self.allow_lookahead and touch_len is None)
        pair.check(self.live(), child.seq_id)

    def swap_in(self, seq: Sequence) -> None:
        pair = self.pair
        group = self.groups[seq.seq_id]
        status = pair.a.can_swap_in(group)
        assert pair.b.can_swap_in(group) is status
        if status is not AllocStatus.OK:
            return
        self.swapped.remove(seq)
        outcome = same_outcome(pair, "swap_in", group)
        if isinstance(outcome, Exception):
            # v0-V2's prefix-caching swap-in undercount: both fail alike; the
            # half-swapped seq is abandoned (the real engine has crashed).
            pair.check(self.live())
            return
        self.start_running(seq)
        self.decode(seq, after_swap_in=True)  # v0 appends right after a swap-in

    def decode(self, seq: Sequence, after_swap_in: bool = False) -> None:
        if self.allow_lookahead and not after_swap_in and self.rng.random() < 0.2:
            self.decode_with_lookahead(seq, self.rng.choice([1, 3]))
            return
        pair = self.pair
        group = self.groups[seq.seq_id]
        quiet = pair.is_quiet(seq)
        pair.num_decodes += 1
        free_a = pair.a.get_num_free_gpu_blocks()
        ok = True if after_swap_in else pair.a.can_append_slots(group)
        if quiet:
            self.check_quiet_decode(seq, ok, free_a, after_swap_in)
        else:
            pair.sync(seq)
            if not after_swap_in:
                assert pair.b.can_append_slots(group) == ok
            if ok and not self.append_on_both(seq):
                return
        if ok:
            self.advance(seq)
        else:
            self.preempt(self.rng.choice(self.running))

    def check_quiet_decode(self, seq: Sequence, ok: bool, free_a: int, after_swap_in: bool) -> None:
        """A quiet decode on A: `can_append_slots == free >= 1`, `append_slots` changes nothing."""
        pair, a, design = self.pair, self.pair.a, self.pair.design
        pair.num_quiet += 1
        assert pair.b.get_num_free_gpu_blocks() == free_a
        assert after_swap_in or ok == (free_a >= 1)
        if not ok:
            return
        ids = self.live()
        others = [s for s in ids if s != seq.seq_id]
        before = (STRUCTURAL[design](a, ids), [DETAIL[design](a, s) for s in others])
        assert a.append_slots(seq) == []
        after = (STRUCTURAL[design](a, ids), [DETAIL[design](a, s) for s in others])
        assert after == before

    def append_on_both(self, seq: Sequence, *lookahead: int) -> bool:
        """`append_slots` on A and B; False (the sequence dropped) where both raised alike."""
        pair = self.pair
        outcome = same_outcome(pair, "append_slots", seq, *lookahead)
        if isinstance(outcome, Exception):
            pair.a.recover_leaked_blocks()
            pair.b.recover_leaked_blocks()
            self.drop(seq)
            return False
        pair.refresh(seq)
        if lookahead:
            assert pair.touch_len[seq.seq_id] is None  # lookahead used: never quiet again
        pair.check(self.live(), seq.seq_id)
        return True

    def decode_with_lookahead(self, seq: Sequence, num_lookahead: int) -> None:
        """A decode that reserves lookahead slots: always a real call, on A and B alike."""
        pair = self.pair
        group = self.groups[seq.seq_id]
        pair.num_decodes += 1
        pair.sync(seq)
        ok = pair.a.can_append_slots(group, num_lookahead)
        assert pair.b.can_append_slots(group, num_lookahead) == ok
        if not ok:
            self.preempt(self.rng.choice(self.running))
            return
        if self.append_on_both(seq, num_lookahead):
            self.advance(seq)


def run_v0(
    design: str,
    config: KVCacheConfig,
    seed: int,
    num_ops: int,
    allow_swap: bool,
    allow_fork: bool,
    allow_lookahead: bool = False,
) -> Pair:
    """`num_ops` drawn operations on a pair of `design` managers, then the final check.

    `allow_lookahead`: some decodes reserve 1 or 3 lookahead slots (speculative decoding);
    after one, the manager must never declare that sequence's decodes quiet again."""
    rng = random.Random(seed)
    driver = V0Driver(Pair(design, config), rng, allow_swap, allow_fork, allow_lookahead)
    for _ in range(num_ops):
        driver.step()
    driver.pair.finish_check(driver.running + driver.swapped)
    return driver.pair


# ----------------------------------------------------------------------------- V1 driver


@dataclass
class V1Driver:
    """One V1-engine workload: waiting and running requests, and the draws."""

    pair: Pair
    rng: random.Random
    waiting: list[Sequence] = field(default_factory=list)
    running: list[Sequence] = field(default_factory=list)
    next_id: int = 0

    def live(self) -> list[int]:
        return [s.seq_id for s in self.running]

    def drop(self, seq: Sequence) -> None:
        free_on_both(self.pair, seq)
        self.running.remove(seq)

    @staticmethod
    def after_step(seq: Sequence, num_new: int) -> None:
        seq.num_computed_tokens += num_new
        if seq.num_computed_tokens == seq.num_tokens:
            seq.append_tokens(1)

    def op(self) -> None:
        """One operation, drawn: admit, finish, or step a running request."""
        op = self.rng.random()
        if op < 0.12 and len(self.running) < MAX_LIVE:
            self.admit()
        elif op < 0.16 and self.running:
            self.drop(self.rng.choice(self.running))
            self.pair.check(self.live())
        elif self.running:
            self.step(self.rng.choice(self.running))

    def admit(self) -> None:
        """A waiting request (half the time) or a new one, after its prefix-cache hit."""
        pair, rng = self.pair, self.rng
        if self.waiting and rng.random() < 0.5:
            seq = self.waiting.pop(0)
        else:
            config = pair.config
            max_prompt = 6 * config.block_size
            content = make_prompt(rng, self.next_id, max_prompt, config.enable_prefix_caching)
            seq = Sequence.new(self.next_id, content)
            self.next_id += 1
        hits = pair.a.get_computed_blocks(seq)
        assert pair.b.get_computed_blocks(seq) == hits
        hit_ids, num_hit = hits
        num_left = seq.num_tokens - num_hit
        num_new = num_left if rng.random() < 0.5 else rng.randint(1, num_left)
        result = pair.a.allocate_slots(seq, num_new, num_hit, hit_ids)
        assert pair.b.allocate_slots(seq, num_new, num_hit, list(hit_ids)) == result
        if result is None:
            self.waiting.append(seq)
            return
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        pair.refresh(seq)
        pair.check(self.live(), seq.seq_id)
        seq.num_computed_tokens = num_hit
        self.after_step(seq, num_new)

    def step(self, seq: Sequence) -> None:
        """A decode (quiet or not) or a prefill chunk; a refusal preempts a random victim."""
        pair = self.pair
        num_left = seq.num_tokens - seq.num_computed_tokens
        is_decode = num_left == 1
        num_new = 1 if is_decode else self.rng.randint(1, num_left)
        if is_decode:
            pair.num_decodes += 1
        if is_decode and pair.is_quiet(seq):
            pair.num_quiet += 1
            ids = self.live()
            before = STRUCTURAL["v1-engine"](pair.a, ids)
            assert pair.a.allocate_slots(seq, 1) == []
            assert STRUCTURAL["v1-engine"](pair.a, ids) == before
            self.after_step(seq, 1)
            return
        pair.sync(seq)
        result = same_outcome(pair, "allocate_slots", seq, num_new)
        assert not isinstance(result, Exception)
        if result is None:
            pair.num_refused += 1
            pair.check(self.live(), seq.seq_id)
            victim = self.rng.choice(self.running)
            self.drop(victim)
            victim.num_computed_tokens = 0
            victim.status = SequenceStatus.PREEMPTED
            self.waiting.append(victim)
            return
        pair.refresh(seq)
        pair.check(self.live(), seq.seq_id)
        self.after_step(seq, num_new)


def run_v1(config: KVCacheConfig, seed: int, num_ops: int) -> Pair:
    """`num_ops` drawn operations on a pair of V1-engine managers, then the final check."""
    driver = V1Driver(Pair("v1-engine", config), random.Random(seed))
    for _ in range(num_ops):
        driver.op()
    driver.pair.finish_check(driver.running)
    return driver.pair
