"""The run's summary statistics, gathered from the table chunks as they are written.

Counts, sums and maxima are kept as numbers. The latency percentiles need the values: the
finished requests' TTFT, TPOT and end-to-end latency go, chunk by chunk, to a `Spill` (in
memory for the Python API, an anonymous temporary file when the tables stream to files), and
`exact_percentiles` finds each percentile in two passes over them with memory independent of
their number (up to 65,536 values it sorts them all: one pass, no 8 MB histogram). The result
equals `np.percentile` (linear interpolation) bit for bit.

Example: ttft of the finished requests [0.5, 0.1, 0.3] -> p50 0.3; p99 = 0.3 + 0.98 * (0.5 -
0.3) = 0.496.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import IO

import numpy as np

from sim.output.records import Columns

LATENCY_COLUMNS = ("ttft_s", "tpot_s", "e2e_s")
STATES = ("finished", "ignored", "failed", "aborted")

#: Pass 1 histograms the top bits of each value's order-preserving key: 2**20 buckets.
_BUCKET_BITS = 20
_SHIFT = np.uint64(64 - _BUCKET_BITS)
_SIGN = np.uint64(1 << 63)


def _keys(values: np.ndarray) -> np.ndarray:
    """uint64 keys in the order of the float64 `values` (IEEE bits, negatives flipped)."""
    bits = values.view(np.uint64)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def _bucket(values: np.ndarray) -> np.ndarray:
    return (_keys(values) >> _SHIFT).astype(np.intp)


def _lerp(n: int, q: float, value_at: Callable[[int], float]) -> float:
    """`np.percentile(v, q)` of n sorted values, reading only the two it needs (`value_at`)."""
    virtual = (n - 1) * (np.float64(q) / 100)
    if virtual >= n - 1:
        return float(value_at(n - 1))
    previous = math.floor(virtual)
    gamma = np.float64(virtual - previous)
    a = np.float64(value_at(previous))
    b = np.float64(value_at(previous + 1))
    diff = b - a
    # numpy's `_lerp`: from the nearer end, so that gamma 1 gives b exactly.
    return float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)


#: Up to this many values `exact_percentiles` joins and sorts them (512 KiB): cheaper than the
#: 8 MB histogram's bincount and cumsum, which cost ~7 ms a call whatever the count.
IN_MEMORY_MAX = 1 << 16


def exact_percentiles(
    chunks: Callable[[], Iterable[np.ndarray]],
    qs: Sequence[float],
    in_memory_max: int = IN_MEMORY_MAX,
) -> list[float]:
    """`np.percentile(all, q)` for each q, where `all` is every chunk joined (no NaN).

    Up to `in_memory_max` values: all of them, sorted. More: two passes over `chunks()`, the
    count and a histogram of bucket numbers (the top 20 bits of each key), then the values of
    the few buckets holding the ranks needed, sorted. Memory: the histogram (8 MB) and those
    buckets, not the values. Both read the same ranks and interpolate them alike (`_lerp`).
    """
    kept: list[np.ndarray] | None = []  # the values while they are few; None once they are not
    hist = np.zeros(0, np.int64)
    n = 0
    for values in chunks():
        n += len(values)
        if kept is not None:
            kept.append(values)
            if n <= in_memory_max:
                continue
            hist, values, kept = np.zeros(1 << _BUCKET_BITS, np.int64), np.concatenate(kept), None
        if len(values):
            hist += np.bincount(_bucket(values), minlength=1 << _BUCKET_BITS)
    if n == 0:
        return [math.nan] * len(qs)
    if kept is not None:
        every = np.sort(np.concatenate(kept))
        return [_lerp(n, q, every.__getitem__) for q in qs]
    ends = np.cumsum(hist)  # ends[b]: how many values sort before the end of bucket b
    ranks: set[int] = set()
    for q in qs:
        virtual = (n - 1) * (np.float64(q) / 100)
        first = n - 1 if virtual >= n - 1 else math.floor(virtual)
        ranks.update((first, min(first + 1, n - 1)))
    bucket_of = {r: int(np.searchsorted(ends, r, side="right")) for r in ranks}
    wanted = np.array(sorted(set(bucket_of.values())), dtype=np.intp)
    parts: dict[int, list[np.ndarray]] = {int(b): [] for b in wanted}
    for values in chunks():
        buckets = _bucket(values)
        for b, part in parts.items():
            part.append(values[buckets == b])
    sorted_parts = {b: np.sort(np.concatenate(part)) for b, part in parts.items()}

    def value_at(rank: int) -> float:
        b = bucket_of[rank]
        return sorted_parts[b][rank - (ends[b] - hist[b])]

    return [_lerp(n, q, value_at) for q in qs]


class _Reader:
    """Values from a chunk iterator, `take(k)` at a time, in order."""

    def __init__(self, chunks: Iterator[np.ndarray]) -> None:
        self._chunks = chunks
        self._buffer = np.empty(0)
        self._at = 0

    def take(self, k: int) -> np.ndarray:
        parts = []
        while k:
            if self._at == len(self._buffer):
                self._buffer, self._at = next(self._chunks), 0
            part = self._buffer[self._at : self._at + k]
            self._at += len(part)
            k -= len(part)
            parts.append(part)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _pairwise_sum(take: Callable[[int], np.ndarray], n: int) -> np.float64:
    """numpy's sum of `n` float64 values read in order, in numpy's own order of additions
    (pairwise: halves split at a multiple of 8, blocks of at most 128 summed in 8 lanes), so
    the mean of a column read in chunks equals the mean pandas takes of the whole column."""
    if n < 8:
        res = np.float64(0.0)
        for x in take(n):
            res += x
        return res
    if n <= 128:
        values = take(n)
        whole = n - n % 8
        lanes = np.add.reduce(values[:whole].reshape(-1, 8), axis=0)  # row after row
        res = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + (
            (lanes[4] + lanes[5]) + (lanes[6] + lanes[7])
        )
        for x in values[whole:]:
            res += x
        return res
    half = n // 2
    half -= half % 8
    left = _pairwise_sum(take, half)
    return left + _pairwise_sum(take, n - half)


def chunked_mean(chunks: Iterable[np.ndarray], n: int) -> float:
    """`np.mean` (and pandas' `Series.mean`) of the `n` values of `chunks`, bit for bit."""
    return float(_pairwise_sum(_Reader(iter(chunks)).take, n) / n)


class Spill:
    """Float64 columns appended chunk by chunk and read back chunk by chunk.

    In memory, or (`to_file`) in an anonymous temporary file that disappears when closed.
    """

    def __init__(self, names: Sequence[str], to_file: bool) -> None:
        self.names = tuple(names)
        self._memory: dict[str, list[np.ndarray]] | None = None
        self._files: dict[str, IO[bytes]] | None = None
        if to_file:
            # Closed in `close()` (the summary's end), which outlives any `with` block here.
            self._files = {name: tempfile.TemporaryFile() for name in self.names}  # noqa: SIM115
        else:
            self._memory = {name: [] for name in self.names}

    def append(self, name: str, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=np.float64)
        if self._files is not None:
            self._files[name].write(values.tobytes())
        else:
            assert self._memory is not None
            self._memory[name].append(values)

    def chunks(self, name: str, chunk_values: int = 1 << 20) -> Iterator[np.ndarray]:
        if self._files is None:
            assert self._memory is not None
            yield from self._memory[name]
            return
        file = self._files[name]
        file.flush()
        file.seek(0)
        while True:
            data = file.read(chunk_values * 8)
            if not data:
                return
            yield np.frombuffer(data, dtype=np.float64)

    def close(self) -> None:
        for file in (self._files or {}).values():
            file.close()


class RunStats:
    """Listens to the `requests` and `steps` chunks; `summary_numbers()` at the end."""

    def __init__(self, num_gpu_blocks: int, spill_to_file: bool) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.num_requests = 0
        self.states = dict.fromkeys(STATES, 0)
        self.finished_generated_tokens = 0
        self.num_preemptions = 0
        self.num_steps = 0
        self.used_blocks_max = 0
        self.latencies = Spill(LATENCY_COLUMNS, spill_to_file)
        #: num_used_blocks / num_gpu_blocks of every step, for the mean (`chunked_mean`).
        self.kv_util = Spill(("kv_util",), spill_to_file)

    def on_requests(self, columns: Columns) -> None:
        state = columns["state"]
        self.num_requests += len(state)
        for name in STATES:
            self.states[name] += int(np.count_nonzero(state == name))
        finished = state == "finished"
        self.finished_generated_tokens += int(columns["generated_tokens"][finished].sum())
        self.num_preemptions += int(columns["num_preemptions"].sum())
        for name in LATENCY_COLUMNS:
            values = columns[name][finished]
            self.latencies.append(name, values[~np.isnan(values)])

    def on_steps(self, columns: Columns) -> None:
        used = columns["num_used_blocks"]
        self.num_steps += len(used)
        if len(used):
            self.used_blocks_max = max(self.used_blocks_max, int(used.max()))
            if self.num_gpu_blocks:
                self.kv_util.append("kv_util", used / self.num_gpu_blocks)

    def summary_numbers(self, duration_s: float) -> dict:
        """The summary's counts, throughputs, latency percentiles and KV use.

        KV use: `num_used_blocks / num_gpu_blocks` per step, its mean and its maximum.
        """
        finished = self.states["finished"]
        numbers: dict = {
            "num_requests": self.num_requests,
            "states": dict(self.states),
            "simulated_s": float(duration_s),
            "num_steps": self.num_steps,
            "throughput_req_per_s": float(finished / duration_s) if duration_s > 0 else 0.0,
            "throughput_tok_per_s": float(self.finished_generated_tokens / duration_s)
            if duration_s > 0
            else 0.0,
        }
        for name in LATENCY_COLUMNS:
            p50, p99 = exact_percentiles(partial(self.latencies.chunks, name), (50, 99))
            stem = name.removesuffix("_s")
            numbers[f"{stem}_p50_s"] = p50
            numbers[f"{stem}_p99_s"] = p99
        numbers["num_preemptions"] = self.num_preemptions
        blocks = self.num_gpu_blocks
        if self.num_steps and blocks:
            numbers["kv_util_mean"] = chunked_mean(self.kv_util.chunks("kv_util"), self.num_steps)
            numbers["kv_util_max"] = self.used_blocks_max / blocks
        else:
            numbers["kv_util_mean"] = numbers["kv_util_max"] = 0.0
        self.latencies.close()
        self.kv_util.close()
        return numbers
