"""One request of a workload (`RequestSpec`) and a whole workload (`Workload`).

A trace gives lengths and, at most, which prompts share a prefix. A request's prompt is kept
as content segments (`sim.kv.types.Segment`): its shared leading segments in `prefix`, then a
segment unique to the request for the rest. Requests whose prefixes start with the same
segments have equal leading tokens, so equal block keys, at every block size.

Content keys live in disjoint non-negative ranges (negative keys are the generated outputs of
`sim.kv.types.Sequence`), so nothing is shared by accident:

====================  ===============================  =====================================
range                 key                              used for
====================  ===============================  =====================================
[0, 2**40)            hash id ``h``                    Mooncake / canonical ``hash_ids``
[2**40, 2**41)        ``PREFIX_KEY_BASE + prefix_id``  canonical ``prefix_id``
[2**41, 2**62)        ``UNIQUE_KEY_BASE + request_id`` the request's own remainder
< 0                   ``-(request_id + 1)``            an earlier request's generated output
====================  ===============================  =====================================

A negative key in a prefix is how a session's turn repeats the previous turn's output in its
prompt (`sim.workload.sessions`): the engine generates request r's output tokens under key
``-(r + 1)`` (`sim.kv.types.Sequence.output_key`), so the next turn's prompt has the same token
content, hence the same block hashes, as the previous turn's whole sequence.

Worked example (block size 4)::

    spec = RequestSpec(7, 0.0, prompt_tokens=10, output_tokens=5,
                       prefix=(Segment(3, 4), Segment(9, 2)))
    content = spec.prompt_content()
    # segments: (3, 4 tokens), (9, 2 tokens), (2**41 + 7, 4 tokens)
    content.block_key(1, 4) == ((9, 0, 2), (2**41 + 7, 0, 2))
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sim.kv.types import Segment, TokenContent

if TYPE_CHECKING:
    import pandas as pd

#: Hash ids (Mooncake, canonical ``hash_ids``) are used as keys as is; they must be below this.
MAX_HASH_ID = 2**40
#: Canonical ``prefix_id`` p becomes key ``PREFIX_KEY_BASE + p``.
PREFIX_KEY_BASE = 2**40
MAX_PREFIX_ID = 2**40
#: The part of a prompt that no other request shares: key ``UNIQUE_KEY_BASE + request_id``.
UNIQUE_KEY_BASE = 2**41
MAX_REQUEST_ID = 2**61


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What arrives: lengths, arrival time, priority and the shared part of the prompt.

    `prefix` holds the leading content segments that may be shared with other requests; their
    token counts sum to at most `prompt_tokens`. `output_tokens` is the number of tokens the
    request generates (at least 1: vLLM always samples one).

    A turn of a session (`sim.workload.sessions`) has `session_id` and `turn` (1, 2, ...).
    `think_s` None: it arrives at `arrival_s` (open loop). A float: closed loop, it arrives
    `think_s` after the previous turn of its session finished, and `arrival_s` is only a lower
    bound (the session's start plus the think times before it); the engine sets the arrival.
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    priority: int = 0
    prefix: tuple[Segment, ...] = field(default=(), repr=False)
    session_id: int | None = None
    turn: int | None = None
    think_s: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.request_id < MAX_REQUEST_ID:
            raise ValueError(f"request {self.request_id}: request_id outside [0, 2**61)")
        if not (math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise ValueError(f"request {self.request_id}: arrival_s must be finite and >= 0")
        if self.prompt_tokens < 1:
            raise ValueError(f"request {self.request_id}: prompt_tokens must be >= 1")
        if self.output_tokens < 1:
            raise ValueError(f"request {self.request_id}: output_tokens must be >= 1")
        num_prefix_tokens = 0
        for seg in self.prefix:
            # A negative key is an earlier request's output (-(r + 1), r < request_id).
            if seg.num_tokens < 1 or not -self.request_id <= seg.key:
                raise ValueError(
                    f"request {self.request_id}: prefix segments need >= 1 token and a key "
                    ">= 0 or naming an earlier request's output"
                )
            num_prefix_tokens += seg.num_tokens
        if num_prefix_tokens > self.prompt_tokens:
            raise ValueError(
                f"request {self.request_id}: prefix has {num_prefix_tokens} tokens, "
                f"more than prompt_tokens={self.prompt_tokens}"
            )
        if (self.session_id is None) != (self.turn is None) or (
            self.think_s is not None and self.session_id is None
        ):
            raise ValueError(f"request {self.request_id}: turn/think_s need a session_id")
        if self.turn is not None and self.turn < 1:
            raise ValueError(f"request {self.request_id}: turn must be >= 1")
        if self.think_s is not None and not (math.isfinite(self.think_s) and self.think_s >= 0):
            raise ValueError(f"request {self.request_id}: think_s must be finite and >= 0")

    @property
    def num_prefix_tokens(self) -> int:
        return sum(seg.num_tokens for seg in self.prefix)

    @property
    def unique_key(self) -> int:
        """Content key of the part of the prompt no other request shares."""
        return UNIQUE_KEY_BASE + self.request_id

    def prompt_content(self) -> TokenContent:
        """The prompt as token content: the prefix, then a segment unique to this request."""
        segments = list(self.prefix)
        remainder = self.prompt_tokens - self.num_prefix_tokens
        if remainder > 0:
            segments.append(Segment(self.unique_key, remainder))
        return TokenContent.from_segments(segments)


@dataclass(slots=True)
class Workload:
    """The requests of a run, sorted by arrival, plus where they came from.

    `metadata` records the source file, its format, the number of rows read and every
    transform applied (window, scaling) with how many requests each one excluded, so every
    row of the input is accounted for.
    """

    requests: Sequence[RequestSpec]
    source: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[RequestSpec]:
        return iter(self.requests)

    def __getitem__(self, index: int) -> RequestSpec:
        return self.requests[index]

    @property
    def span_s(self) -> float:
        """Last arrival minus first arrival (0 for fewer than two requests)."""
        if len(self.requests) < 2:
            return 0.0
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    def to_frame(self) -> pd.DataFrame:
        """One row per request: id, arrival, lengths, priority and shared-prefix size."""
        import pandas as pd

        names = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "priority")
        columns: dict[str, list] = {name: [] for name in (*names, "segments", "prefix_tokens")}
        for r in self.requests:  # one pass: a streamed trace is read once, not seven times
            columns["request_id"].append(r.request_id)
            columns["arrival_s"].append(r.arrival_s)
            columns["prompt_tokens"].append(r.prompt_tokens)
            columns["output_tokens"].append(r.output_tokens)
            columns["priority"].append(r.priority)
            columns["segments"].append(len(r.prefix))
            columns["prefix_tokens"].append(r.num_prefix_tokens)
        return pd.DataFrame(
            {
                "request_id": pd.array(columns["request_id"], dtype="int64"),
                "arrival_s": pd.array(columns["arrival_s"], dtype="float64"),
                "prompt_tokens": pd.array(columns["prompt_tokens"], dtype="int64"),
                "output_tokens": pd.array(columns["output_tokens"], dtype="int64"),
                "priority": pd.array(columns["priority"], dtype="int64"),
                "num_prefix_segments": pd.array(columns["segments"], dtype="int64"),
                "num_prefix_tokens": pd.array(columns["prefix_tokens"], dtype="int64"),
            }
        )
