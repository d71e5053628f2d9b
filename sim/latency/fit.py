"""Fit per-operator curves to measured points (numpy only; runs on CPU, no torch).

Every operator gets a linear model in physically motivated features, fitted by least squares
on RELATIVE error (rows weighted by 1 / measured time, so a 20 us point counts as much as a
20 ms one), with non-negative coefficients (a negative cost per token would predict negative
time outside the grid; offending features are dropped and the rest refitted):

    decode attention  t = a + b * num_seqs + c * context_tokens        (memory-bound: KV bytes)
    prefill attention t = a + b * chunk_tokens + c * attention_pairs   (pairs = p * (c + (p+1)/2))
    GEMM              t = a + b * tokens   (reported; CalibratedStepTime interpolates the points,
                                            because a GEMM is flat until it turns compute-bound)

Example: points (tokens, s) = (1, 1e-3), (64, 1e-3), (4096, 8e-3) -> the GEMM fit is
a ~ 1e-3, b ~ 1.7e-6, with residuals reported as relative errors per point.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sim.latency.profile import (
    DECODE_FEATURES,
    GEMM_FEATURES,
    PREFILL_FEATURES,
    LinearFit,
    OperatorProfile,
    Point,
    StepTimeProfile,
)


def attention_pairs(prior_tokens: float, chunk_tokens: float) -> float:
    """(query, key) pairs of a causal chunk: p * (c + (p + 1) / 2); 1 query at c=4 -> 5."""
    return chunk_tokens * (prior_tokens + (chunk_tokens + 1) * 0.5)


def decode_row(params: dict[str, float]) -> list[float]:
    return [1.0, params["num_seqs"], params["context_tokens"]]


def prefill_row(params: dict[str, float]) -> list[float]:
    chunk = params["chunk_tokens"]
    return [1.0, chunk, attention_pairs(params["prior_tokens"], chunk)]


def gemm_row(params: dict[str, float]) -> list[float]:
    return [1.0, params["tokens"]]


def fit_linear(
    rows: Sequence[Sequence[float]], times_s: Sequence[float], features: Sequence[str]
) -> LinearFit:
    """Non-negative least squares on relative error, by dropping negative coefficients."""
    x = np.asarray(rows, dtype=np.float64)
    y = np.asarray(times_s, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != y.shape[0] or x.shape[1] != len(features):
        raise ValueError(f"fit_linear: {x.shape} rows for {len(features)} features, {y.shape} y")
    if np.any(y <= 0):
        raise ValueError("fit_linear: measured times must be positive")
    # Scale columns to unit max so lstsq is well conditioned (contexts ~1e6, intercept 1).
    scale = np.maximum(np.abs(x).max(axis=0), 1e-300)
    xw = (x / scale) / y[:, None]
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(xw[:, active], np.ones_like(y), rcond=None)
        if np.all(sol >= 0):
            coef[:] = 0.0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))  # the most negative feature leaves, refit the rest
    coef = coef / scale
    rel = (x @ coef - y) / y
    return LinearFit(
        features=list(features),
        coefficients=[float(c) for c in coef],
        num_points=int(y.shape[0]),
        residual_rms_rel=float(np.sqrt(np.mean(rel**2))),
        residual_max_rel=float(np.max(np.abs(rel))),
    )


def fit_operator(
    kernel: str,
    points: Sequence[Point],
    row: Callable[[dict[str, float]], list[float]],
    features: Sequence[str],
) -> OperatorProfile:
    rows = [row(p.params) for p in points]
    fit = fit_linear(rows, [p.median_s for p in points], features)
    return OperatorProfile(kernel=kernel, points=list(points), fit=fit)


def fit_decode(kernel: str, points: Sequence[Point]) -> OperatorProfile:
    return fit_operator(kernel, points, decode_row, DECODE_FEATURES)


def fit_prefill(kernel: str, points: Sequence[Point]) -> OperatorProfile:
    return fit_operator(kernel, points, prefill_row, PREFILL_FEATURES)


def fit_gemm(kernel: str, points: Sequence[Point]) -> OperatorProfile:
    ordered = sorted(points, key=lambda p: p.params["tokens"])
    return fit_operator(kernel, ordered, gemm_row, GEMM_FEATURES)


def refit(profile: StepTimeProfile) -> StepTimeProfile:
    """The same profile with every curve refitted from its stored points."""
    return profile.model_copy(
        update={
            "decode_attention": fit_decode(
                profile.decode_attention.kernel, profile.decode_attention.points
            ),
            "prefill_attention": fit_prefill(
                profile.prefill_attention.kernel, profile.prefill_attention.points
            ),
            "gemms": {n: fit_gemm(op.kernel, op.points) for n, op in profile.gemms.items()},
        }
    )
