"""Compare the forms of V1's per-step worker CPU cost on the serving points' fit half.

    python benchmarks/serving_accuracy.py --fit-overhead --forms   # every form (~25 min)
    python benchmarks/worker_forms.py --form layer_launch          # one form's grid
    python benchmarks/worker_forms.py --form layer_launch --table 2.25 100  # its serving table

The forms, their grids and the decision rule are pre-registered in `sim.latency.worker_form`:
A (FIXED) is `serving_accuracy.fit_v1_worker_step`'s one-parameter grid; B (LAYER_LAUNCH) and
C (LAYER_LAUNCH_MIXED) search prep P x per-layer launch c. Each form is scored as
`--fit-overhead` scores A: median |TPOT/ITL error| over `overhead_fit_points` (the fit half's
dense, non-eager points). The held-out half is not read. Each replay's step-time model is the
scenario's own rebuilt under the form (`MeasuredStepTime.with_worker_form`, through
`serving_accuracy.replay`'s `adapt_step_time`); nothing in `sim` is patched.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import serving_accuracy as sa  # noqa: E402

from sim.latency import StepTimeModel  # noqa: E402
from sim.latency.measured import MeasuredStepTime  # noqa: E402
from sim.latency.worker_form import GpuFloors, WorkerCpuForm, WorkerForm  # noqa: E402

#: (prep P grid, per-layer launch c grid) in seconds, exact decimal literals (the module doc of
#: `sim.latency.worker_form` says why these ranges).
FORM_GRIDS: dict[WorkerCpuForm, tuple[tuple[float, ...], tuple[float, ...]]] = {
    WorkerCpuForm.FIXED: (sa.V1_WORKER_GRID_S, (0.0,)),
    WorkerCpuForm.LAYER_LAUNCH: (sa.V1_WORKER_GRID_S, (50e-6, 75e-6, 100e-6, 125e-6, 150e-6)),
    WorkerCpuForm.LAYER_LAUNCH_MIXED: ((1.75e-3, 2e-3, 2.25e-3, 2.5e-3), (50e-6, 100e-6, 150e-6)),
}
#: The pre-registered margin: a new form must beat FIXED's fit-half score by this much.
ADOPT_MARGIN = 0.005

Params = tuple[float, float]


def worker_params(
    form: WorkerCpuForm, prep_s: float, launch_s: float, gpu_floors: GpuFloors | None = None
) -> sa.AdaptStepTime:
    """A replay's `adapt_step_time` under this form, P and c: a measured model is rebuilt with
    them (and recording its steps' GPU time into `gpu_floors`); another model is kept."""
    worker = WorkerForm(form, launch_s, prep_s)

    def adapt(model: StepTimeModel) -> StepTimeModel:
        if isinstance(model, MeasuredStepTime):
            return model.with_worker_form(worker, gpu_floors)
        return model

    return adapt


def _errors(point: sa.Point, adapt: sa.AdaptStepTime | None) -> list[float]:
    got = sa.replay(point, adapt_step_time=adapt).group("TPOT/ITL")
    return [] if got is None else [abs(got[1].error)]


def hides_every_launch(floors: GpuFloors, form: WorkerCpuForm, launch_s: float) -> bool:
    """Whether form A's replay, whose steps have these GPU floors, has no step where `form`
    at c = `launch_s` exposes a launch (L x c > GPU, the float test `exposed_launch_s` makes):
    then that form's replay takes the same steps at the same times and gives A's result."""
    floor = floors.every_step if form is WorkerCpuForm.LAYER_LAUNCH else floors.prefill_steps
    return all(not (layers * launch_s > gpu_s) for layers, gpu_s in floor.items())


def fit_form(
    points: list[sa.Point], form: WorkerCpuForm, grids: tuple[tuple[float, ...], ...] | None = None
) -> tuple[Params, dict[Params, float]]:
    """The (P, c) of `form` with the smallest fit-half score (ties: the smaller P, then c), and
    every score. A point whose form-A replay at P hides every launch at c keeps A's error
    (`hides_every_launch`: the same replay, not re-run); the rest are replayed under the form.
    The held-out half is not read."""
    prep_grid, launch_grid = grids or FORM_GRIDS[form]
    fit = sa.overhead_fit_points(points)
    scores: dict[Params, float] = {}
    for prep_s in prep_grid:
        fixed: list[tuple[sa.Point, GpuFloors, list[float]]] = []
        for point in fit:
            floors = GpuFloors()
            recording = worker_params(WorkerCpuForm.FIXED, prep_s, 0.0, floors)
            fixed.append((point, floors, _errors(point, recording)))
        for launch_s in launch_grid:
            errors: list[float] = []
            adapt = worker_params(form, prep_s, launch_s)
            for point, floors, fixed_errors in fixed:
                same = launch_s == 0.0 or hides_every_launch(floors, form, launch_s)
                errors += fixed_errors if same else _errors(point, adapt)
            scores[(prep_s, launch_s)] = statistics.median(errors)
    return min(scores, key=lambda k: (scores[k], k)), scores


def decide(best_scores: dict[WorkerCpuForm, float]) -> WorkerCpuForm:
    """The pre-registered rule: the new form with the lowest score if it is at least
    `ADOPT_MARGIN` below FIXED's, else FIXED. Example: {A: 5.92%, B: 5.50%} -> A (0.42 pp)."""
    base = best_scores[WorkerCpuForm.FIXED]
    new = [f for f in best_scores if f is not WorkerCpuForm.FIXED]
    qualified = [f for f in new if best_scores[f] <= base - ADOPT_MARGIN]
    return min(qualified, key=lambda f: best_scores[f]) if qualified else WorkerCpuForm.FIXED


def report(points: list[sa.Point], forms: list[WorkerCpuForm]) -> str:
    """Every grid point's score, each form's best, and what the rule decides."""
    lines, best_scores = [], {}
    for form in forms:
        best, scores = fit_form(points, form)
        for (prep_s, launch_s), err in scores.items():
            lines.append(
                f"{form.value}: P {1e3 * prep_s:.2f} ms, c {1e6 * launch_s:3.0f} us: "
                f"median |TPOT/ITL error| {100 * err:.2f}% on the fit half"
            )
        best_scores[form] = scores[best]
        lines.append(
            f"best {form.value}: P {1e3 * best[0]:.2f} ms, c {1e6 * best[1]:.0f} us, "
            f"{100 * scores[best]:.2f}%"
        )
    if WorkerCpuForm.FIXED in best_scores:
        lines.append(f"decision (rule: beat fixed by 0.5 pp): {decide(best_scores).value}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--form", action="append", choices=[f.value for f in WorkerCpuForm],
                        help="a form to fit (repeatable; default: all)")  # fmt: skip
    parser.add_argument("--table", nargs=2, metavar=("P_MS", "C_US"),
                        help="instead of fitting, print serving_accuracy's table of every "
                        "point (held-out half included) under one --form at P ms and c us")  # fmt: skip
    args = parser.parse_args(argv)
    forms = [WorkerCpuForm(f) for f in args.form] if args.form else list(WorkerCpuForm)
    if args.table:
        if len(forms) != 1:
            raise SystemExit("--table takes one --form")
        prep_ms, launch_us = args.table  # decimal text -> the float its literal gives
        adapt = worker_params(forms[0], float(f"{prep_ms}e-3"), float(f"{launch_us}e-6"))
        return sa.main([], adapt_step_time=adapt)
    print(report(sa.load_points(), forms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
