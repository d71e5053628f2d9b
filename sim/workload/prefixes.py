"""Mooncake-style prefix-block hash ids to shared prompt segments.

A hash id names a block of `block_tokens` prompt tokens *and everything before it* (upstream
hashes are chained), so id h is mapped to content segment Segment(key=h, num_tokens=block):
two prompts whose id lists start alike get equal leading segments, hence equal block keys and
chained block hashes at ANY simulator block size (16, 48, 512, ...), even one that does not
divide 512.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import numpy as np

from sim.kv.types import Segment
from sim.workload._table import RowLocator
from sim.workload.request import MAX_HASH_ID


def hash_prefixes(
    hash_ids: list[Any],
    prompt_tokens: np.ndarray,
    block_tokens: int,
    loc: RowLocator,
    name: str = "hash_ids",
    optional: bool = False,
) -> list[tuple[Segment, ...]]:
    """Hash ids to segments: id h -> Segment(h, block_tokens), the last block partial.

    Example (block 512): input 1100 tokens, ids [0, 5, 9] ->
    (Segment(0, 512), Segment(5, 512), Segment(9, 76)). Two prompts whose ids start with
    [0, 5] share their first 1024 tokens at any block size.
    """
    num_rows = len(hash_ids)
    present = [ids is not None for ids in hash_ids] if optional else [True] * num_rows
    for i, ids in enumerate(hash_ids):
        if present[i] and (ids.__class__ is not list or not ids):
            raise loc.error(i, name, "expected a non-empty list of non-negative integers")
    rows = [i for i in range(num_rows) if present[i]]
    lists = [hash_ids[i] for i in rows]
    counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    want = -(-prompt_tokens[rows] // block_tokens)
    bad = counts != want
    if bad.any():
        j = int(np.argmax(bad))
        raise loc.error(
            rows[j],
            name,
            f"has {counts[j]} ids but ceil({prompt_tokens[rows[j]]} prompt tokens / "
            f"{block_tokens}) = {want[j]}",
        )
    _check_ids(lists, counts, rows, loc, name)
    full = _SegmentCache(block_tokens)
    out: list[tuple[Segment, ...]] = [()] * num_rows
    for i, ids in zip(rows, lists, strict=True):
        last_size = int(prompt_tokens[i]) - block_tokens * (len(ids) - 1)
        last = full[ids[-1]] if last_size == block_tokens else Segment(ids[-1], last_size)
        out[i] = (*map(full.__getitem__, ids[:-1]), last)
    return out


class _SegmentCache(dict):
    """Full-block segments by hash id, created once: a hot shared block is one object."""

    def __init__(self, block_tokens: int) -> None:
        super().__init__()
        self.block_tokens = block_tokens

    def __missing__(self, key: int) -> Segment:
        seg = self[key] = Segment(key, self.block_tokens)
        return seg


def _check_ids(
    lists: list[list[Any]], counts: np.ndarray, rows: list[int], loc: RowLocator, name: str
) -> None:
    """Every id an int in [0, 2**40), checked over the flattened ids at once."""
    flat = list(itertools.chain.from_iterable(lists))
    values = None
    if set(map(type, flat)) <= {int}:
        with contextlib.suppress(OverflowError):
            values = np.array(flat, dtype=np.int64)
    if values is not None:
        bad = (values < 0) | (values >= MAX_HASH_ID)
    else:
        bad = np.array([v.__class__ is not int or not 0 <= v < MAX_HASH_ID for v in flat])
    if bad.any():
        k = int(np.argmax(bad))
        j = int(np.searchsorted(np.cumsum(counts), k, side="right"))
        raise loc.error(rows[j], name, f"id {flat[k]!r} is not an integer in [0, 2**40)")
