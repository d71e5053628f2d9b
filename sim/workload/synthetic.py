"""Seeded synthetic arrivals and lengths.

One `numpy.random.SeedSequence(seed)` is split into independent streams for arrivals, prompt
lengths and output lengths, so changing the length distribution never moves the arrivals.

Arrivals: the first request arrives at 0; inter-arrival gaps are i.i.d. with mean 1/rate and
coefficient of variation cv. Poisson = exponential gaps (cv 1). Gamma: shape k = 1/cv**2,
scale = 1/(rate*k); cv 0 gives constant gaps. Example: rate 4/s, cv 2 -> k = 0.25,
scale = 1.0 s, mean gap 0.25 s, gap std 0.5 s (bursty).

A synthetic workload is drawn lazily (`LazySpecs`): its requests come chunk by chunk as they
are iterated, in arrival order, so a run of millions of requests never holds them all. Every
draw (gaps, lengths, rows) takes one value per request from its own stream, so drawing in
chunks gives the same numbers as drawing all at once (tests/engine/test_stream.py checks it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import overload

import numpy as np

from sim.files.inputs import refuse_non_regular
from sim.workload.config import ArrivalConfig, LengthDist, LengthsConfig
from sim.workload.errors import WorkloadError
from sim.workload.loaders import LengthSamples, load_lengths, load_trace
from sim.workload.request import RequestSpec, Workload

#: Integer-id labels for the spawned streams: stable even if more streams are added later.
_ARRIVAL_STREAM, _PROMPT_STREAM, _OUTPUT_STREAM = 0, 1, 2


def stream(seed: int, index: int) -> np.random.Generator:
    """The `index`-th independent generator derived from `seed`."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))


def arrival_times(
    num_requests: int, arrival: ArrivalConfig, rng: np.random.Generator
) -> np.ndarray:
    """`num_requests` non-decreasing arrival times in seconds, the first at 0."""
    return np.concatenate(([0.0], np.cumsum(_gaps(num_requests - 1, arrival, rng))))


def _gaps(num_gaps: int, arrival: ArrivalConfig, rng: np.random.Generator) -> np.ndarray:
    """`num_gaps` inter-arrival gaps in seconds (one draw each: chunks give the same gaps)."""
    mean_gap_s = 1.0 / arrival.rate_per_s
    if arrival.process == "poisson":
        return rng.exponential(mean_gap_s, num_gaps)
    if arrival.cv == 0:
        return np.full(num_gaps, mean_gap_s)
    shape = 1.0 / arrival.cv**2
    return rng.gamma(shape, mean_gap_s / shape, num_gaps)


def sample_lengths(
    dist: LengthDist,
    num: int,
    rng: np.random.Generator,
    *,
    column: str,
    base_dir: Path,
    pool: LengthSamples | None = None,
) -> np.ndarray:
    """`num` token counts from `dist` (int64, all within [min_tokens, max_tokens]).

    `pool`: the trace's lengths when `dist` is a trace, already loaded (else read here)."""
    hi = dist.max_tokens if dist.max_tokens is not None else np.iinfo(np.int64).max
    if dist.kind == "fixed":
        values = np.full(num, dist.value, dtype=np.int64)
    elif dist.kind == "uniform":
        values = rng.integers(dist.min_tokens, dist.max_tokens, size=num, endpoint=True)
    elif dist.kind == "lognormal":
        # mean m, cv c of the lognormal: sigma^2 = ln(1 + c^2), mu = ln(m) - sigma^2 / 2.
        sigma2 = np.log1p(dist.cv**2)  # type: ignore[operator]  # validated: lognormal has cv, mean
        mu = np.log(dist.mean) - sigma2 / 2  # type: ignore[arg-type]
        raw = rng.lognormal(mu, np.sqrt(sigma2), num)
        values = np.rint(np.minimum(raw, float(hi))).astype(np.int64)
    elif dist.kind == "zipf":
        ranks = np.arange(1, dist.max_tokens - dist.min_tokens + 2, dtype=np.float64)  # type: ignore[operator]  # validated
        weights = ranks**-dist.exponent  # type: ignore[operator]
        values = (
            dist.min_tokens
            - 1
            + rng.choice(ranks.astype(np.int64), size=num, p=weights / weights.sum())
        )
    else:
        pool = pool if pool is not None else trace_lengths(dist, base_dir)
        source = pool.prompt_tokens if column == "prompt" else pool.output_tokens
        values = source[rng.integers(0, len(source), size=num)]
    return np.clip(values, dist.min_tokens, hi).astype(np.int64)


def trace_lengths(dist: LengthDist, base_dir: Path) -> LengthSamples:
    """Prompt/output lengths of any trace file (a lengths CSV or a trace with arrivals)."""
    path = resolve(dist.path, base_dir)
    fmt = dist.format
    if fmt == "lengths" or (fmt == "auto" and path.suffix.lower() == ".csv" and _is_lengths(path)):
        return load_lengths(path)
    workload = load_trace(path, fmt)
    frame = workload.to_frame()
    return LengthSamples(
        frame["prompt_tokens"].to_numpy(np.int64),
        frame["output_tokens"].to_numpy(np.int64),
        str(path),
    )


def _is_lengths(path: Path) -> bool:
    from sim.workload.loaders import detect_format

    return detect_format(path) == "lengths"


def resolve(path: str | None, base_dir: Path) -> Path:
    assert path is not None, "config validation guarantees a path here"
    p = Path(path).expanduser()
    p = p if p.is_absolute() else base_dir / p
    # Before any loader opens it: a FIFO would block, a device would be read without end.
    refuse_non_regular(p, lambda reason: WorkloadError(p, reason))
    return p


#: Requests drawn at a time by `LazySpecs`.
SPEC_CHUNK = 65_536


class LazySpecs(Sequence[RequestSpec]):
    """The requests of a seeded synthetic workload, drawn chunk by chunk as they are iterated.

    Ids 0..n-1 in arrival order (`in_arrival_order`: the engine consumes them as they come,
    `sim.engine.engine.in_arrival_order`). Indexing re-draws up to the index (no request is kept);
    a slice from the start is the same workload with fewer requests.

    Example: LazySpecs(3, poisson 2/s, fixed lengths 10/5, seed 0) iterates three
    RequestSpec(i, arrival_i, 10, 5), arrival_0 = 0.
    """

    in_arrival_order = True

    def __init__(
        self,
        num_requests: int,
        arrival: ArrivalConfig,
        lengths: LengthsConfig,
        seed: int,
        base_dir: Path,
        chunk: int = SPEC_CHUNK,
    ) -> None:
        self.num_requests = num_requests
        self.arrival = arrival
        self.lengths = lengths
        self.seed = seed
        self.base_dir = base_dir
        self.chunk = chunk
        p, o = lengths.prompt, lengths.output
        #: Same file for both: whole rows are sampled, so prompt/output correlation is kept.
        self._same_trace = (
            p.kind == "trace" and o.kind == "trace" and (p.path, p.format) == (o.path, o.format)
        )
        # A trace's lengths are read once, up front (a bad path fails before the run).
        self._pools = {
            name: trace_lengths(dist, base_dir)
            for name, dist in (("prompt", p), ("output", o))
            if dist.kind == "trace"
        }

    def __len__(self) -> int:
        return self.num_requests

    def __iter__(self) -> Iterator[RequestSpec]:
        for arrivals, prompt, output, first_id in self._chunks():
            for i, (a, p, o) in enumerate(
                zip(arrivals.tolist(), prompt.tolist(), output.tolist(), strict=True)
            ):
                yield RequestSpec(first_id + i, a, p, o)

    def _chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
        """(arrival_s, prompt_tokens, output_tokens, first id) of each chunk, in order."""
        p, o = self.lengths.prompt, self.lengths.output
        arrival_rng = stream(self.seed, _ARRIVAL_STREAM)
        prompt_rng = stream(self.seed, _PROMPT_STREAM)
        output_rng = stream(self.seed, _OUTPUT_STREAM)
        last_s = 0.0
        for start in range(0, self.num_requests, self.chunk):
            k = min(self.chunk, self.num_requests - start)
            if start == 0:
                arrivals = arrival_times(k, self.arrival, arrival_rng)
            else:  # the running sum carried on: the same additions as one cumsum over all
                gaps = _gaps(k, self.arrival, arrival_rng)
                arrivals = np.cumsum(np.concatenate(([last_s], gaps)))[1:]
            last_s = float(arrivals[-1])
            if self._same_trace:
                pool = self._pools["prompt"]
                rows = prompt_rng.integers(0, len(pool), size=k)
                prompt = _clip(pool.prompt_tokens[rows], p)
                output = _clip(pool.output_tokens[rows], o)
            else:
                prompt = sample_lengths(
                    p,
                    k,
                    prompt_rng,
                    column="prompt",
                    base_dir=self.base_dir,
                    pool=self._pools.get("prompt"),
                )
                output = sample_lengths(
                    o,
                    k,
                    output_rng,
                    column="output",
                    base_dir=self.base_dir,
                    pool=self._pools.get("output"),
                )
            yield arrivals, prompt, output, start

    @overload
    def __getitem__(self, index: int) -> RequestSpec: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[RequestSpec]: ...

    def __getitem__(self, index: int | slice) -> RequestSpec | Sequence[RequestSpec]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.num_requests)
            if start == 0 and step == 1:  # a prefix: the same draws, fewer of them
                return LazySpecs(
                    stop, self.arrival, self.lengths, self.seed, self.base_dir, self.chunk
                )
            return list(self)[index]
        i = index + self.num_requests if index < 0 else index
        if not 0 <= i < self.num_requests:
            raise IndexError(f"request {index} of {self.num_requests}")
        for arrivals, prompt, output, first_id in self._chunks():
            if i < first_id + len(arrivals):
                j = i - first_id
                return RequestSpec(i, float(arrivals[j]), int(prompt[j]), int(output[j]))
        raise AssertionError("unreachable: i < num_requests")


def synthetic_workload(
    num_requests: int,
    arrival: ArrivalConfig,
    lengths: LengthsConfig,
    seed: int,
    base_dir: Path,
) -> Workload:
    """A seeded synthetic workload; same arguments, same requests, in every process.

    Lazy (`LazySpecs`): the requests are drawn as they are iterated."""
    requests = LazySpecs(num_requests, arrival, lengths, seed, base_dir)
    meta = {
        "format": "synthetic",
        "seed": seed,
        "arrival": arrival.model_dump(),
        "lengths": lengths.model_dump(),
    }
    return Workload(requests, "synthetic", {"num_rows": num_requests, **meta})


def lengths_workload(
    samples: LengthSamples, num_requests: int | None, arrival: ArrivalConfig, seed: int
) -> Workload:
    """A length file's rows, in file order, with arrivals drawn from `arrival`."""
    n = len(samples) if num_requests is None else num_requests
    if n > len(samples):
        raise WorkloadError(samples.source, f"num_requests {n} exceeds the {len(samples)} rows")
    arrivals = arrival_times(n, arrival, stream(seed, _ARRIVAL_STREAM))
    meta = {
        "format": "lengths",
        "path": samples.source,
        "num_rows": len(samples),
        "num_excluded_rows": len(samples) - n,
        "seed": seed,
        "arrival": arrival.model_dump(),
    }
    return workload_from_arrays(
        arrivals, samples.prompt_tokens[:n], samples.output_tokens[:n], samples.source, meta
    )


def workload_from_arrays(
    arrival_s: np.ndarray,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    source: str,
    metadata: dict,
) -> Workload:
    requests = [
        RequestSpec(i, a, p, o)
        for i, (a, p, o) in enumerate(
            zip(arrival_s.tolist(), prompt_tokens.tolist(), output_tokens.tolist(), strict=True)
        )
    ]
    return Workload(requests, source, {"num_rows": len(requests), **metadata})


def _clip(values: np.ndarray, dist: LengthDist) -> np.ndarray:
    hi = dist.max_tokens if dist.max_tokens is not None else np.iinfo(np.int64).max
    return np.clip(values, dist.min_tokens, hi).astype(np.int64)
