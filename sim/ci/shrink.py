"""`kvsim shrink`: delta debugging of a violating scenario down to a minimal inline reproducer.

The predicate is "a run shows violation kind K" (K: given, or the kind of the run's first
violation). Starting from the scenario's workload as inline requests with every resolved
number made explicit (pool size, window, max_model_len, token budget), the phases are:

1. cut: keep the requests that arrived by the first K violation; then, if that still shows K,
   only those still alive at that moment (arrived and not yet finished);
2. ddmin (Zeller & Hildebrandt 2002) over the requests;
3. shorten every prompt, prefix and output (a binary search per number, smallest first);
4. simplify arrivals: all at 0, else each equal to the one before, else rounded to 1 ms;
5. shrink the pool: max_model_len down to the longest request, then GPU and CPU blocks;
6. ddmin again, which ends 1-minimal: removing any one remaining request loses K.

Phases 2-6 repeat while they change something (at most `MAX_ROUNDS` times). Each candidate runs
once (results are cached by content). Example: the 4-vs-3 case plus ten unrelated short
requests shrinks to the two requests A (112 tokens) and B (64 tokens), or to smaller ones that
still trip the same undercount.

The result is a self-contained scenario (inline trace, concrete cache) whose `expect:` lists
exactly the kinds its run shows, so it can be checked in as a regression test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sim.audit import ViolationKind
from sim.ci.ddmin import ddmin, minimize_int
from sim.ci.scenario_yaml import explicit_yaml
from sim.ci.shrink_candidate import InvalidCandidate, Oracle, Pool, Req, build, to_inline
from sim.ci.shrink_phases import Shrinker, cut
from sim.errors import InputError
from sim.scenario.release_defaults import applied
from sim.scenario.schema import Scenario, load_scenario, naming

MAX_ROUNDS = 3


class ShrinkError(InputError):
    """Bad input to the shrinker (e.g. a run directory without its scenario); one line."""


class NothingToShrink(ShrinkError):
    """The input runs without the violation to shrink for (exit status 1, not 2)."""


@dataclass(slots=True)
class PhaseLog:
    phase: str
    num_requests: int
    num_gpu_blocks: int
    num_runs: int
    elapsed_s: float


@dataclass(slots=True)
class ShrinkResult:
    scenario: Scenario
    kind: str
    observed_kinds: list[str]
    start_num_requests: int
    final_num_requests: int
    start_num_gpu_blocks: int
    final_num_gpu_blocks: int
    num_runs: int
    elapsed_s: float
    source: str
    log: list[PhaseLog] = field(default_factory=list)

    def to_yaml(self) -> str:
        header = (
            f"# Minimal reproducer of {self.kind}, shrunk by `kvsim shrink` from {self.source}\n"
            f"# ({self.start_num_requests} -> {self.final_num_requests} requests, "
            f"{self.start_num_gpu_blocks} -> {self.final_num_gpu_blocks} GPU blocks, "
            f"{self.num_runs} runs, {self.elapsed_s:.1f} s).\n"
            "# Reproduce: kvsim run <this file> --no-plots    Check: kvsim check <this file>\n"
        )
        return header + explicit_yaml(self.scenario)


def load_input(path: str | Path) -> tuple[Scenario, Path, str]:
    """A scenario file, or a run directory holding the `scenario.yaml` it ran."""
    path = Path(path)
    if path.is_dir():
        candidate = path / "scenario.yaml"
        if not candidate.exists():
            raise ShrinkError(
                f"{path}: a run directory needs the scenario.yaml it ran; pass the scenario file"
            )
        path = candidate
    return load_scenario(path), path.parent, str(path)


def shrink(
    scenario: Scenario,
    base_dir: str | Path = ".",
    kind: str | None = None,
    source: str = "<scenario>",
    progress: Callable[[PhaseLog], None] | None = None,
) -> ShrinkResult:
    """Shrink `scenario` to a 1-minimal reproducer of `kind` (default: its first violation)."""
    start = time.perf_counter()
    with naming(source):  # a resolution error names the file too
        base, requests, pool = to_inline(scenario, Path(base_dir))
    oracle = Oracle(base, kind or "")
    kind, first = _kind_to_shrink(oracle, requests, pool, kind, source)
    oracle._cache[(tuple(requests), pool)] = True
    shrinker = Shrinker(oracle, requests, pool, applied(base.cache.block_size, "cache.block_size"))
    notes = _PhaseNotes(shrinker, oracle, start, progress)
    _run_phases(shrinker, first, kind, notes)
    final_kinds, _ = oracle.observe(shrinker.requests, shrinker.pool)
    assert kind in final_kinds, "the shrunk scenario must still show the violation"
    observed = sorted(final_kinds)
    minimal = build(base, shrinker.requests, shrinker.pool)
    sizes = f"{len(requests)} -> {len(shrinker.requests)} requests"
    return ShrinkResult(
        scenario=_as_reproducer(minimal, scenario.name, kind, observed, source, sizes),
        kind=kind,
        observed_kinds=observed,
        start_num_requests=len(requests),
        final_num_requests=len(shrinker.requests),
        start_num_gpu_blocks=pool.num_gpu_blocks,
        final_num_gpu_blocks=shrinker.pool.num_gpu_blocks,
        num_runs=oracle.num_runs,
        elapsed_s=time.perf_counter() - start,
        source=source,
        log=notes.log,
    )


def _kind_to_shrink(
    oracle: Oracle, requests: list[Req], pool: Pool, kind: str | None, source: str
) -> tuple[str, object | None]:
    """The violation kind to keep (the given one, or the run's first violation's, set on the
    oracle) and the input's run (None when the simulator raised). Bad input where the input
    does not run, or runs without that kind (then there is nothing to shrink)."""
    try:
        kinds, first = oracle.observe(requests, pool)
    except InvalidCandidate as error:
        raise ShrinkError(f"{source}: {error}") from None
    if not kinds:
        raise NothingToShrink(f"{source}: the run shows no violation; nothing to shrink")
    if kind is None:
        if first is None:
            kind = next(iter(kinds))
        else:
            kind = str(first.violations.sort_values("time_s", kind="stable").iloc[0]["kind"])  # type: ignore[attr-defined]
        oracle.kind = kind
    elif kind not in kinds:
        shown = ", ".join(sorted(kinds))
        raise NothingToShrink(f"{source}: the run shows no {kind} (it shows {shown})")
    return kind, first


@dataclass(slots=True)
class _PhaseNotes:
    """The shrink's log: one `PhaseLog` per phase run (the candidate's size, the runs and
    the time so far), each also passed to `progress` as it is made."""

    shrinker: Shrinker
    oracle: Oracle
    start: float
    progress: Callable[[PhaseLog], None] | None
    log: list[PhaseLog] = field(default_factory=list)

    def __call__(self, phase: str) -> None:
        entry = PhaseLog(
            phase,
            len(self.shrinker.requests),
            self.shrinker.pool.num_gpu_blocks,
            self.oracle.num_runs,
            time.perf_counter() - self.start,
        )
        self.log.append(entry)
        if self.progress is not None:
            self.progress(entry)


def _run_phases(
    shrinker: Shrinker, first: object | None, kind: str, note: Callable[[str], None]
) -> None:
    """The phases of the module docstring: the cut (where the input's run is known), then
    rounds of ddmin, lengths, arrivals, pool and ddmin while a round changes something (at
    most `MAX_ROUNDS`)."""
    note("start")
    if first is not None:
        cut(shrinker, first, kind)
    note("cut")
    for _ in range(MAX_ROUNDS):
        before = (tuple(shrinker.requests), shrinker.pool)
        shrinker.ddmin()
        note("ddmin")
        shrinker.lengths()
        note("lengths")
        shrinker.arrivals()
        note("arrivals")
        shrinker.pool_size()
        note("pool")
        shrinker.ddmin()
        note("ddmin")
        if (tuple(shrinker.requests), shrinker.pool) == before:
            break


def _as_reproducer(
    minimal: Scenario, name: str, kind: str, observed: list[str], source: str, sizes: str
) -> Scenario:
    """The shrunk scenario named and described as a reproducer of `kind`, its `expect:`
    listing exactly the violation kinds its run shows (a simulator exception is no kind)."""
    violation_kinds = [ViolationKind(k) for k in observed if not k.startswith("exception:")]
    return minimal.model_copy(
        update={
            "name": f"{name}-min-{kind}",
            "description": (
                f"Minimal reproducer of {kind} shrunk by kvsim shrink from {source} ({sizes})."
            ),
            "expect": minimal.expect.model_copy(update={"violations": violation_kinds or "none"}),
        }
    )


__all__ = [
    "MAX_ROUNDS",
    "NothingToShrink",
    "PhaseLog",
    "ShrinkError",
    "ShrinkResult",
    "ddmin",
    "load_input",
    "minimize_int",
    "shrink",
]
