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

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sim.audit import ViolationKind
from sim.ci.check import explicit_yaml
from sim.errors import InputError
from sim.kv.types import Segment
from sim.scenario import Scenario, ScenarioError, load_scenario
from sim.workload.config import InlineRequest, WorkloadConfig
from sim.workload.errors import WorkloadError
from sim.workload.request import PREFIX_KEY_BASE, UNIQUE_KEY_BASE, RequestSpec

MAX_ROUNDS = 3


class ShrinkError(InputError):
    """Bad input to the shrinker (e.g. a run directory without its scenario); one line."""


class NothingToShrink(ShrinkError):
    """The input runs without the violation to shrink for (exit status 1, not 2)."""


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
    from sim.runner import resolve

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
    base = scenario.model_copy(
        update={
            "cache": scenario.cache.model_copy(update={"sliding_window": inputs["sliding_window"]}),
            "scheduler": scenario.scheduler.model_copy(
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


class _Invalid(Exception):
    """A candidate the schema or `sim.runner` refuses (e.g. a pool too small to start)."""


class _Oracle:
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
        from sim.runner import run

        self.num_runs += 1
        try:
            scenario = build(self.base, requests, pool)
        except (ValueError, TypeError) as error:
            raise _Invalid(str(error)) from None
        try:
            result = run(scenario)
        except (ScenarioError, WorkloadError) as error:
            raise _Invalid(str(error)) from None
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
            except _Invalid:
                self._cache[key] = False
        return self._cache[key]


def ddmin(items: list, test: Callable[[list], bool]) -> list:
    """Zeller's ddmin: a 1-minimal sublist of `items` (order kept) for which `test` holds.

    `test(items)` must hold. Example: with test = "contains 3 and 7", [0..9] -> [3, 7].
    """
    n = 2
    while len(items) >= 2:
        size = math.ceil(len(items) / n)
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        for chunk in chunks:
            if test(chunk):
                items, n = chunk, 2
                break
        else:
            for i in range(len(chunks)):
                complement = [x for j, c in enumerate(chunks) if j != i for x in c]
                if test(complement):
                    items, n = complement, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(len(items), 2 * n)
    return items


def minimize_int(current: int, lowest: int, test: Callable[[int], bool]) -> int:
    """The smallest value in [lowest, current] found by binary search with `test` holding.

    `test(current)` must hold; a non-monotone `test` still yields a value where it holds.
    Example: minimize_int(100, 1, lambda v: v >= 37) == 37.
    """
    if current <= lowest:
        return current
    if test(lowest):
        return lowest
    bad, good = lowest, current
    while good - bad > 1:
        mid = (bad + good) // 2
        if test(mid):
            good = mid
        else:
            bad = mid
    return good


class Shrinker:
    def __init__(self, oracle: _Oracle, requests: list[Req], pool: Pool, block_size: int) -> None:
        self.oracle = oracle
        self.requests = requests
        self.pool = pool
        self.block_size = block_size

    def holds(self, requests: Sequence[Req] | None = None, pool: Pool | None = None) -> bool:
        return self.oracle(
            self.requests if requests is None else requests, self.pool if pool is None else pool
        )

    def ddmin(self) -> None:
        self.requests = ddmin(self.requests, lambda subset: self.holds(subset))

    def lengths(self) -> None:
        for i in range(len(self.requests)):
            if self.requests[i].prefix_tokens and self.holds(self._with(i, prefix_tokens=0)):
                self.requests = self._with(i, prefix_tokens=0, prefix_id=None)
            for name in ("prompt_tokens", "output_tokens", "prefix_tokens"):
                current = getattr(self.requests[i], name)
                lowest = 1 if name != "prefix_tokens" else 0
                if current <= lowest:
                    continue
                best = minimize_int(
                    current,
                    lowest,
                    lambda v, i=i, name=name: self.holds(self._with(i, **{name: v})),  # type: ignore[misc]
                )
                self.requests = self._with(i, **{name: best})

    def _with(self, i: int, **changes) -> list[Req]:
        return [r.replace(**changes) if j == i else r for j, r in enumerate(self.requests)]

    def arrivals(self) -> None:
        zero = [r.replace(arrival_s=0.0) for r in self.requests]
        if self.holds(zero):
            self.requests = zero
            return
        first_s = self.requests[0].arrival_s
        shifted = [r.replace(arrival_s=round(r.arrival_s - first_s, 9)) for r in self.requests]
        if first_s > 0 and self.holds(shifted):
            self.requests = shifted
        for i in range(len(self.requests)):
            previous = self.requests[i - 1].arrival_s if i else 0.0
            for value in (previous, math.floor(self.requests[i].arrival_s * 1000) / 1000):
                value = max(previous, value)
                if value < self.requests[i].arrival_s and self.holds(
                    self._with(i, arrival_s=value)
                ):
                    self.requests = self._with(i, arrival_s=value)
                    break

    def pool_size(self) -> None:
        longest = max(r.prompt_tokens + r.output_tokens for r in self.requests)
        self.pool = Pool(
            self.pool.num_gpu_blocks,
            self.pool.num_cpu_blocks,
            minimize_int(
                self.pool.max_model_len,
                min(longest, self.pool.max_model_len),
                lambda v: self.holds(
                    pool=Pool(self.pool.num_gpu_blocks, self.pool.num_cpu_blocks, v)
                ),
            ),
        )
        self.pool = Pool(
            minimize_int(
                self.pool.num_gpu_blocks,
                1,
                lambda v: self.holds(
                    pool=Pool(v, self.pool.num_cpu_blocks, self.pool.max_model_len)
                ),
            ),
            self.pool.num_cpu_blocks,
            self.pool.max_model_len,
        )
        self.pool = Pool(
            self.pool.num_gpu_blocks,
            minimize_int(
                self.pool.num_cpu_blocks,
                0,
                lambda v: self.holds(
                    pool=Pool(self.pool.num_gpu_blocks, v, self.pool.max_model_len)
                ),
            ),
            self.pool.max_model_len,
        )


def _first_time_s(result, kind: str) -> float | None:
    frame = result.violations
    rows = frame[frame["kind"] == kind]
    if not len(rows):
        return None
    value = rows.iloc[0]["time_s"]
    return None if value is None or value != value else float(value)


def shrink(
    scenario: Scenario,
    base_dir: str | Path = ".",
    kind: str | None = None,
    source: str = "<scenario>",
    progress: Callable[[PhaseLog], None] | None = None,
) -> ShrinkResult:
    """Shrink `scenario` to a 1-minimal reproducer of `kind` (default: its first violation)."""
    start = time.perf_counter()
    base, requests, pool = to_inline(scenario, Path(base_dir))
    oracle = _Oracle(base, kind or "")
    try:
        kinds, first = oracle.observe(requests, pool)
    except _Invalid as error:
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
    oracle._cache[(tuple(requests), pool)] = True
    log: list[PhaseLog] = []
    shrinker = Shrinker(oracle, requests, pool, base.cache.block_size)

    def note(phase: str) -> None:
        entry = PhaseLog(
            phase,
            len(shrinker.requests),
            shrinker.pool.num_gpu_blocks,
            oracle.num_runs,
            time.perf_counter() - start,
        )
        log.append(entry)
        if progress is not None:
            progress(entry)

    note("start")
    if first is not None:
        _cut(shrinker, first, kind)
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
    final_kinds, _ = oracle.observe(shrinker.requests, shrinker.pool)
    assert kind in final_kinds, "the shrunk scenario must still show the violation"
    observed = sorted(final_kinds)
    violation_kinds = [ViolationKind(k) for k in observed if not k.startswith("exception:")]
    minimal = build(base, shrinker.requests, shrinker.pool)
    minimal = minimal.model_copy(
        update={
            "name": f"{scenario.name}-min-{kind}",
            "description": (
                f"Minimal reproducer of {kind} shrunk by kvsim shrink from {source} "
                f"({len(requests)} -> {len(shrinker.requests)} requests)."
            ),
            "expect": minimal.expect.model_copy(update={"violations": violation_kinds or "none"}),
        }
    )
    return ShrinkResult(
        scenario=minimal,
        kind=kind,
        observed_kinds=observed,
        start_num_requests=len(requests),
        final_num_requests=len(shrinker.requests),
        start_num_gpu_blocks=pool.num_gpu_blocks,
        final_num_gpu_blocks=shrinker.pool.num_gpu_blocks,
        num_runs=oracle.num_runs,
        elapsed_s=time.perf_counter() - start,
        source=source,
        log=log,
    )


def _cut(shrinker: Shrinker, first, kind: str) -> None:
    """Drop the requests that arrived after the first K violation, then those already done."""
    time_s = _first_time_s(first, kind)
    if time_s is None:
        return
    arrived = [r for r in shrinker.requests if r.arrival_s <= time_s]
    if len(arrived) < len(shrinker.requests) and shrinker.holds(arrived):
        shrinker.requests = arrived
    # Alive at the violation: arrived by then and not finished before it. The request table is
    # ordered by request id, which is the sorted arrival order the inline workload keeps.
    frame = first.requests.sort_values("request_id")
    finish_s = frame["finish_s"].to_numpy()
    alive = [
        r
        for r, done_s in zip(shrinker.requests, finish_s[: len(shrinker.requests)], strict=True)
        if not done_s < time_s
    ]
    if len(alive) < len(shrinker.requests) and shrinker.holds(alive):
        shrinker.requests = alive
