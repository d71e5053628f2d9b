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
====================  ===============================  =====================================

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
from typing import Any

import pandas as pd

from sim.kv.types import Segment, TokenContent

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
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    priority: int = 0
    prefix: tuple[Segment, ...] = field(default=(), repr=False)

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
            if seg.key < 0 or seg.num_tokens < 1:
                raise ValueError(
                    f"request {self.request_id}: prefix segments need a key >= 0 and >= 1 token"
                )
            num_prefix_tokens += seg.num_tokens
        if num_prefix_tokens > self.prompt_tokens:
            raise ValueError(
                f"request {self.request_id}: prefix has {num_prefix_tokens} tokens, "
                f"more than prompt_tokens={self.prompt_tokens}"
            )

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
        reqs = self.requests
        return pd.DataFrame(
            {
                "request_id": pd.array([r.request_id for r in reqs], dtype="int64"),
                "arrival_s": pd.array([r.arrival_s for r in reqs], dtype="float64"),
                "prompt_tokens": pd.array([r.prompt_tokens for r in reqs], dtype="int64"),
                "output_tokens": pd.array([r.output_tokens for r in reqs], dtype="int64"),
                "priority": pd.array([r.priority for r in reqs], dtype="int64"),
                "num_prefix_segments": pd.array([len(r.prefix) for r in reqs], dtype="int64"),
                "num_prefix_tokens": pd.array([r.num_prefix_tokens for r in reqs], dtype="int64"),
            }
        )
