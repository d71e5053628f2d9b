"""A report per profile: achieved bandwidth and FLOP/s, and the roofline's error, as a table
(Markdown) and a plot (PNG).

For each measured point: achieved bandwidth = ideal bytes / median time, as a fraction of the
datasheet bandwidth (GPU in the catalog) and of the measured copy bandwidth; achieved FLOP/s;
and the unadjusted roofline `max(flops / peak, bytes / bandwidth)` (efficiencies 1; datasheet
ceilings where known, else the measured ones) with its relative error
`roofline / measured - 1` (negative: the roofline is optimistic, as it must be at efficiency 1).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on calibration machines
import matplotlib.pyplot as plt  # noqa: E402

from sim.files.outdir import staged_file, write_text_atomic  # noqa: E402
from sim.latency.profile import OperatorProfile, StepTimeProfile  # noqa: E402


def _ceilings(profile: StepTimeProfile) -> tuple[float, float, str]:
    c = profile.ceilings
    if c.datasheet_bandwidth_Bps and c.datasheet_flops:
        return c.datasheet_bandwidth_Bps, c.datasheet_flops, f"datasheet {c.datasheet_gpu}"
    return c.copy_bandwidth_Bps, c.matmul_flops, "measured copy / matmul"


def report_rows(profile: StepTimeProfile) -> list[dict[str, Any]]:
    """One row per measured point of every operator."""
    bw, peak, _ = _ceilings(profile)
    ops: list[tuple[str, OperatorProfile]] = [
        ("decode_attention", profile.decode_attention),
        ("prefill_attention", profile.prefill_attention),
        *((f"decode_attention[{k}]", op) for k, op in profile.alternative_decode.items()),
        *((f"gemm.{k}", op) for k, op in profile.gemms.items()),
    ]
    rows = []
    for op_name, op in ops:
        for p in op.points:
            roofline_s = max(p.flops / peak, p.bytes / bw)
            achieved_Bps = p.bytes / p.median_s
            rows.append(
                {
                    "operator": op_name,
                    "kernel": op.kernel,
                    **{k: int(v) for k, v in p.params.items()},
                    "measured_s": p.median_s,
                    "achieved_GBps": achieved_Bps / 1e9,
                    "bw_frac_datasheet": (
                        achieved_Bps / profile.ceilings.datasheet_bandwidth_Bps
                        if profile.ceilings.datasheet_bandwidth_Bps
                        else None
                    ),
                    "bw_frac_copy": achieved_Bps / profile.ceilings.copy_bandwidth_Bps,
                    "achieved_TFLOPs": p.flops / p.median_s / 1e12,
                    "roofline_s": roofline_s,
                    "roofline_error": roofline_s / p.median_s - 1.0,
                }
            )
    return rows


def summarize(profile: StepTimeProfile) -> dict[str, Any]:
    """Headline numbers: decode bandwidth fractions, best GEMM TFLOP/s, roofline error."""
    rows = report_rows(profile)
    dec = [r for r in rows if r["operator"] == "decode_attention"]
    gemm = [r for r in rows if r["operator"].startswith("gemm.")]
    errs = [abs(r["roofline_error"]) for r in rows]
    fracs = [r["bw_frac_datasheet"] for r in dec if r["bw_frac_datasheet"] is not None]
    return {
        "device": profile.metadata.device_name,
        "decode_kernel": profile.decode_attention.kernel,
        "decode_bw_frac_copy_median": statistics.median(r["bw_frac_copy"] for r in dec),
        "decode_bw_frac_copy_max": max(r["bw_frac_copy"] for r in dec),
        "decode_bw_frac_datasheet_median": statistics.median(fracs) if fracs else None,
        "gemm_TFLOPs_max": max(r["achieved_TFLOPs"] for r in gemm),
        "matmul_TFLOPs_probe": profile.ceilings.matmul_flops / 1e12,
        "copy_GBps_probe": profile.ceilings.copy_bandwidth_Bps / 1e9,
        "roofline_abs_error_median": statistics.median(errs),
        "fit_residual_rms": {
            "decode_attention": profile.decode_attention.fit.residual_rms_rel,
            "prefill_attention": profile.prefill_attention.fit.residual_rms_rel,
            **{f"gemm.{k}": op.fit.residual_rms_rel for k, op in profile.gemms.items()},
        },
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown(profile: StepTimeProfile) -> str:
    rows = report_rows(profile)
    summary = summarize(profile)
    _, _, ceiling_name = _ceilings(profile)
    lines = [
        f"# Calibration report: {profile.model.name} on {profile.metadata.device_name}",
        "",
        f"{profile.metadata.date}, torch {profile.metadata.torch}, {profile.dtype}, "
        f"tp={profile.tp}, block_size={profile.block_size}; roofline ceilings: {ceiling_name}.",
        "",
        "| summary | value |",
        "|---|---|",
    ]
    for key, value in summary.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v:.3g}" for k, v in value.items())
        lines.append(f"| {key} | {_fmt(value)} |")
    cols = ["operator", "kernel", "num_seqs", "context_tokens", "prior_tokens", "chunk_tokens",
            "tokens", "measured_s", "achieved_GBps", "bw_frac_datasheet", "bw_frac_copy",
            "achieved_TFLOPs", "roofline_s", "roofline_error"]  # fmt: skip
    lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def plot(profile: StepTimeProfile):
    """Figure: measured vs roofline (all points), decode time vs context tokens by batch."""
    rows = report_rows(profile)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.5))
    for prefix, marker in (("decode", "o"), ("prefill", "s"), ("gemm", "^")):
        sel = [r for r in rows if r["operator"].startswith(prefix)]
        ax0.scatter([r["measured_s"] for r in sel], [r["roofline_s"] for r in sel],
                    marker=marker, label=prefix, alpha=0.7)  # fmt: skip
    lo = min(min(r["measured_s"], r["roofline_s"]) for r in rows)
    hi = max(max(r["measured_s"], r["roofline_s"]) for r in rows)
    ax0.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="y = x")
    ax0.set(xscale="log", yscale="log", xlabel="measured median (s)", ylabel="roofline (s)",
            title="roofline vs measured (per layer)")  # fmt: skip
    ax0.legend()
    dec = [r for r in rows if r["operator"] == "decode_attention"]
    for batch in sorted({r["num_seqs"] for r in dec}):
        sel = sorted((r for r in dec if r["num_seqs"] == batch), key=lambda r: r["context_tokens"])
        ax1.plot([r["context_tokens"] for r in sel], [r["measured_s"] for r in sel], "o-",
                 label=f"B={batch}")  # fmt: skip
    ax1.set(xscale="log", yscale="log", xlabel="total context tokens", ylabel="time (s)",
            title=f"decode attention ({profile.decode_attention.kernel})")  # fmt: skip
    ax1.legend(fontsize="small")
    fig.tight_layout()
    return fig


def write_report(profile: StepTimeProfile, out_dir: str | Path, stem: str = "report") -> list[Path]:
    """Write `<stem>.md` and `<stem>.png` under out_dir; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, png = out_dir / f"{stem}.md", out_dir / f"{stem}.png"
    write_text_atomic(md, markdown(profile))
    fig = plot(profile)
    with staged_file(png) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return [md, png]
