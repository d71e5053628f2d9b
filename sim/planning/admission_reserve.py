"""The admission reserve: blocks the full-sequence gate charges a request but it never holds.

From 0.19.1 vLLM admits a waiting request only if the blocks of its whole sequence fit
(`sim.kv.v1_engine.admission`). A sliding-window group's charge is capped, from 0.20.0, at the
per-request bound `cdiv(min(W - 1 + T, max_model_len), bs) + 1`
(`SlidingWindowSpec.max_admission_blocks_per_request`, `kv_cache_interface.py:L918-944
@0.33.0`), with T the token budget (0.20.0, 0.25.1) or `max_in_flight_tokens` (0.26.0 on:
the budget times `max_concurrent_batches`, 2 under async scheduling). Once its tokens are
processed a request holds only the window: `cdiv(W - 1, bs) + 1` blocks. The difference is
charged to every request although the tokens in flight, across all requests, never exceed T:
vllm #54703 (open on 0.26.0-0.33.0) reports it for a short-convolution state exposed as a
4-token window with 4-token blocks, where it is almost the whole charge.

Worked example (#54703's numbers: T = 32,768 in flight, a 4-token window in 4-token blocks,
and a 512-token window in 32-token blocks, a long request): the gate charges
cdiv(3 + 32,768, 4) + 1 = 8,194 and cdiv(511 + 32,768, 32) + 1 = 1,041 blocks; the request holds
cdiv(3, 4) + 1 = 2 and cdiv(511, 32) + 1 = 17 once processed. The reserve is 8,192 + 1,024
blocks per request, 99.8% of the two groups' charge.

kvsim reports what the release does; the pooled reserve #54703 proposes (each request charged
its window, one shared reserve of `cdiv(T, bs)` per group) is shown next to it as what the
pool would admit then, labelled as a proposal, not as any release's behaviour.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sim.kv.types import cdiv
from sim.kv.v1_engine.admission import admission_cap_blocks


@dataclass(frozen=True, slots=True)
class GroupReserve:
    """One KV-cache group's charge at the gate and what a request holds once processed."""

    group_id: int
    sliding_window: int | None
    block_size: int
    #: Blocks the full-sequence gate charges one request of `request_tokens`.
    charged_blocks: int
    #: Blocks the request holds once every token is processed (the window, or all of them).
    resident_blocks: int
    #: The pooled in-flight reserve #54703 proposes for the group: cdiv(T, bs) (0: full
    #: attention, whose charge is all resident).
    shared_reserve_blocks: int
    #: Chunked-local attention's chunk (None: full or sliding window).
    attention_chunk_size: int | None = None

    @property
    def reserved_blocks(self) -> int:
        return self.charged_blocks - self.resident_blocks


@dataclass(frozen=True, slots=True)
class AdmissionReserve:
    """The gate's per-request charge against what requests hold, over a pool of
    `usable_blocks` (the null block excluded).

    Example: usable 10,000 blocks, charges 8,194 + 1,041, resident 2 + 17, shared reserves
    8,192 + 1,024: the gate admits 10,000 // 9,235 = 1 such request at once; with the reserve
    pooled (10,000 - 9,216) // 19 = 41 would fit.
    """

    request_tokens: int
    in_flight_tokens: int
    usable_blocks: int
    groups: tuple[GroupReserve, ...]

    @property
    def charged_blocks(self) -> int:
        return sum(g.charged_blocks for g in self.groups)

    @property
    def resident_blocks(self) -> int:
        return sum(g.resident_blocks for g in self.groups)

    @property
    def reserved_blocks(self) -> int:
        return self.charged_blocks - self.resident_blocks

    @property
    def reserved_share(self) -> float:
        """The share of each request's charge it never holds once processed."""
        return self.reserved_blocks / self.charged_blocks if self.charged_blocks else 0.0

    @property
    def gate_concurrency(self) -> int:
        """How many such requests the gate admits at once into an empty pool."""
        return self.usable_blocks // self.charged_blocks if self.charged_blocks else 0

    @property
    def pooled_concurrency(self) -> int:
        """How many would fit with the in-flight reserve pooled (#54703's proposal)."""
        shared = sum(g.shared_reserve_blocks for g in self.groups)
        left = max(self.usable_blocks - shared, 0)
        return left // self.resident_blocks if self.resident_blocks else 0

    def as_dict(self) -> dict[str, object]:
        return {
            "request_tokens": self.request_tokens,
            "in_flight_tokens": self.in_flight_tokens,
            "usable_blocks": self.usable_blocks,
            "groups": [asdict(g) | {"reserved_blocks": g.reserved_blocks} for g in self.groups],
            "charged_blocks": self.charged_blocks,
            "resident_blocks": self.resident_blocks,
            "reserved_share": round(self.reserved_share, 6),
            "gate_concurrency": self.gate_concurrency,
            "pooled_concurrency": self.pooled_concurrency,
        }


def group_reserve(
    group_id: int,
    sliding_window: int | None,
    block_size: int,
    request_tokens: int,
    in_flight_tokens: int | None,
    max_model_len: int,
    *,
    attention_chunk_size: int | None = None,
) -> GroupReserve:
    """One group's charge for a request of `request_tokens` (None `in_flight_tokens`: the
    release has no cap, 0.19.1). Example: W=4, bs=4, T=32,768, a 65,536-token request:
    charged min(16,384, 8,194) = 8,194, resident 2, shared reserve 8,192. Chunked-local
    attention (chunks of A) is capped at cdiv(min(A + T, max_model_len), bs) and holds the
    last chunk's blocks once processed: A=8,192, bs=16, T=16,384, 131,071 tokens -> charged
    1,536, resident 512."""
    required = cdiv(request_tokens, block_size)
    if sliding_window is None and attention_chunk_size is None:
        return GroupReserve(group_id, None, block_size, required, required, 0)
    charged = required
    if attention_chunk_size is not None:
        cap = cdiv(min(attention_chunk_size + (in_flight_tokens or 0), max_model_len), block_size)
        skipped = request_tokens // attention_chunk_size * attention_chunk_size
        resident = required - skipped // block_size
    else:
        assert sliding_window is not None
        cap_or_none = admission_cap_blocks(
            sliding_window, block_size, in_flight_tokens or 0, max_model_len
        )
        assert cap_or_none is not None
        cap = cap_or_none
        resident = min(required, cdiv(sliding_window - 1, block_size) + 1)
    if in_flight_tokens is not None:
        charged = min(required, cap)
    shared = cdiv(in_flight_tokens or 0, block_size)
    return GroupReserve(
        group_id,
        sliding_window,
        block_size,
        charged,
        resident,
        shared,
        attention_chunk_size=attention_chunk_size,
    )


def admission_reserve(
    windows: tuple[int | None, ...],
    block_sizes: tuple[int, ...],
    usable_blocks: int,
    in_flight_tokens: int | None,
    max_model_len: int,
    request_tokens: int | None = None,
    *,
    chunk_sizes: tuple[int | None, ...] | None = None,
) -> AdmissionReserve:
    """The reserve of one request of `request_tokens` (default: `max_model_len`) over groups
    with these windows, block sizes and (chunked-local groups) chunk sizes (module docstring)."""
    tokens = min(request_tokens or max_model_len, max_model_len)
    chunks = chunk_sizes or (None,) * len(windows)
    groups = tuple(
        group_reserve(
            i, window, bs, tokens, in_flight_tokens, max_model_len, attention_chunk_size=chunk
        )
        for i, (window, bs, chunk) in enumerate(zip(windows, block_sizes, chunks, strict=True))
    )
    return AdmissionReserve(tokens, in_flight_tokens or 0, usable_blocks, groups)
