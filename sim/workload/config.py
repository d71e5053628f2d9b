"""The `workload:` section of a scenario, as a closed pydantic model (unknown keys are errors).

Four kinds:

- ``trace``: a file (``path``, ``format`` auto-detected or given). A length-distribution file
  (``format: lengths``) also needs ``arrival`` and takes ``num_requests`` (default: all rows).
- ``synthetic``: ``arrival`` + ``lengths`` + ``num_requests``, drawn from ``seed``.
- ``inline``: ``requests`` listed in the scenario itself.
- ``sessions``: multi-turn conversations (``sessions:``, a `SessionsConfig`; see
  `sim.workload.sessions`): synthetic closed-loop sessions, or sessions inferred from a
  Mooncake trace's ``hash_ids`` chains (replayed at the trace's own times).

Then, in this order: ``time_range_s`` [start, end) in the source's own seconds (arrivals are
shifted so the window starts at 0), ``first_n`` requests, and ``rate_scale`` k (arrivals divided
by k: k = 2 replays twice as fast). Relative paths resolve against the scenario file's folder.

Example (YAML)::

    workload:
      kind: synthetic
      num_requests: 1000
      seed: 7
      arrival: {process: gamma, rate_per_s: 4.0, cv: 2.0}
      lengths:
        prompt: {kind: lognormal, mean: 1000, cv: 1.0, max_tokens: 8192}
        output: {kind: trace, path: traces/sharegpt.csv, format: lengths}

Sessions (synthetic, closed loop; or ``sessions: {source: mooncake, path: trace.jsonl}``)::

    workload:
      kind: sessions
      seed: 7
      sessions:
        source: synthetic
        num_sessions: 40
        arrival: {process: poisson, rate_per_s: 2.0}      # session starts
        turns: {min: 2, max: 8}                           # uniform integers
        first_prompt: {kind: lognormal, mean: 1200, cv: 0.8, max_tokens: 8000}
        new_tokens: {kind: lognormal, mean: 150, cv: 1.0, max_tokens: 2000}
        output: {kind: lognormal, mean: 250, cv: 0.8, max_tokens: 1500}
        think_s: {kind: exponential, mean_s: 3.0}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.scenario.fields import Float, Int, Seconds

TraceFormat = Literal["auto", "canonical", "azure", "mooncake", "vidur", "lengths"]


class ArrivalConfig(BaseModel):
    """Inter-arrival process: Poisson (CV 1), Gamma with a CV, or constant (gamma, cv 0)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    process: Literal["poisson", "gamma"] = "poisson"
    rate_per_s: Float = Field(gt=0, allow_inf_nan=False)
    cv: Float = Field(default=1.0, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _poisson_cv(self) -> ArrivalConfig:
        if self.process == "poisson" and self.cv != 1.0:
            raise ValueError("a poisson process has cv 1; use process: gamma for another cv")
        return self


class LengthDist(BaseModel):
    """A distribution of token counts, always within [min_tokens, max_tokens].

    fixed: ``value``. uniform: integers in [min_tokens, max_tokens]. lognormal: ``mean`` and
    ``cv`` of the (unclipped) distribution, rounded and clipped. zipf: P(k) proportional to
    (k - min_tokens + 1) ** -exponent on [min_tokens, max_tokens]. trace: sampled with
    replacement from a trace's prompt or output column (``path``, ``format``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["fixed", "uniform", "lognormal", "zipf", "trace"]
    value: Int | None = Field(default=None, ge=1)
    min_tokens: Int = Field(default=1, ge=1)
    max_tokens: Int | None = Field(default=None, ge=1)
    mean: Float | None = Field(default=None, gt=0, allow_inf_nan=False)
    cv: Float | None = Field(default=None, gt=0, allow_inf_nan=False)
    exponent: Float | None = Field(default=None, gt=0, allow_inf_nan=False)
    path: str | None = None
    format: TraceFormat = "auto"

    @model_validator(mode="after")
    def _params(self) -> LengthDist:
        needs = {
            "fixed": ("value",),
            "uniform": ("max_tokens",),
            "lognormal": ("mean", "cv"),
            "zipf": ("exponent", "max_tokens"),
            "trace": ("path",),
        }[self.kind]
        for name in needs:
            if getattr(self, name) is None:
                raise ValueError(f"lengths of kind {self.kind!r} need {name!r}")
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens {self.max_tokens} < min_tokens {self.min_tokens}")
        if self.kind == "zipf" and self.max_tokens - self.min_tokens >= 10_000_000:  # type: ignore[operator]  # zipf needs it (above)
            raise ValueError("zipf support above 10,000,000 values is too large")
        return self


class LengthsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: LengthDist
    output: LengthDist


class InlineRequest(BaseModel):
    """One request written in the scenario; ``prefix_id``/``prefix_tokens`` as in canonical."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arrival_s: Seconds
    prompt_tokens: Int = Field(ge=1)
    output_tokens: Int = Field(ge=1)
    priority: Int = 0
    prefix_id: Int | None = Field(default=None, ge=0, lt=2**40)
    prefix_tokens: Int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _prefix(self) -> InlineRequest:
        if self.prefix_tokens > self.prompt_tokens:
            raise ValueError("prefix_tokens exceeds prompt_tokens")
        if self.prefix_tokens and self.prefix_id is None:
            raise ValueError("prefix_tokens needs a prefix_id")
        return self


class TurnsDist(BaseModel):
    """Turns per session: integers uniform in [min, max] (``min == max``: always that many)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: Int = Field(ge=1)
    max: Int = Field(ge=1, le=10_000)

    @model_validator(mode="after")
    def _order(self) -> TurnsDist:
        if self.max < self.min:
            raise ValueError(f"turns: max {self.max} < min {self.min}")
        return self


class ThinkTimeDist(BaseModel):
    """Seconds a user thinks between a reply and the next turn: fixed ``mean_s``, exponential
    with mean ``mean_s``, or lognormal with mean ``mean_s`` and coefficient of variation ``cv``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["fixed", "exponential", "lognormal"]
    mean_s: Seconds
    cv: Float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _cv(self) -> ThinkTimeDist:
        if (self.kind == "lognormal") != (self.cv is not None):
            raise ValueError("think_s: 'cv' is for (and needed by) kind: lognormal")
        if self.kind == "lognormal" and self.mean_s == 0:
            raise ValueError("think_s: a lognormal think time needs mean_s > 0")
        return self


class SessionsConfig(BaseModel):
    """Where the sessions of ``kind: sessions`` come from (`sim.workload.sessions`).

    ``source: synthetic``: ``num_sessions`` sessions starting at ``arrival``; each has ``turns``
    turns; turn 1's prompt has ``first_prompt`` tokens; turn k > 1's prompt is the whole previous
    context (turn k-1's prompt and output) plus ``new_tokens``; every turn generates ``output``
    tokens; turn k arrives ``think_s`` after turn k-1 finished (closed loop).
    ``source: mooncake``: a Mooncake JSONL trace at ``path`` whose requests are grouped into
    sessions by their ``hash_ids`` chains, each request arriving at its own timestamp.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["synthetic", "mooncake"]
    num_sessions: Int | None = Field(default=None, ge=1)
    arrival: ArrivalConfig | None = None
    turns: TurnsDist | None = None
    first_prompt: LengthDist | None = None
    new_tokens: LengthDist | None = None
    output: LengthDist | None = None
    think_s: ThinkTimeDist | None = None
    path: str | None = None

    @model_validator(mode="after")
    def _source(self) -> SessionsConfig:
        synthetic: tuple[str, ...] = ("num_sessions", "arrival", "turns", "first_prompt")
        synthetic += ("new_tokens", "output", "think_s")
        wanted = synthetic if self.source == "synthetic" else ("path",)
        for name in (*synthetic, "path"):
            given = getattr(self, name) is not None
            if given and name not in wanted:
                raise ValueError(f"sessions: {name!r} is not for source: {self.source}")
            if not given and name in wanted:
                raise ValueError(f"sessions: source {self.source} needs {name!r}")
        for name in ("first_prompt", "new_tokens", "output"):
            dist = getattr(self, name)
            if dist is not None and dist.kind == "trace":
                raise ValueError(f"sessions: {name} cannot be of kind 'trace'")
        return self


class WorkloadConfig(BaseModel):
    """Where requests come from and how to window and scale them (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["trace", "synthetic", "inline", "sessions"]
    path: str | None = None
    format: TraceFormat = "auto"
    hash_block_tokens: Int = Field(default=512, ge=1)
    arrival: ArrivalConfig | None = None
    lengths: LengthsConfig | None = None
    num_requests: Int | None = Field(default=None, ge=1)
    rate_scale: Float = Field(default=1.0, gt=0, allow_inf_nan=False)
    first_n: Int | None = Field(default=None, ge=1)
    time_range_s: tuple[Seconds, Seconds] | None = None
    requests: list[InlineRequest] | None = None
    sessions: SessionsConfig | None = None
    seed: Int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadConfig:
        rules = self._file_and_synthetic_rules() + self._inline_rules() + self._sessions_rules()
        for broken, message in rules:
            if broken:
                raise ValueError(message)
        if self.time_range_s is not None:
            start, end = self.time_range_s
            if not 0 <= start < end:
                raise ValueError(f"time_range_s must satisfy 0 <= start < end, got {start}, {end}")
        return self

    def _file_and_synthetic_rules(self) -> list[tuple[bool, str]]:
        """(broken, message) for a trace file's and a synthetic workload's fields, checked in
        this order (the first broken one is the error)."""
        lengths_file = self.kind == "trace" and self.format == "lengths"
        # With format auto the file decides; `load_workload` checks arrival/num_requests then.
        timed_file = self.kind == "trace" and self.format not in ("lengths", "auto")
        return [
            (self.kind == "trace" and self.path is None, "a trace workload needs 'path'"),
            (self.kind != "trace" and self.path is not None, "'path' is only for kind: trace"),
            (self.kind == "synthetic" and self.arrival is None, "synthetic needs 'arrival'"),
            (self.kind == "synthetic" and self.lengths is None, "synthetic needs 'lengths'"),
            (
                self.kind == "synthetic" and self.num_requests is None,
                "synthetic needs 'num_requests'",
            ),
            (
                lengths_file and self.arrival is None,
                "format: lengths has no arrivals; give 'arrival'",
            ),
            (
                timed_file and self.arrival is not None,
                "this trace has its own arrivals; 'arrival' is only for synthetic or format: lengths",
            ),
            (
                self.kind != "synthetic" and self.lengths is not None,
                "'lengths' is only for kind: synthetic",
            ),
            (
                timed_file and self.num_requests is not None,
                "use 'first_n' to cut a trace ('num_requests' is for synthetic / lengths files)",
            ),
        ]

    def _inline_rules(self) -> list[tuple[bool, str]]:
        """(broken, message) for an inline workload's fields, after the file's and synthetic's."""
        return [
            (self.kind == "inline" and not self.requests, "inline needs a non-empty 'requests'"),
            (
                self.kind != "inline" and self.requests is not None,
                "'requests' is only for kind: inline",
            ),
            (self.kind == "inline" and self.arrival is not None, "inline takes no 'arrival'"),
        ]

    def _sessions_rules(self) -> list[tuple[bool, str]]:
        """(broken, message) for a sessions workload's fields, checked last."""
        return [
            (self.kind == "sessions" and self.sessions is None, "sessions needs 'sessions'"),
            (
                self.kind != "sessions" and self.sessions is not None,
                "'sessions' is only for kind: sessions",
            ),
            (
                self.kind == "sessions" and self.arrival is not None,
                "sessions takes its arrivals from 'sessions'",
            ),
            (
                self.kind == "sessions" and self.num_requests is not None,
                "sessions: give sessions.num_sessions, not 'num_requests'",
            ),
            (
                self._closed_loop and (self.first_n is not None or self.time_range_s is not None),
                "synthetic sessions are closed loop: cut them with sessions.num_sessions, "
                "not 'first_n' / 'time_range_s'",
            ),
        ]

    @property
    def _closed_loop(self) -> bool:
        return self.sessions is not None and self.sessions.source == "synthetic"
