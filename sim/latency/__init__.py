"""Step-time models: how long one engine step takes for a batch composition.

Four models implement `StepTimeModel.predict_s(BatchShape) -> float`:
measured (the default: kernel efficiencies fitted on public A100/H100 measurements, with an
error band), roofline (fixed fractions of the catalog's datasheets: it explains), calibrated
(a JSON profile written by `calibrate/`), and linear (user coefficients). `make_step_time`
builds one from a scenario's `step_time` entry, e.g. `"measured"`, `{"measured": {"engine":
"v0"}}`, `{"roofline": {"memory": 0.8}}`, `{"calibrated": "h200.json"}`,
`{"linear": {"fixed_s": 0.005, "per_context_token_s": 4e-8}}`, or `"roofline"`.
This package never imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.catalog import GpuSpec, ModelSpec, get_gpu, get_model
from sim.errors import InputError
from sim.files.inputs import require_regular_file
from sim.latency.band import UNKNOWN_BAND, StepTimeBand, band_of
from sim.latency.batch import BatchShape
from sim.latency.calibrated import CalibratedStepTime
from sim.latency.linear import LinearStepTime
from sim.latency.measured import MeasuredStepTime
from sim.latency.profile import StepTimeProfile, load_profile
from sim.latency.protocol import StepTimeModel
from sim.latency.roofline import Efficiencies, RooflineStepTime
from sim.latency.scaled import ScaledStepTime, scaled
from sim.scenario.fields import Float

__all__ = [
    "BatchShape",
    "CalibratedStepTime",
    "Efficiencies",
    "LinearStepTime",
    "MeasuredStepTime",
    "RooflineStepTime",
    "ScaledStepTime",
    "StepTimeBand",
    "StepTimeConfig",
    "StepTimeModel",
    "StepTimeProfile",
    "UNKNOWN_BAND",
    "band_of",
    "load_profile",
    "make_step_time",
    "scaled",
]


_DEFAULT = Efficiencies()


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RooflineConfig(_Closed):
    """Efficiency factors and fixed costs (defaults: `Efficiencies`)."""

    compute: Float = Field(default=_DEFAULT.compute, gt=0, le=1)
    memory: Float = Field(default=_DEFAULT.memory, gt=0, le=1)
    attention_compute: Float = Field(default=_DEFAULT.attention_compute, gt=0, le=1)
    network: Float = Field(default=_DEFAULT.network, gt=0, le=1)
    allreduce_latency_s: Float = Field(default=_DEFAULT.allreduce_latency_s, ge=0)
    overhead_s: Float = Field(default=_DEFAULT.overhead_s, ge=0)

    def efficiencies(self) -> Efficiencies:
        return Efficiencies(**self.model_dump())


class MeasuredConfig(_Closed):
    """The measured model; `engine` v0/v1 picks the CPU overhead (None: from the scheduler).

    `coefficients` names a JSON in the layout of `sim/data/steptime_coefficients.json` (e.g. a
    refit by `scripts/fit_steptime.py`); None uses the shipped fit.
    """

    engine: Literal["v0", "v1"] | None = None
    coefficients: str | None = None


class CalibratedConfig(_Closed):
    profile: str
    overhead_s: Float = Field(default=_DEFAULT.overhead_s, ge=0)


class LinearConfig(_Closed):
    fixed_s: Float = Field(ge=0)
    per_prefill_token_s: Float = Field(default=0.0, ge=0)
    per_decode_seq_s: Float = Field(default=0.0, ge=0)
    per_context_token_s: Float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _step_takes_time(self) -> LinearConfig:
        # A decode step costs fixed + per-seq + per-context (its context is >= 1 token), a
        # prefill step fixed + per-prefill-token (its prior context may be 0): with either at
        # 0 s the clock stands still (throughput infinite, TTFT 0), which no engine does.
        decode = self.per_decode_seq_s > 0 or self.per_context_token_s > 0
        if not (self.fixed_s > 0 or (self.per_prefill_token_s > 0 and decode)):
            raise ValueError(
                "a step can take 0 s: give fixed_s > 0, or per_prefill_token_s > 0 and one of "
                "per_decode_seq_s / per_context_token_s > 0"
            )
        return self


class StepTimeConfig(_Closed):
    """Exactly one of measured / roofline / calibrated / linear."""

    measured: MeasuredConfig | None = None
    roofline: RooflineConfig | None = None
    calibrated: CalibratedConfig | None = None
    linear: LinearConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):  # "roofline"
            return {data: {}}
        if isinstance(data, dict) and isinstance(data.get("calibrated"), str):
            return {**data, "calibrated": {"profile": data["calibrated"]}}
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> StepTimeConfig:
        kinds = ("measured", "roofline", "calibrated", "linear")
        chosen = [k for k in kinds if getattr(self, k) is not None]
        if len(chosen) != 1:
            raise ValueError(f"step_time needs exactly one of {'/'.join(kinds)}: {chosen}")
        return self


def load_coefficients(path: Path) -> Any:
    """A measured model's coefficients JSON; a missing, non-regular or non-JSON file is one
    line naming it (a FIFO is refused before it is opened: `sim.files.inputs`)."""
    require_regular_file(path, lambda reason: InputError(f"coefficients {path}: {reason}"))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InputError(
            f"coefficients {path}: not valid JSON (line {error.lineno}: {error.msg})"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"coefficients {path}: cannot read ({error})") from None


def _calibrated(
    config: CalibratedConfig, model: ModelSpec, gpu: GpuSpec, tp: int
) -> CalibratedStepTime:
    """The calibrated model of `config`'s profile, refused unless the profile was measured on
    the scenario's model at its tp."""
    profile = load_profile(config.profile)
    if profile.model.name != model.name or profile.tp != tp:
        raise InputError(
            f"profile {config.profile} is for {profile.model.name} at tp="
            f"{profile.tp}, the scenario runs {model.name} at tp={tp}"
        )
    return CalibratedStepTime(
        profile, gpu=gpu, efficiencies=Efficiencies(overhead_s=config.overhead_s)
    )


def make_step_time(
    config: StepTimeConfig | dict[str, Any] | str | None,
    model: ModelSpec | str | dict[str, Any],
    gpu: GpuSpec | str | dict[str, Any],
    *,
    tp: int = 1,
    kv_dtype: str | None = None,
    engine: Literal["v0", "v1"] = "v1",
    p2p: bool = True,
    release: str | None = None,
    weight_dtype: str | None = None,
) -> StepTimeModel:
    """The step-time model a scenario asks for (None means the default, measured).

    `engine` is the generation the scheduler models (v0 or V1); a `measured` config's own
    `engine` wins over it. `p2p=False` (GPUs without peer access, `hardware.p2p`) sends the
    measured model's all-reduce through host memory; the other models have no such term and
    refuse it at tp > 1 rather than ignore it. `release` (the vLLM version a scenario pins)
    picks the measured model's all-reduce backends per message size (`sim.latency.allreduce`);
    None charges NCCL's fit for every message. `weight_dtype` (a scenario's `model_dtype`)
    sets the measured model's decoder GEMM weight bytes (and, for fp8 on fp8 tensor cores,
    their rate: `sim.latency.quantized`).
    """
    if config is None:
        config = StepTimeConfig(measured=MeasuredConfig())
    elif not isinstance(config, StepTimeConfig):
        try:
            config = StepTimeConfig.model_validate(config)
        except ValidationError as exc:
            raise InputError(f"invalid step_time config: {exc}") from exc
    model, gpu = get_model(model), get_gpu(gpu)
    if not p2p and tp > 1 and config.measured is None:
        raise InputError(
            "hardware.p2p: false is modelled by the measured step time only (its all-reduce "
            "term); use step_time: {measured: {}} or drop hardware.p2p"
        )
    if config.linear is not None:
        return LinearStepTime(**config.linear.model_dump())
    if config.calibrated is not None:
        return _calibrated(config.calibrated, model, gpu, tp)
    if config.measured is not None:
        coefficients = None
        if config.measured.coefficients is not None:
            coefficients = load_coefficients(Path(config.measured.coefficients))
        return MeasuredStepTime(
            model,
            gpu,
            tp=tp,
            engine=config.measured.engine or engine,
            kv_dtype=kv_dtype,
            coefficients=coefficients,
            p2p=p2p,
            release=release,
            weight_dtype=weight_dtype,
        )
    assert config.roofline is not None
    return RooflineStepTime(
        model, gpu, tp=tp, efficiencies=config.roofline.efficiencies(), kv_dtype=kv_dtype
    )
