"""A `kvsim shrink` candidate: inline requests plus a pool, the scenario it builds, and the
oracle that runs it.

`to_inline` turns a scenario into a base scenario with every resolved number explicit (window,
token budget, a calibrated profile's absolute path) and its workload as `Req`s; `build` puts a
candidate's requests and pool back into that base. `Oracle` answers "does kind K still occur?"
for a candidate, running each distinct candidate once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.kv.types import Segment
from sim.scenario.schema import Scenario, ScenarioError
from sim.workload.config import InlineRequest, WorkloadConfig
from sim.workload.errors import WorkloadError
from sim.workload.request import PREFIX_KEY_BASE, UNIQUE_KEY_BASE, RequestSpec


@dataclass(frozen=True, slots=True)
class Req:
    """One inline request (hashable, so candidates can be cached)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    priority: int = 0
    prefix_id: int | None = None
    prefix_tokens: int = 0

    def to_inline(self) -> InlineRequest:
        return InlineRequest(
            arrival_s=self.arrival_s,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            priority=self.priority,
            prefix_id=self.prefix_id if self.prefix_tokens else None,
            prefix_tokens=self.prefix_tokens,
        )

    def replace(self, **changes) -> Req:
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values.update(changes)
        values["prefix_tokens"] = min(values["prefix_tokens"], values["prompt_tokens"])
        return Req(**values)


@dataclass(frozen=True, slots=True)
class Pool:
    """The numbers phase 5 shrinks."""

    num_gpu_blocks: int
    num_cpu_blocks: int
    max_model_len: int


def _prefix_of(
    spec: RequestSpec, prefix_ids: dict[tuple[Segment, ...], int]
) -> tuple[int | None, int]:
    """(prefix_id, prefix_tokens) of a resolved request; one id per distinct prefix."""
    if not spec.prefix:
        return None, 0
    num_tokens = sum(seg.num_tokens for seg in spec.prefix)
    if len(spec.prefix) == 1 and PREFIX_KEY_BASE <= spec.prefix[0].key < UNIQUE_KEY_BASE:
        return spec.prefix[0].key - PREFIX_KEY_BASE, num_tokens
    # Multi-segment prefixes (Mooncake hash ids) become one id per distinct whole prefix;
    # partial sharing is lost, so the converted workload is checked to still reproduce.
    key = tuple(spec.prefix)
    if key not in prefix_ids:
        prefix_ids[key] = len(prefix_ids)
    return prefix_ids[key], num_tokens


def to_inline(scenario: Scenario, base_dir: Path) -> tuple[Scenario, list[Req], Pool]:
    """The scenario with every resolved number explicit, and its workload as `Req`s."""
    from sim.engine.run import resolve

    resolved = resolve(scenario, base_dir)
    inputs = resolved.inputs
    specs = sorted(resolved.workload.requests, key=lambda s: (s.arrival_s, s.request_id))
    prefix_ids: dict[tuple[Segment, ...], int] = {}
    requests = []
    for spec in specs:
        prefix_id, prefix_tokens = _prefix_of(spec, prefix_ids)
        requests.append(
            Req(
                spec.arrival_s,
                spec.prompt_tokens,
                spec.output_tokens,
                spec.priority,
                prefix_id,
                prefix_tokens,
            )
        )
    step_time = scenario.step_time
    if step_time is not None and step_time.calibrated is not None:
        profile = Path(step_time.calibrated.profile)
        if not profile.is_absolute():
            absolute = str((base_dir / profile).resolve())
            step_time = step_time.model_copy(
                update={"calibrated": step_time.calibrated.model_copy(update={"profile": absolute})}
            )
    applied = resolved.scenario  # the release's defaults filled in: the reproducer pins them
    base = applied.model_copy(
        update={
            "cache": applied.cache.model_copy(update={"sliding_window": inputs["sliding_window"]}),
            "scheduler": applied.scheduler.model_copy(
                update={"max_num_batched_tokens": inputs["max_num_batched_tokens"]}
            ),
            "step_time": step_time,
        }
    )
    pool = Pool(inputs["num_gpu_blocks"], inputs["num_cpu_blocks"], inputs["max_model_len"])
    return base, requests, pool


def build(base: Scenario, requests: Sequence[Req], pool: Pool) -> Scenario:
    """A self-contained scenario: `base` with these requests (inline) and this pool."""
    workload = WorkloadConfig(kind="inline", requests=[r.to_inline() for r in requests])
    return base.model_copy(
        update={
            "cache": base.cache.model_copy(
                update={
                    "num_gpu_blocks": pool.num_gpu_blocks,
                    "num_cpu_blocks": pool.num_cpu_blocks,
                }
            ),
            "scheduler": base.scheduler.model_copy(update={"max_model_len": pool.max_model_len}),
            "workload": workload,
        }
    )


class InvalidCandidate(Exception):
    """A candidate the schema or `sim.engine.run` refuses (e.g. a pool too small to start)."""


class Oracle:
    """Runs candidates (cached by content) and answers "does K still occur?".

    A kind `exception:<Type>` stands for the simulator raising that exception, so a crash of
    the simulator itself can be shrunk like a violation.
    """

    def __init__(self, base: Scenario, kind: str) -> None:
        self.base = base
        self.kind = kind
        self.num_runs = 0
        self._cache: dict[tuple, bool] = {}

    def observe(self, requests: Sequence[Req], pool: Pool) -> tuple[set[str], object | None]:
        """(kinds shown, the RunResult or None when the simulator raised)."""
        from sim.engine.run import run

        self.num_runs += 1
        try:
            scenario = build(self.base, requests, pool)
        except (ValueError, TypeError) as error:
            raise InvalidCandidate(str(error)) from None
        try:
            result = run(scenario)
        except (ScenarioError, WorkloadError) as error:
            raise InvalidCandidate(str(error)) from None
        except Exception as error:  # noqa: BLE001 - a simulator crash is a finding too
            return {f"exception:{type(error).__name__}"}, None
        return set(result.violation_kinds), result

    def __call__(self, requests: Sequence[Req], pool: Pool) -> bool:
        if not requests:
            return False
        key = (tuple(requests), pool)
        if key not in self._cache:
            try:
                kinds, _ = self.observe(requests, pool)
                self._cache[key] = self.kind in kinds
            except InvalidCandidate:
                self._cache[key] = False
        return self._cache[key]
