"""Seeded synthetic arrivals and lengths.

One `numpy.random.SeedSequence(seed)` is split into independent streams for arrivals, prompt
lengths and output lengths, so changing the length distribution never moves the arrivals.

Arrivals: the first request arrives at 0; inter-arrival gaps are i.i.d. with mean 1/rate and
coefficient of variation cv. Poisson = exponential gaps (cv 1). Gamma: shape k = 1/cv**2,
scale = 1/(rate*k); cv 0 gives constant gaps. Example: rate 4/s, cv 2 -> k = 0.25,
scale = 1.0 s, mean gap 0.25 s, gap std 0.5 s (bursty).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
    mean_gap_s = 1.0 / arrival.rate_per_s
    num_gaps = num_requests - 1
    if arrival.process == "poisson":
        gaps = rng.exponential(mean_gap_s, num_gaps)
    elif arrival.cv == 0:
        gaps = np.full(num_gaps, mean_gap_s)
    else:
        shape = 1.0 / arrival.cv**2
        gaps = rng.gamma(shape, mean_gap_s / shape, num_gaps)
    return np.concatenate(([0.0], np.cumsum(gaps)))


def sample_lengths(
    dist: LengthDist,
    num: int,
    rng: np.random.Generator,
    *,
    column: str,
    base_dir: Path,
) -> np.ndarray:
    """`num` token counts from `dist` (int64, all within [min_tokens, max_tokens])."""
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
        pool = trace_lengths(dist, base_dir)
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
    return p if p.is_absolute() else base_dir / p


def synthetic_workload(
    num_requests: int,
    arrival: ArrivalConfig,
    lengths: LengthsConfig,
    seed: int,
    base_dir: Path,
) -> Workload:
    """A seeded synthetic workload; same arguments, same requests, in every process."""
    arrivals = arrival_times(num_requests, arrival, stream(seed, _ARRIVAL_STREAM))
    p, o = lengths.prompt, lengths.output
    if p.kind == "trace" and o.kind == "trace" and (p.path, p.format) == (o.path, o.format):
        # Same file for both: sample whole rows so prompt/output correlation is kept.
        pool = trace_lengths(p, base_dir)
        rows = stream(seed, _PROMPT_STREAM).integers(0, len(pool), size=num_requests)
        prompt = _clip(pool.prompt_tokens[rows], p)
        output = _clip(pool.output_tokens[rows], o)
    else:
        prompt = sample_lengths(
            p, num_requests, stream(seed, _PROMPT_STREAM), column="prompt", base_dir=base_dir
        )
        output = sample_lengths(
            o, num_requests, stream(seed, _OUTPUT_STREAM), column="output", base_dir=base_dir
        )
    meta = {
        "format": "synthetic",
        "seed": seed,
        "arrival": arrival.model_dump(),
        "lengths": lengths.model_dump(),
    }
    return workload_from_arrays(arrivals, prompt, output, "synthetic", meta)


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
