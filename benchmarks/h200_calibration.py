"""The H200 calibration runs (sim/data/calibrations/h200-llama-3.1-8b-bf16/): how well the shipped
step-time model extrapolates to an H200 it never saw, how repeatable a calibration is, and how
well one run's fit predicts the other run's timings.

    python benchmarks/h200_calibration.py

Prints one table per question, each cell a median / p90 of |predicted / measured - 1| over the
cases of one term:

- **shipped -> H200**: the default model for `hardware.gpu: h200` (the shipped fit's nearest GPU,
  h100-sxm, its efficiencies applied to the H200 datasheet) against each run's timings. GEMMs
  are cuBLAS, as in vLLM, so that row is a held-out check of the extrapolation. The attention
  rows compare different kernels (the shipped fit is vLLM's paged kernels in Vidur's profiles;
  calibrate times torch's gather + SDPA reference) and say how far that reference is from them,
  not how good the model is.
- **fit run A -> run B**: the terms `calibrate.to_measured` fits on one run, scored on the
  other run's cases (same grid, same device, an independent run): the calibration's own
  held-out error.
- **run to run**: |t_run2 / t_run1 - 1| over the cases both runs timed (the timing noise floor).

It also prints each run's decode-kernel fraction of the H200's datasheet HBM bandwidth.
No GPU needed: it reads the committed profiles.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibrate.profile_tables import samples_from_profile, target_of, to_tables  # noqa: E402
from calibrate.to_measured import (  # noqa: E402
    decode_bandwidth_fraction,
    fit_terms,
    in_sample_errors,
)
from sim.latency.measured import shipped_coefficients  # noqa: E402
from sim.latency.profile import StepTimeProfile, load_profile  # noqa: E402

CALIBRATION_DIR = (
    Path(__file__).resolve().parents[1] / "sim/data/calibrations/h200-llama-3.1-8b-bf16"
)
RUNS = ("run1", "run2", "run3")
TERMS = ("GEMM", "decode attention", "prefill attention")


def load_runs(root: Path = CALIBRATION_DIR) -> dict[str, StepTimeProfile]:
    return {run: load_profile(root / f"{run}.json") for run in RUNS}


def _summary(errors: np.ndarray) -> tuple[float, float, int]:
    e = np.abs(np.asarray(errors, float))
    return float(np.median(e)), float(np.quantile(e, 0.9)), len(e)


def shipped_errors(profile: StepTimeProfile) -> dict[str, tuple[float, float, int]]:
    """The shipped (extrapolated) model's error per term on one run's cases."""
    target = target_of(profile)
    shipped = shipped_coefficients()
    # nearest_fitted_gpu(h200): the same peak FLOP/s and the closest bandwidth
    entry = shipped["gpus"]["h100-sxm"]
    tables = to_tables(samples_from_profile(profile), target.name)
    errors = in_sample_errors(tables, entry, target)
    return {term: _summary(errors[term]) for term in TERMS}


def cross_run_errors(
    fit_on: StepTimeProfile, score_on: StepTimeProfile
) -> dict[str, tuple[float, float, int]]:
    """Terms fitted on `fit_on`'s cases, scored on `score_on`'s."""
    target = target_of(fit_on)
    fitted = fit_terms(to_tables(samples_from_profile(fit_on), target.name), target)
    tables = to_tables(samples_from_profile(score_on), target.name)
    errors = in_sample_errors(tables, fitted, target)
    return {term: _summary(errors[term]) for term in TERMS}


def run_to_run(a: StepTimeProfile, b: StepTimeProfile) -> dict[str, tuple[float, float, int]]:
    """|t_b / t_a - 1| over the cases both runs timed, per term."""
    sa, sb = samples_from_profile(a), samples_from_profile(b)
    out: dict[str, tuple[float, float, int]] = {}
    Key = tuple[object, ...]
    gemm_a: dict[Key, float] = {(n, t): s for n, rows in sa.gemm.items() for t, s in rows}
    gemm_b: dict[Key, float] = {(n, t): s for n, rows in sb.gemm.items() for t, s in rows}
    pairs: dict[str, tuple[dict[Key, float], dict[Key, float]]] = {
        "GEMM": (gemm_a, gemm_b),
        "decode attention": ({r[:2]: r[2] for r in sa.decode}, {r[:2]: r[2] for r in sb.decode}),
        "prefill attention": (
            {r[:2]: r[2] for r in sa.prefill},
            {r[:2]: r[2] for r in sb.prefill},
        ),
    }
    for term, (ta, tb) in pairs.items():
        common = sorted(set(ta) & set(tb))
        out[term] = _summary(np.array([tb[k] / ta[k] - 1.0 for k in common]))
    return out


def tables_text(runs: dict[str, StepTimeProfile]) -> str:
    r1, r2, r3 = runs["run1"], runs["run2"], runs["run3"]
    rows = {
        "shipped -> H200, run1": shipped_errors(r1),
        "shipped -> H200, run2": shipped_errors(r2),
        "shipped -> H200, run3 (run-ahead)": shipped_errors(r3),
        "fit run1 -> run2": cross_run_errors(r1, r2),
        "fit run2 -> run1": cross_run_errors(r2, r1),
        "run to run 1 -> 2 (noise)": run_to_run(r1, r2),
        "run 1 -> run 3 (launch timed -> not)": run_to_run(r1, r3),
    }
    lines = [
        "| median / p90 of abs(rel. error) | " + " | ".join(TERMS) + " |",
        "|---|" + "---|" * len(TERMS),
    ]
    for name, cells in rows.items():
        lines.append(
            f"| {name} | "
            + " | ".join(
                f"{100 * m:.1f} / {100 * p:.1f} % (n={n})" for m, p, n in (cells[t] for t in TERMS)
            )
            + " |"
        )
    for run, profile in runs.items():
        frac = decode_bandwidth_fraction(profile, target_of(profile).bandwidth_Bps)
        lines.append(
            f"{run}: decode kernel {profile.decode_attention.kernel}: "
            f"{100 * frac['median']:.1f}% median, {100 * frac['max']:.1f}% max of the H200's "
            "datasheet HBM bandwidth"
        )
    return "\n".join(lines)


def main() -> int:
    print(tables_text(load_runs()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
