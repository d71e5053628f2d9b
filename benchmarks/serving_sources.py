"""The serving accuracy per independent source (imported by benchmarks/serving_accuracy.py).

The headline summary weighs every point once, so a source that supplies half the points
(tenstorrent's concurrency-1 sweeps) sets half the medians. This view groups the points by the
team or tool that measured them (`source_group`), gives each group its own median |error| per
metric group, and then the median over groups of those medians, each source weighing once: a
robustness view beside the headline rows, not a replacement for them.

Example: sources A (errors 10%, 20%, 30%) and B (50%) have medians 20% and 50%; the median over
sources is 35%, where the median over the four points is 25%.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sim.data.split import SPLITS, source_key

#: Repositories whose threads all report the same team's own benchmark tool: their threads are
#: one source. tenstorrent's tt-inference-server issues (#143: Qwen2.5-72B on 2 x H100; #340:
#: the Qwen3 family on an A100) are the GPU reference runs of one release workflow (run.py
#: --workflow release, the same patched benchmark_serving.py client and report format), so
#: their errors are not independent. Threads of vllm-project/vllm are different reporters'
#: own setups and clients, so each stays its own source.
SAME_TOOL_REPOSITORIES = ("github.com/tenstorrent/tt-inference-server",)


def source_group(url: str) -> str:
    """The independent source a point belongs to: its thread or repository
    (`sim.data.split.source_key`), with every thread of a `SAME_TOOL_REPOSITORIES` repository
    folded into the repository.

    >>> source_group("https://github.com/tenstorrent/tt-inference-server/issues/340")
    'github.com/tenstorrent/tt-inference-server'
    >>> source_group("https://github.com/vllm-project/vllm/pull/9668#x")
    'github.com/vllm-project/vllm/pull/9668'
    """
    key = source_key(url)
    for repository in SAME_TOOL_REPOSITORIES:
        if key == repository or key.startswith(repository + "/"):
            return repository
    return key


@dataclass(frozen=True, slots=True)
class PointErrors:
    """One point as the per-source view needs it: its source URL, split side, whether it was
    replayed, and its |error| per metric group it measured (absent: not measured)."""

    source: str
    split: str
    replayed: bool
    abs_errors: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One source's line: its points, their sides, and per metric group (points, median)."""

    source: str
    points: int
    replayed: int
    sides: dict[str, int]
    medians: dict[str, tuple[int, float]]


def source_rows(points: Iterable[PointErrors], groups: Sequence[str]) -> list[SourceRow]:
    """One row per `source_group`, sorted by name; medians over the replayed points only."""
    by_source: dict[str, list[PointErrors]] = {}
    for p in points:
        by_source.setdefault(source_group(p.source), []).append(p)
    rows = []
    for source in sorted(by_source):
        members = by_source[source]
        done = [p for p in members if p.replayed]
        medians = {}
        for g in groups:
            errors = [p.abs_errors[g] for p in done if g in p.abs_errors]
            if errors:
                medians[g] = (len(errors), statistics.median(errors))
        sides = {side: sum(p.split == side for p in members) for side in SPLITS}
        rows.append(SourceRow(source, len(members), len(done), sides, medians))
    return rows


def median_over_sources(
    rows: Sequence[SourceRow], groups: Sequence[str]
) -> dict[str, tuple[int, float]]:
    """Per metric group: (sources measuring it, the median of their medians)."""
    out = {}
    for g in groups:
        medians = [row.medians[g][1] for row in rows if g in row.medians]
        if medians:
            out[g] = (len(medians), statistics.median(medians))
    return out


def _cell(stat: tuple[int, float] | None) -> str:
    return f"{stat[1]:.1%} ({stat[0]})" if stat else "-"


def source_table(points: Sequence[PointErrors], groups: Sequence[str]) -> str:
    """The per-source table and the median-over-sources line, as docs/accuracy.md quotes it."""
    rows = source_rows(points, groups)
    head = "| source | points (replayed) | fit / held_out | "
    head += " | ".join(f"{g} median abs error (n)" for g in groups) + " |"
    lines = [head, "|---|---|---|" + "---|" * len(groups)]
    for row in rows:
        cells = [row.source, f"{row.points} ({row.replayed})",
                 f"{row.sides['fit']} / {row.sides['held_out']}",
                 *(_cell(row.medians.get(g)) for g in groups)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    over = median_over_sources(rows, groups)
    cells = ["median over sources (each once; robustness view, n = sources)", "-", "-",
             *(_cell(over.get(g)) for g in groups)]  # fmt: skip
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
