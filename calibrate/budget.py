"""Honour a calibration's time budget: run the cases the fits need, then the rest while time lasts.

The grid is sized from estimates (`calibrate.grid`), and estimates on a busy CPU can be off by
several times, so the sweep also checks a deadline. Cases come in two tiers:

- essential: the fewest cases every fit needs (decode corners, three prefill points, the lowest
  and highest GEMM token counts); they run whatever the clock says, so a profile always comes
  out;
- the rest, cheapest first (the most points for the time), each run only if the deadline has
  not passed and its estimate fits in the time left. Once one does not fit, none after it does
  (they cost more and the time left only shrinks): they are all skipped, and counted.

Estimates are scaled by how far off they have been so far (measured / estimated). Example:
budget 20 s; 6 essential cases estimated 1 s each take 2 s each (12 s; the scale is now x2);
then cases estimated 1, 2, 4, 8 s: the 1 s case is expected to take 2 s and runs (14 s), the
2 s one 4 s and runs (18 s), the 4 s one 8 s, which does not fit the 2 s left: it and the 8 s
one are skipped. The ETA shown is the same scaled sum of what is left, capped by the deadline.

Pure Python (no torch): the tests drive it with a fake clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Case:
    """One timed case: what it is (`kind`, `params`), its estimated seconds, its tier."""

    kind: str
    params: tuple[int, ...]
    estimated_s: float
    essential: bool = False


@dataclass(slots=True)
class Deadline:
    """`budget_s` seconds from now on `clock` (time.perf_counter unless a test passes one)."""

    budget_s: float
    clock: Callable[[], float] = time.perf_counter
    end_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.end_s = self.clock() + self.budget_s

    def left_s(self) -> float:
        return self.end_s - self.clock()


def order_cases(cases: Sequence[Case]) -> list[Case]:
    """Essential cases in their given order, then the others cheapest first (stable)."""
    rest = sorted((c for c in cases if not c.essential), key=lambda c: c.estimated_s)
    return [c for c in cases if c.essential] + rest


@dataclass(slots=True)
class BudgetRun:
    """What `run_within_budget` did: cases run and skipped, measured against estimated time."""

    run: list[Case] = field(default_factory=list)
    skipped: list[Case] = field(default_factory=list)
    measured_s: float = 0.0
    estimated_s: float = 0.0

    def eta_s(self, remaining: Sequence[Case], left_s: float) -> float:
        """Seconds still to go: the remaining estimates x (measured / estimated so far), at most
        the time left before the deadline (never negative)."""
        ratio = self.measured_s / self.estimated_s if self.estimated_s > 0 else 1.0
        todo = ratio * sum(c.estimated_s for c in remaining)
        essential = ratio * sum(c.estimated_s for c in remaining if c.essential)
        return max(0.0, essential, min(todo, left_s))


def run_within_budget(
    cases: Sequence[Case],
    measure: Callable[[Case], None],
    deadline: Deadline,
    on_case: Callable[[Case, BudgetRun, float], None] | None = None,
) -> BudgetRun:
    """`measure` each case in `order_cases` order until the budget says stop (module docstring).

    `on_case(case, run, eta_s)` is called after each measured case (for a progress bar).
    """
    ordered = order_cases(cases)
    done = BudgetRun()
    for i, case in enumerate(ordered):
        if not case.essential:
            left = deadline.left_s()
            ratio = done.measured_s / done.estimated_s if done.estimated_s > 0 else 1.0
            if left <= 0 or ratio * case.estimated_s > left:
                done.skipped = list(ordered[i:])
                break
        start = deadline.clock()
        measure(case)
        done.measured_s += deadline.clock() - start
        done.estimated_s += case.estimated_s
        done.run.append(case)
        if on_case is not None:
            on_case(case, done, done.eta_s(ordered[i + 1 :], deadline.left_s()))
    return done
