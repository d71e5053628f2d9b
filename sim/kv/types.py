"""Sequences, their token content, and the small enums shared by every block manager.

The block managers never need real token ids to count blocks; they need them only to hash
full blocks for prefix caching. A trace gives lengths and, at most, which prompts share a
prefix. So a sequence's tokens are kept as *segments*: runs of tokens whose identity is a
content key. Two sequences that start with the same segments have the same leading tokens,
and so the same block hashes, at any block size.

Worked example (block size 4)::

    prompt = TokenContent.from_segments([Segment(key=7, num_tokens=6)])
    # tokens 0..5 come from stream 7; block 0 = stream 7 offsets [0, 4)
    prompt.block_key(0, 4)  == ((7, 0, 4),)
    prompt.append_output(seq_key=-1, num_tokens=3)  # outputs from a per-sequence stream
    prompt.block_key(1, 4)  == ((7, 4, 6), (-1, 0, 2))

`token_ids()` materialises deterministic ids (used only to drive vLLM's real code in lockstep).
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field
from typing import Any, NewType

BlockId = NewType("BlockId", int)
BlockHash = NewType("BlockHash", int)
#: The content key of a token span: ((stream key, from, to), ...) per overlapped segment.
ContentKey = tuple[tuple[int, int, int], ...]

#: Seed of every hash chain; an int so hashes never depend on PYTHONHASHSEED.
NONE_HASH = BlockHash(0x5EED_C0DE)

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """A fixed, well-mixed 64-bit integer hash (deterministic across processes)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def chain_hash(parent: int, content: ContentKey) -> BlockHash:
    """Hash of a full block given its parent's hash and its content key.

    Built on ``hash()`` of a tuple of ints, which CPython computes without the string-hash
    seed, so results are identical in every process.
    """
    return BlockHash(hash((parent, content)))


class AllocStatus(enum.Enum):
    """Answer of a v0 admission query (`can_allocate`, `can_swap_in`)."""

    OK = "ok"
    LATER = "later"
    NEVER = "never"


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH_CAPPED = "finished_length_capped"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_IGNORED = "finished_ignored"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED_STATUSES


_FINISHED_STATUSES = frozenset(s for s in SequenceStatus if s.name.startswith("FINISHED"))


class ManagerError(Exception):
    """A failure vLLM's block-manager code raises at this point, so the real engine would too.

    A model raises a subclass on purpose where it models such a failure (each subclass names
    the upstream one); the real-vLLM adapters (`sim.vllm_real`) translate vLLM's own exception
    into one. The auditor records these, and only these, as violations: any other exception
    out of a model is a kvsim bug and propagates as an internal error.
    """


class NoFreeBlocksError(ValueError, ManagerError):
    """Raised by a v0 allocator whose free list ran dry (vLLM's `NoFreeBlocksError`)."""


class NullBlockWriteError(ValueError, ManagerError):
    """A write to v0-V2's null block (vLLM's ValueError "null block should not be modified")."""


class EmptyAppendIndexError(IndexError, ManagerError):
    """vLLM 0.5.4's v0-V2 block table indexes past a full table on an empty append (the
    IndexError of #7371, fixed by #7380): the last chunk of a block-aligned chunked prefill."""


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of `num_tokens` tokens drawn from content stream `key` (offsets 0..n-1)."""

    key: int
    num_tokens: int


@dataclass(slots=True)
class TokenContent:
    """The token ids of one sequence, as segments, growing as outputs are appended."""

    segments: list[Segment] = field(default_factory=list)
    _starts: list[int] = field(default_factory=list)
    num_tokens: int = 0
    # Generated tokens not yet folded into `segments`: appending one token per decode step is
    # the hottest operation of a replay, so it only bumps counters (see `_fold`).
    _open_key: int = 0
    _open_len: int = 0

    @classmethod
    def from_segments(cls, segments: list[Segment]) -> TokenContent:
        content = cls()
        for seg in segments:
            content._push(seg)
        return content

    @classmethod
    def unique(cls, key: int, num_tokens: int) -> TokenContent:
        """A prompt of `num_tokens` tokens that shares nothing with other keys."""
        return cls.from_segments([Segment(key, num_tokens)])

    def _push(self, seg: Segment) -> None:
        assert not self._open_len, "fold generated tokens before pushing a segment"
        if seg.num_tokens <= 0:
            return
        self._starts.append(self.num_tokens)
        self.segments.append(seg)
        self.num_tokens += seg.num_tokens

    def append_output(self, seq_key: int, num_tokens: int = 1) -> None:
        """Append `num_tokens` generated tokens from the sequence's own stream `seq_key`."""
        if num_tokens <= 0:
            return
        if self._open_len and self._open_key != seq_key:
            self._fold()
        self._open_key = seq_key
        self._open_len += num_tokens
        self.num_tokens += num_tokens

    def _fold(self) -> None:
        """Move the open run of generated tokens into `segments`, merging with a same-key tail."""
        if not self._open_len:
            return
        key, length = self._open_key, self._open_len
        self._open_len = 0
        last = self.segments[-1] if self.segments else None
        if last is not None and last.key == key:
            self.segments[-1] = Segment(key, last.num_tokens + length)
        else:
            self._starts.append(self.num_tokens - length)
            self.segments.append(Segment(key, length))

    def copy(self) -> TokenContent:
        self._fold()
        return TokenContent(list(self.segments), list(self._starts), self.num_tokens)

    def truncated(self, num_tokens: int) -> TokenContent:
        """The first `num_tokens` tokens as a new content."""
        self._fold()
        out = TokenContent()
        remaining = num_tokens
        for seg in self.segments:
            if remaining <= 0:
                break
            take = min(seg.num_tokens, remaining)
            out._push(Segment(seg.key, take))
            remaining -= take
        return out

    def span_key(self, start: int, end: int) -> ContentKey:
        """Content key of tokens [start, end): ((key, from, to), ...) per overlapped segment."""
        self._fold()
        if not 0 <= start <= end <= self.num_tokens:
            raise IndexError(f"span [{start}, {end}) outside 0..{self.num_tokens}")
        parts: list[tuple[int, int, int]] = []
        i = bisect.bisect_right(self._starts, start) - 1
        pos = start
        while pos < end:
            seg_start = self._starts[i]
            seg = self.segments[i]
            stop = min(end, seg_start + seg.num_tokens)
            parts.append((seg.key, pos - seg_start, stop - seg_start))
            pos = stop
            i += 1
        return tuple(parts)

    def block_key(self, block_index: int, block_size: int) -> ContentKey:
        """Content key of full logical block `block_index` (must be full)."""
        start = block_index * block_size
        return self.span_key(start, start + block_size)

    def block_hashes(
        self, block_size: int, num_blocks: int, parent: int = NONE_HASH
    ) -> list[BlockHash]:
        """Chained hashes of the first `num_blocks` full blocks.

        Equal hashes at index i mean equal token prefixes up to the end of block i.
        """
        out: list[BlockHash] = []
        h = parent
        for i in range(num_blocks):
            h = chain_hash(h, self.block_key(i, block_size))
            out.append(BlockHash(h))
        return out

    def token_ids(
        self, start: int = 0, end: int | None = None, vocab_size: int = 32000
    ) -> list[int]:
        """Deterministic token ids for [start, end): equal content keys give equal ids."""
        end = self.num_tokens if end is None else end
        ids: list[int] = []
        for key, lo, hi in self.span_key(start, end) if end > start else ():
            base = _splitmix64(key & _MASK64)
            ids.extend(_splitmix64(base ^ off) % vocab_size for off in range(lo, hi))
        return ids


@dataclass(slots=True, eq=False)
class Sequence:
    """One token sequence (vLLM `Sequence`); also the unit the V1-engine manager works on.

    `num_computed_tokens` is the KV already written (C in the spec); the scheduler owns it.
    """

    seq_id: int
    content: TokenContent
    prompt_len: int
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    #: V1 async scheduling at 0.33.0: tokens scheduled whose step's output has not been
    #: applied yet (vLLM's `Request.num_in_flight_tokens`); 0 in a synchronous engine.
    num_in_flight_tokens: int = 0
    #: Mamba "align" on 0.33.0: the shared-prefix junction the last prefix lookup found
    #: (vLLM's `Request.shared_prefix_boundary`); sparse retention keeps the state there.
    shared_prefix_boundary: int = 0

    @classmethod
    def new(cls, seq_id: int, prompt: TokenContent | int) -> Sequence:
        content = TokenContent.unique(seq_id, prompt) if isinstance(prompt, int) else prompt
        return cls(seq_id, content, content.num_tokens)

    @property
    def num_tokens(self) -> int:
        return self.content.num_tokens

    @property
    def output_len(self) -> int:
        return self.content.num_tokens - self.prompt_len

    @property
    def output_key(self) -> int:
        # Negative keys never collide with trace-derived (non-negative) prompt keys.
        return -(self.seq_id + 1)

    def append_tokens(self, num_tokens: int = 1) -> None:
        self.content.append_output(self.output_key, num_tokens)

    def n_blocks(self, block_size: int) -> int:
        return -(-self.num_tokens // block_size)

    def fork(self, child_id: int) -> Sequence:
        return Sequence(
            child_id, self.content.copy(), self.prompt_len, self.status, self.num_computed_tokens
        )

    def is_finished(self) -> bool:
        return self.status.is_finished


@dataclass(slots=True, eq=False)
class SequenceGroup:
    """A request in the v0 engine: one or more sequences sharing a prompt (vLLM `SequenceGroup`)."""

    request_id: int
    seqs: list[Sequence]
    arrival_s: float = 0.0
    priority: int = 0
    best_of: int = 1

    def get_seqs(self, status: SequenceStatus | None = None) -> list[Sequence]:
        if status is None:
            return list(self.seqs)
        return [s for s in self.seqs if s.status is status]

    def num_seqs(self, status: SequenceStatus | None = None) -> int:
        return len(self.get_seqs(status))

    def get_unfinished_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.is_finished()]

    def get_max_num_running_seqs(self) -> int:
        """Seqs this group may run: upstream main's rule (`vllm/sequence.py:L644-660 @fc93e56`).

        Kept from fc93e56 on purpose (not re-checked: that commit is not installed): the 0.5.4
        wheel (`vllm/sequence.py:L529-545 (0.5.4)`) returns `best_of` whenever it exceeds
        `num_seqs()`, with no prefill test; both agree for an unfinished ``best_of == 1`` request.
        """
        if self.best_of == 1 and len(self.seqs) == 1:  # the common n=1 request, once per step
            return 0 if self.seqs[0].status in _FINISHED_STATUSES else 1
        if (
            self.best_of > len(self.get_unfinished_seqs())
            and self.seqs
            and self.seqs[0].output_len == 0
        ):
            return self.best_of
        return len(self.get_unfinished_seqs())

    def is_finished(self) -> bool:
        return all(s.is_finished() for s in self.seqs)


def cdiv(a: int, b: int) -> int:
    """Ceiling division: cdiv(17, 16) == 2."""
    return -(-a // b)


class DoubleFreeError(ValueError, ManagerError):
    """Freeing a block whose refcount is already 0 (vLLM v0 "Double free! ...")."""


def num_leading_nulls(blocks: list[Any]) -> int:
    """How many entries at the front of a block table are null blocks (`.is_null`).

    Tables whose null entries form a prefix (the sliding-window drop and skip nulls indices
    from 0 upward) are searched in O(log n). Example: [NULL, NULL, 7, 8] -> 2.
    """
    lo, hi = 0, len(blocks)
    while lo < hi:
        mid = (lo + hi) // 2
        if blocks[mid].is_null:
            lo = mid + 1
        else:
            hi = mid
    return lo
