"""The scenario file: a closed pydantic schema (unknown keys are errors naming key and file).

Example (the 4-vs-3 case on v0 BlockSpaceManagerV2)::

    name: swa-4-vs-3-v0-v2
    cache: {block_size: 16, num_gpu_blocks: 10, sliding_window: 24}
    scheduler: {design: v0-v2, max_model_len: 160}
    workload:
      kind: inline
      requests:
        - {arrival_s: 0.0, prompt_tokens: 112, output_tokens: 8}
        - {arrival_s: 0.0, prompt_tokens: 64, output_tokens: 8}
    step_time: {linear: {fixed_s: 0.01}}
    expect: {violations: [admission_undercount, leaked_blocks]}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sim.cluster.config import ClusterSection
from sim.errors import InputError
from sim.files.inputs import read_capped_bytes, refuse_non_regular
from sim.files.strict_yaml import StrictLoader, load_yaml
from sim.latency import StepTimeConfig
from sim.memory.terms import weight_format
from sim.scenario.fields import Int
from sim.scenario.sections import (
    CacheSection,
    ClosedModel,
    EngineSection,
    ExpectSection,
    HardwareSection,
    KVCacheGroupSection,
    SchedulerSection,
    SummaryBound,
)
from sim.workload.config import WorkloadConfig


class ScenarioError(InputError):
    """A scenario that cannot be read or is invalid; the message is one line naming the file."""


@contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """Scenario errors raised inside (resolving and running a loaded scenario) name its file.

    `sim.scenario.resolve.resolve` sees a validated `Scenario`, not where it came from, so its
    errors name the field only ("scheduler.max_model_len: ..."); the command that loaded the
    file wraps the run in this, and the user reads "s.yaml: scheduler.max_model_len: ...".
    An error that already starts with the file, or with an option (`--set ...: ...`, about the
    command line rather than the file), is left as it is.
    """
    try:
        yield
    except ScenarioError as error:
        text = str(error)
        if text.startswith((f"{path}:", "--")):
            raise
        raise ScenarioError(f"{path}: {text}") from None


#: A scenario name becomes one folder name (runs/NAME, plus kvsim's ``.NAME.partial-*``
#: staging sibling), so it must fit in a file name (255 bytes) with room to spare.
MAX_NAME_BYTES = 128


def name_problem(name: str) -> str | None:
    """Why `name` cannot be one folder name under runs/ (None: it can).

    A name with a path separator, a leading dot ('..', '.hidden') or an absolute path would
    put the run outside runs/ (or hide it); an empty one would make runs/ itself the target.
    """
    if not name:
        return "is empty"
    if "/" in name or "\\" in name:
        return "contains a path separator"
    if name.startswith("."):
        return "starts with '.'"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "contains a control character"
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        return f"is {len(name.encode('utf-8'))} bytes long (at most {MAX_NAME_BYTES})"
    return None


class Scenario(ClosedModel):
    name: str = "scenario"
    description: str = ""
    seed: Int = Field(default=0, ge=0)
    #: A catalog model name, or a geometry (see `sim.catalog`); needed by measured, roofline, derive.
    model: str | dict[str, Any] | None = "llama-3.1-8b"
    #: How the checkpoint stores its weights: auto (the model's dtype), bfloat16, float16, fp8,
    #: int8, awq-int4, gptq-int4, mxfp4. Changes the weight bytes `num_gpu_blocks: derive` uses
    #: and the measured step time's decoder GEMMs (`sim.latency.quantized`).
    model_dtype: str = "auto"
    hardware: HardwareSection = HardwareSection()
    cache: CacheSection = CacheSection()
    scheduler: SchedulerSection = SchedulerSection()
    engine: EngineSection = EngineSection()
    #: Co-located (default) or prefill/decode disaggregated pools (`sim.cluster.config`).
    cluster: ClusterSection = ClusterSection()
    workload: WorkloadConfig
    #: None: the measured default. Else {measured: {...}}, {roofline: {...}}, {calibrated: PROFILE}
    #: or {linear: {...}}.
    step_time: StepTimeConfig | None = None
    expect: ExpectSection = ExpectSection()

    @field_validator("name")
    @classmethod
    def _one_folder_name(cls, name: str) -> str:
        problem = name_problem(name)
        if problem is not None:
            shown = repr(name if len(name) <= 40 else name[:40] + "...")
            raise ValueError(
                f"{shown} {problem}; the name is the run's folder (runs/<name>): give one "
                "folder name, without '/', '\\' or a leading '.'"
            )
        return name

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        try:
            weight_format(self.model_dtype)
        except ValueError as error:
            raise ValueError(f"model_dtype: {error}") from None
        if self.cache.num_gpu_blocks == "derive" and self.model is None:
            raise ValueError("cache.num_gpu_blocks: 'derive' needs a model")
        if self.model is None and (self.step_time is None or self.step_time.linear is None):
            raise ValueError("step_time: only the linear model works without a model")
        return self


#: Error types whose message is clearer with the value the user wrote (the rest say it).
_SHOW_INPUT = {"finite_number", "less_than_equal", "greater_than", "greater_than_equal"}


def _shown(value: Any) -> str:
    """A value as the user typed it in YAML: true, 1e+300, '16' (quoted: it was a string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        text = repr(value)
        return text if len(text) <= 40 else text[:39] + "…"
    return type(value).__name__


def _where(loc: tuple) -> str:
    """The dotted field path of a pydantic error location, without pydantic's union branch
    names ('int', 'constrained-int', "literal['derive']", 'function-after[...]')."""
    parts = [str(p) for p in loc]
    return ".".join(p for p in parts if not _is_branch(p))


def _is_branch(part: str) -> bool:
    return part in {"int", "float", "bool", "str", "dict[str,any]", "list[...]", "none"} or (
        "[" in part or part.startswith("constrained-")
    )


def _format_validation_error(path: str, error: ValidationError) -> str:
    first = error.errors()[0]
    where = _where(first["loc"])
    if first["type"] == "extra_forbidden":
        parent, _, key = where.rpartition(".")
        return f"{path}: unknown key '{key}'" + (f" in '{parent}'" if parent else "")
    if first["type"] == "missing":
        return f"{path}: missing required key '{where}'"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"].endswith("_type") or first["type"] in _SHOW_INPUT:
        message += f", got {_shown(first.get('input'))}"
    return f"{path}: {where}: {message}" if where else f"{path}: {message}"


def scenario_from_dict(
    data: Any, source: str = "<scenario>", *, source_of: Callable[[str], str] | None = None
) -> Scenario:
    """The validated scenario; an error names `source` (or `source_of(field)`: `--set` names
    the assignment that set the field at fault) and the field."""
    if not isinstance(data, dict):
        raise ScenarioError(
            f"{source}: a scenario must be a YAML mapping, got {type(data).__name__}"
        )
    try:
        return Scenario.model_validate(data)
    except ValidationError as error:
        if source_of is not None:
            source = source_of(".".join(str(p) for p in error.errors()[0]["loc"]))
        raise ScenarioError(_format_validation_error(source, error)) from None


#: The largest scenario file read (bytes). A scenario is settings plus, at most, a small
#: inline workload; loading YAML takes seconds per MiB even with libyaml
#: (benchmarks/inline_yaml.py: 13 MB in 32 s, 117 s without), and the parsed requests are
#: Python objects many times the file's size. A big workload belongs in a trace file
#: (`workload: {kind: trace, path: ...}`), which is read as columns, not as YAML.
MAX_SCENARIO_BYTES = 4 << 20


def _scenario_too_big(path: Path, size: int) -> ScenarioError:
    return ScenarioError(
        f"{path}: {size} bytes, more than a scenario file may have ({MAX_SCENARIO_BYTES} bytes); "
        "put a big inline workload in a trace file (workload: {kind: trace, path: ...})"
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; every problem is a one-line `ScenarioError`.

    A path that is not a regular file (a FIFO, a device, a socket, a folder) is refused
    before it is opened, and a file over `MAX_SCENARIO_BYTES` before it is read.
    """
    path = Path(path)
    if not path.exists():
        raise ScenarioError(f"{path}: no such file")
    refuse_non_regular(path, lambda reason: ScenarioError(f"{path}: {reason} (a scenario)"))
    try:
        raw = read_capped_bytes(path, MAX_SCENARIO_BYTES, lambda n: _scenario_too_big(path, n))
        data = load_yaml(raw.decode("utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ScenarioError(f"{path}{where}: invalid YAML: {problem}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ScenarioError(f"{path}: cannot read: {error}") from None
    return scenario_from_dict(data, str(path))


def scenario_to_yaml(scenario: Scenario) -> str:
    data = scenario.model_dump(mode="json", exclude_unset=True)
    return yaml.safe_dump(data, sort_keys=False)


__all__ = [
    "MAX_SCENARIO_BYTES",
    "CacheSection",
    "EngineSection",
    "ExpectSection",
    "HardwareSection",
    "KVCacheGroupSection",
    "Scenario",
    "ScenarioError",
    "SchedulerSection",
    "StrictLoader",
    "SummaryBound",
    "load_scenario",
    "load_yaml",
    "scenario_from_dict",
    "scenario_to_yaml",
]
