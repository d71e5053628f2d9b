"""The calibration profile: a versioned JSON document written by calibrate/, read by sim.

Schema version 1. `calibrate` measures per-layer operators on one device and fits curves
(`sim.latency.fit`); the simulator's `CalibratedStepTime` consumes the curves. Raw samples stay
in the file next to each median so a later fit (or a reader) can redo the statistics. Never a
pickle: plain JSON, validated here with pydantic, unknown keys are errors.

Layout (abridged):

    {"schema_version": 1, "kind": "kvsim.step_time_profile",
     "metadata": {"device": "cuda", "device_name": "NVIDIA H200", "torch": "2.11.0", ...},
     "model": {<ModelSpec fields>}, "tp": 1, "block_size": 16, "dtype": "bfloat16",
     "ceilings": {"copy_bandwidth_Bps": 4.3e12, "matmul_flops": 7.8e14, ...},
     "decode_attention": {"kernel": "torch-gather-sdpa", "points": [...],
                          "fit": {"features": ["1", "num_seqs", "context_tokens"], ...}},
     "prefill_attention": {...}, "gemms": {"qkv_proj": {...}, ...}}

All operator times are for ONE layer on ONE tensor-parallel rank, in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.catalog import ModelSpec
from sim.errors import InputError
from sim.files.inputs import refuse_non_regular
from sim.files.outdir import write_text_atomic

SCHEMA_VERSION = 1
PROFILE_KIND = "kvsim.step_time_profile"

#: Features of each operator's linear fit, in coefficient order ("1" is the intercept).
DECODE_FEATURES = ("1", "num_seqs", "context_tokens")
PREFILL_FEATURES = ("1", "chunk_tokens", "attention_pairs")
GEMM_FEATURES = ("1", "tokens")
#: The per-layer GEMMs of a dense decoder layer, plus lm_head (once per step).
LAYER_GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
STEP_GEMMS = ("lm_head",)


class _Closed(BaseModel):
    # Python's json reads NaN / Infinity; a profile term of inf is no timing (the user's file).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RunMetadata(_Closed):
    """Device and software the measurements were taken on."""

    device: Literal["cpu", "cuda"]
    device_name: str
    driver: str | None = None
    cuda: str | None = None
    torch: str
    python: str
    platform: str
    dtype: str
    date: str  # ISO 8601, UTC
    num_threads: int | None = None
    kvsim_version: str
    budget_s: float | None = None
    wall_s: float | None = None
    # How a CUDA repeat was timed: "run-ahead" (events enqueued behind a GPU sleep, kernel time
    # alone) or None (profiles before it: events around each launch, a small kernel's time
    # includes its launch; sim/data/calibrations/h200-llama-3.1-8b-bf16 run1/run2).
    timing: str | None = None


class Point(_Closed):
    """One measured case: its parameters, median and raw samples (seconds)."""

    params: dict[str, float]
    median_s: float = Field(gt=0)
    samples_s: list[float] = Field(min_length=1)
    bytes: float = Field(ge=0)  # ideal bytes the operator must move
    flops: float = Field(ge=0)
    peak_memory_bytes: int | None = None
    max_rel_error: float | None = None  # against the float64 reference, when checked


class LinearFit(_Closed):
    """`t = sum(coefficients[i] * feature_i)`, fitted on relative error; residuals reported."""

    features: list[str]
    coefficients: list[float]
    num_points: int = Field(ge=1)
    residual_rms_rel: float = Field(ge=0)
    residual_max_rel: float = Field(ge=0)

    @model_validator(mode="after")
    def _check(self) -> LinearFit:
        if len(self.features) != len(self.coefficients):
            raise ValueError(
                f"{len(self.coefficients)} coefficients for {len(self.features)} features"
            )
        return self


class OperatorProfile(_Closed):
    kernel: str
    points: list[Point] = Field(min_length=1)
    fit: LinearFit


class Ceilings(_Closed):
    """Measured device ceilings (copy bandwidth, large-matmul FLOP/s) and datasheet ones."""

    copy_bandwidth_Bps: float = Field(gt=0)
    matmul_flops: float = Field(gt=0)
    datasheet_gpu: str | None = None
    datasheet_bandwidth_Bps: float | None = None
    datasheet_flops: float | None = None


class StepTimeProfile(_Closed):
    schema_version: int
    kind: Literal["kvsim.step_time_profile"]
    metadata: RunMetadata
    model: ModelSpec
    tp: int = Field(ge=1)
    block_size: int = Field(ge=1)
    dtype: str
    ceilings: Ceilings
    decode_attention: OperatorProfile
    prefill_attention: OperatorProfile
    gemms: dict[str, OperatorProfile]
    alternative_decode: dict[str, OperatorProfile] = Field(default_factory=dict)
    checks: dict[str, float] = Field(default_factory=dict)  # kernel -> max rel. error vs float64
    skipped: dict[str, str] = Field(default_factory=dict)  # kernel -> why it was not timed
    grid: dict[str, Any] = Field(default_factory=dict)  # the levels, repeats, estimate
    peak_activation_bytes: int | None = None

    @model_validator(mode="after")
    def _check(self) -> StepTimeProfile:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {self.schema_version} is not supported "
                f"(this kvsim reads {SCHEMA_VERSION})"
            )
        _expect_features("decode_attention", self.decode_attention, DECODE_FEATURES)
        _expect_features("prefill_attention", self.prefill_attention, PREFILL_FEATURES)
        missing = [g for g in LAYER_GEMMS + STEP_GEMMS if g not in self.gemms]
        if missing:
            raise ValueError(f"gemms lacks {missing}")
        for name, op in self.gemms.items():
            _expect_features(f"gemms.{name}", op, GEMM_FEATURES)
            tokens = [p.params.get("tokens") for p in op.points]
            if any(t is None for t in tokens) or sorted(set(tokens)) != tokens:  # type: ignore[type-var]
                raise ValueError(f"gemms.{name}.points must have strictly increasing 'tokens'")
        return self

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)


def _expect_features(where: str, op: OperatorProfile, expected: tuple[str, ...]) -> None:
    if tuple(op.fit.features) != expected:
        raise ValueError(f"{where}.fit.features must be {list(expected)}, got {op.fit.features}")


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        lines.append(f"field '{loc}': {err['msg']}")
    return "; ".join(lines)


class ProfileError(InputError):
    """A step-time profile file that cannot be read or is invalid (names the file and field)."""


def parse_profile(data: dict[str, Any], *, origin: str = "<dict>") -> StepTimeProfile:
    """Validate a profile held in memory; errors name `origin` and the field."""
    if not isinstance(data, dict):
        raise ProfileError(f"profile {origin}: expected a JSON object, got {type(data).__name__}")
    if data.get("kind") != PROFILE_KIND:
        raise ProfileError(
            f"profile {origin}: field 'kind' must be {PROFILE_KIND!r}, got {data.get('kind')!r}"
        )
    try:
        return StepTimeProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"profile {origin}: {_format_errors(exc)}") from exc


def load_profile(path: str | Path) -> StepTimeProfile:
    """Read and validate a profile JSON file; every error names the file (and the field)."""
    path = Path(path)
    refuse_non_regular(path, lambda reason: ProfileError(f"profile {path}: {reason}"))
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"profile {path}: cannot read ({exc.strerror})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"profile {path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    return parse_profile(data, origin=str(path))


def save_profile(profile: StepTimeProfile, path: str | Path) -> None:
    write_text_atomic(Path(path), profile.to_json())
