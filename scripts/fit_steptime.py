"""Refit the measured step-time model from Vidur's raw profiles and write its coefficients.

Usage:
    python scripts/fit_steptime.py VIDUR_DIR [--out sim/data/steptime_coefficients.json]
    python scripts/fit_steptime.py VIDUR_DIR --export-from-git /path/to/vidur/.git

VIDUR_DIR is laid out like the Vidur repository (github.com/microsoft/vidur, MIT licence):
`VIDUR_DIR/data/profiling/...`. A clone works as is for the mlp/network files; the attention
and CPU-overhead files are read at older commits (files >= 4 MiB may be missing from a copy of
HEAD), so `--export-from-git GIT_DIR` first writes every file of
`sim.latency.measured_fit.SOURCES` into VIDUR_DIR with `git --git-dir GIT_DIR show
COMMIT:PATH`. The raw data is not committed here (about 12 MB).

The fit keeps every 5th measured point out (the `rows` split) and scores it; the band shipped
with the coefficients comes from those residuals (whole steps on the A100, layers on the H100)
and, for GPUs outside the fit, from fitting the A100 alone and scoring the H100.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from sim.latency import measured_check as mc
from sim.latency import measured_fit as mf


def export_from_git(git_dir: Path, out_dir: Path) -> None:
    for path, commit in mf.SOURCES:
        target = out_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        blob = subprocess.run(
            ["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"],
            check=True,
            capture_output=True,
        ).stdout
        target.write_bytes(blob)


def _summary(errors: np.ndarray) -> dict[str, float]:
    e = np.abs(errors)
    return {
        "median_abs": round(float(np.median(e)), 4),
        "p90_abs": round(float(np.quantile(e, 0.9)), 4),
        "n": len(e),
    }


def _envelope(*bands: dict[str, float]) -> dict[str, float]:
    return {
        "low_factor": min(b["low_factor"] for b in bands),
        "high_factor": max(b["high_factor"] for b in bands),
    }


def build(root: Path) -> dict:
    tables = mf.load_tables(root)
    fit, val = mc.split(tables, "rows")
    co = mc.fit_coefficients(fit, root, mc.overhead_keep("rows", validation=False))
    validation: dict[str, dict] = {}
    for gpu in sorted(co["gpus"]):
        errs = mc.category_errors(val, co, gpu)
        validation[gpu] = {cat: _summary(e) for cat, e in errs.items()}
    over = mc.overhead_errors(root, co, mc.overhead_keep("rows", validation=True))
    validation["engine overhead (v0)"] = _summary(over)
    step_errors = []
    for model in ("Llama-2-70b-hf", "Meta-Llama-3-70B"):
        ours, _ = mc.whole_step_errors(val, tables, root, co, model, "a100-80gb-sxm", 2)
        validation["a100-80gb-sxm"][f"whole step {model} tp2"] = _summary(ours)
        step_errors.append(ours)
    a100_band = mc.band_from(np.concatenate(step_errors))
    h100_layers = mc.category_errors(val, co, "h100-sxm")["layer (GEMM + non-GEMM)"]
    # Cross-GPU: fit the A100 alone, score the H100 as an extrapolated GPU.
    gfit, gval = mc.split(tables, "gpu")
    gco = mc.fit_coefficients(gfit, root)
    cross = mc.category_errors(gval, gco, "h100-sxm")
    validation["extrapolated (A100 fit -> H100)"] = {c: _summary(e) for c, e in cross.items()}
    co["band"] = {
        "a100-80gb-sxm": a100_band,
        # H100 attention is carried over from the A100: its band is at least the A100's.
        "h100-sxm": _envelope(a100_band, mc.band_from(h100_layers)),
        "extrapolated": _envelope(a100_band, mc.band_from(cross["layer (GEMM + non-GEMM)"])),
    }
    co["validation"] = validation
    return {
        "schema": 1,
        "provenance": mc.provenance(root, mc.SPLIT_TEXT["rows"]),
        **co,
    }


def write_test_extract(root: Path, out_dir: Path) -> None:
    """A small extract of held-out rows for tests/latency/test_measured_steptime.py (MIT, see notice).

    steps.csv: whole steps of Meta-Llama-3-70B at TP 2 on the A100 assembled from measured
    operators (`measured_check.measured_steps`), every 31st held-out one; gemm.csv: every 97th
    held-out GEMM row of each GPU.
    """
    tables = mf.load_tables(root)
    _, val = mc.split(tables, "rows")
    _, steps = mc.measured_steps(val, tables, root, "Meta-Llama-3-70B", "a100-80gb-sxm", 2)
    rows = []
    for batch, measured_s in steps[::31]:
        prior, chunk = batch.prefill_chunks[0] if batch.prefill_chunks else (0, 0)
        contexts = batch.decode_context_tokens
        rows.append(
            {
                "num_decodes": len(contexts),
                "decode_context": contexts[0] if contexts else 0,
                "prefill_prior": prior,
                "prefill_chunk": chunk,
                "measured_s": round(measured_s, 9),
            }
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out_dir / "steps.csv", index=False)
    gemm = val.gemm.sort_values(["gpu", "model", "tp", "op", "tokens"]).iloc[::97]
    k_n = gemm.flops / (2 * gemm.tokens)
    gemm = gemm.assign(k_times_n=k_n.round().astype(int))
    columns = ["gpu", "model", "tp", "op", "tokens", "k_times_n", "bytes", "time_s"]
    gemm[columns].to_csv(out_dir / "gemm.csv", index=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vidur_dir", type=Path)
    parser.add_argument("--out", type=Path, default=Path("sim/data/steptime_coefficients.json"))
    parser.add_argument("--export-from-git", type=Path, default=None)
    parser.add_argument("--test-extract", type=Path, default=None, help="also write test rows")
    args = parser.parse_args(argv)
    if args.export_from_git is not None:
        export_from_git(args.export_from_git, args.vidur_dir)
    try:
        doc = build(args.vidur_dir)
    except FileNotFoundError as error:
        print(f"fit_steptime: {error}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    print(f"wrote {args.out}")
    if args.test_extract is not None:
        write_test_extract(args.vidur_dir, args.test_extract)
        print(f"wrote {args.test_extract}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
