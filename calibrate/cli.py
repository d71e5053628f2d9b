"""`run_calibration`: probe the device, size a grid to the budget, sweep, fit, write a profile
and, next to it, the measured step-time model's coefficients refitted from the same timings
(`calibrate.to_measured`: `PROFILE.json` -> `PROFILE.coefficients.json`).

The lead wires this into `kvsim calibrate`; `python -m calibrate.cli` runs it directly (used by
`calibrate/gpu_run.sh` on machines without the full kvsim environment).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from typing import Any

import torch

from calibrate.budget import Deadline
from calibrate.grid import Ceilings, build_grid
from calibrate.sweep import TORCH_DTYPES, run_sweep
from calibrate.timing import probe_ceilings, run_metadata
from calibrate.to_measured import coefficients_path, usage_lines, write_coefficients
from sim.catalog import GpuSpec, ModelSpec, get_gpu, get_model, gpu_names
from sim.errors import InputError
from sim.files.outdir import write_text_atomic
from sim.latency.fit import fit_decode, fit_gemm, fit_prefill
from sim.latency.profile import PROFILE_KIND, SCHEMA_VERSION, StepTimeProfile, parse_profile

#: Said before and after a CPU run, and kept in the profile's notes.
CPU_NOTE = (
    "CPU timings exercise the calibration plumbing; they are not a GPU profile "
    "(run calibrate/gpu_run.sh on a GPU for numbers to plan with)"
)

#: Substrings of `torch.cuda.get_device_properties().name` -> catalog entry, most specific first.
_DEVICE_NAME_TO_GPU = (
    ("H200", "h200"),
    ("H100 PCIe", "h100-pcie"),
    ("H100", "h100-sxm"),
    ("A100-SXM4-40GB", "a100-40gb-sxm"),
    ("A100-SXM4-80GB", "a100-80gb-sxm"),
    ("A100 80GB PCIe", "a100-80gb-pcie"),
    ("L40S", "l40s"),
    ("L4", "l4"),
    ("B200", "b200"),
    ("MI300X", "mi300x"),
)


def match_gpu(device_name: str) -> GpuSpec | None:
    """The catalog GPU a CUDA device name denotes ("NVIDIA H200" -> h200), or None."""
    for needle, name in _DEVICE_NAME_TO_GPU:
        if needle.lower() in device_name.lower():
            return get_gpu(name)
    return None


def run_calibration(
    model_name: str | ModelSpec | dict[str, Any],
    out_path: str | Path,
    budget_s: float,
    device: str = "cpu",
    dtype: str = "float32",
    *,
    tp: int = 1,
    block_size: int = 16,
    gpu: str | None = None,
    decode_kernels: list[str] | None = None,
    report_dir: str | Path | None = None,
    progress: bool = False,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    max_context_tokens: int = 32768,
    max_case_bytes: int | None = None,
    deadline: Deadline | None = None,
) -> StepTimeProfile:
    """Calibrate `model_name` on `device`, write the profile JSON to `out_path`, return it.

    The budget covers probing, kernel checks and the sweep; the grid gets 70% of what is left
    after probing (estimates are rough, compilation and allocation are not in them), and the
    sweep stops timing new cases at the deadline (`calibrate.budget`): the fits then use the
    cases measured, and the profile's notes say how many were skipped. `deadline`: one started
    earlier (the CLI starts it before importing torch); default: `budget_s` from now.
    """
    start = time.perf_counter()
    deadline = deadline or Deadline(budget_s)
    model = get_model(model_name)
    if dtype not in TORCH_DTYPES:
        raise InputError(f"dtype must be one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("device 'cuda' requested but torch.cuda.is_available() is False")
    if device not in ("cpu", "cuda"):
        raise InputError(f"device must be 'cpu' or 'cuda', got {device!r}")
    meta = run_metadata(device, dtype)
    gpu_spec = get_gpu(gpu) if gpu else (match_gpu(str(meta["device_name"])) if device == "cuda"
                                         else None)  # fmt: skip
    on_gpu = device == "cuda"
    with _status(progress, "calibrate: probing copy bandwidth and matmul rate"):
        bw, flops = probe_ceilings(device, TORCH_DTYPES[dtype], size_bytes=(1 << 30) if on_gpu
                                   else (64 << 20), matmul_n=8192 if on_gpu else 1024)  # fmt: skip
    ceilings = Ceilings(bw, flops, call_overhead_s=15e-6 if on_gpu else 40e-6)
    if max_case_bytes is None:
        max_case_bytes = (8 << 30) if on_gpu else (256 << 20)
    elt = torch.tensor([], dtype=TORCH_DTYPES[dtype]).element_size()
    remaining = deadline.left_s()
    grid = build_grid(model, budget_s=max(0.7 * remaining, 0.1), ceilings=ceilings, tp=tp,
                      block_size=block_size, dtype_bytes=elt, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=max_num_batched_tokens,
                      max_context_tokens=max_context_tokens, max_case_bytes=max_case_bytes,
                      num_decode_kernels=len(decode_kernels or [None]))  # fmt: skip
    result = run_sweep(model, grid, device=device, dtype=dtype, tp=tp, block_size=block_size,
                       decode_kernels=decode_kernels, progress=progress, ceilings=ceilings,
                       deadline=deadline)  # fmt: skip
    if device == "cpu":
        result.notes.append(CPU_NOTE)
    meta.update(budget_s=budget_s, wall_s=round(time.perf_counter() - start, 3))
    doc = {
        "schema_version": SCHEMA_VERSION,
        "kind": PROFILE_KIND,
        "metadata": meta,
        "model": model.model_dump(),
        "tp": tp,
        "block_size": block_size,
        "dtype": dtype,
        "ceilings": {
            "copy_bandwidth_Bps": bw,
            "matmul_flops": flops,
            "datasheet_gpu": gpu_spec.name if gpu_spec else None,
            "datasheet_bandwidth_Bps": gpu_spec.bandwidth_Bps if gpu_spec else None,
            "datasheet_flops": _datasheet_flops(gpu_spec, dtype),
        },
        "decode_attention": fit_decode(result.decode_kernel, result.decode_points).model_dump(),
        "prefill_attention": fit_prefill("torch-sdpa", result.prefill_points).model_dump(),
        "gemms": {
            n: fit_gemm("torch-linear", pts).model_dump() for n, pts in result.gemm_points.items()
        },  # fmt: skip
        "alternative_decode": {
            n: fit_decode(n, pts).model_dump() for n, pts in result.alternative_decode.items()
        },  # fmt: skip
        "checks": result.checks,
        "skipped": result.skipped,
        "grid": {
            "decode_batches": list(grid.decode_batches),
            "decode_contexts": list(grid.decode_contexts),
            "prefill_chunks": list(grid.prefill_chunks),
            "prefill_priors": list(grid.prefill_priors),
            "gemm_tokens": list(grid.gemm_tokens),
            "warmup": grid.warmup,
            "repeats": grid.repeats,
            "estimated_s": grid.estimated_s,
            "notes": result.notes,  # the grid's notes, then the sweep's
        },
    }
    profile = parse_profile(doc, origin=str(out_path))  # the file we write must load back
    write_text_atomic(Path(out_path), profile.to_json())
    # The same measurements refit the measured model's per-GPU terms (`calibrate.to_measured`).
    write_coefficients(profile, out_path)
    if report_dir is not None:
        from calibrate.report import write_report

        write_report(profile, report_dir, stem=Path(out_path).stem)
    return profile


def _status(enabled: bool, message: str):
    """A spinner on stderr while a phase without steps runs (nothing when disabled)."""
    if not enabled:
        return contextlib.nullcontext()
    from rich.console import Console

    return Console(stderr=True).status(message)


def _datasheet_flops(gpu: GpuSpec | None, dtype: str) -> float | None:
    if gpu is None or dtype == "float32":  # no dense fp32 tensor figure in the catalog
        return None
    return gpu.peak_flops(dtype)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibrate.cli", description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True, help="profile JSON path")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--gpu", choices=gpu_names(), default=None)
    parser.add_argument("--decode-kernels", default=None, help="comma-separated")
    parser.add_argument("--report-dir", default=None)
    args = parser.parse_args(argv)
    if args.device == "cpu":
        print(f"note: {CPU_NOTE}")
    profile = run_calibration(
        args.model, args.out, args.budget, args.device, args.dtype, tp=args.tp,
        block_size=args.block_size, gpu=args.gpu,
        decode_kernels=args.decode_kernels.split(",") if args.decode_kernels else None,
        report_dir=args.report_dir, progress=True,
    )  # fmt: skip
    from calibrate.report import summarize

    print(f"wrote {args.out} ({profile.metadata.wall_s} s)")
    for note in profile.grid.get("notes", []):
        print(f"  note: {note}")
    for key, value in summarize(profile).items():
        print(f"  {key}: {value}")
    print("\n".join(usage_lines(coefficients_path(args.out))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
