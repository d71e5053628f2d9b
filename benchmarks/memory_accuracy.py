"""kvsim's derived KV pool against real vLLM startup logs, before and after the memory model.

    python benchmarks/memory_accuracy.py          # per-log table, then the summary
    python benchmarks/memory_accuracy.py --terms  # also each term against what vLLM printed
    python benchmarks/memory_accuracy.py --fit    # refit the constants on the fit half
    python benchmarks/memory_accuracy.py --cudagraphs  # 0.20+ CUDA-graph estimate vs its logs

The logs are `sim/data/vllm_startup_logs.yaml` (each with its source URL). "before" is the
derivation kvsim shipped until this change (datasheet memory, no non-torch term, weights in
the model dtype, the old activation estimate; `sim.memory.validation.legacy_pool_bytes`),
"after" is `sim.memory.derive_num_gpu_blocks` with the shipped constants. Only the `fit` half
tuned those constants; the `held_out` half is the honest score. Target (issue 12): held-out
median |error| <= 2%, worst <= 10%. A negative "before" pool is a start the old code refused
("no memory left"): it counted quantized weights at 16 bits. `legacy_pool_bytes` reproduces
the old `derive_num_gpu_blocks` exactly on every log where that did not raise (checked against
commit c1e37a6). No GPU needed; runs in about a second.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from sim.memory import cudagraph
from sim.memory.terms import ACTIVATION_FIT, GIB, NON_TORCH_GIB
from sim.memory.validation import (
    PROFILED_RELEASE,
    Comparison,
    Split,
    compare_all,
    fit_activation,
    fit_non_torch_gib,
    predicted_budget,
    summarize,
)


def _pct(x: float) -> str:
    return f"{x:+.1%}" if abs(x) < 10 else f"{x:+.0%}"


def per_log_table(rows: list[Comparison]) -> str:
    lines = [
        "| log | split | engine | GPU x TP | observed GiB | before GiB | before err "
        "| after GiB | after err |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in rows:
        log = c.log
        flags = f" ({', '.join(log.unmodelled)})" if log.unmodelled else ""
        lines.append(
            f"| {log.id}{flags} | {c.split.value} | {log.engine} | {log.gpu_spec.name} x "
            f"{log.tp} | {c.observed_gib:.2f} | {c.before_gib:.2f} | {_pct(c.before_error)} "
            f"| {c.after_gib:.2f} | {_pct(c.after_error)} |"
        )
    return "\n".join(lines)


def terms_table(rows: list[Comparison]) -> str:
    """Each subtracted term, kvsim vs vLLM's own line, where vLLM printed it (GiB)."""
    lines = [
        "| log | weights kvsim/vLLM | activation kvsim/vLLM | non-torch kvsim/vLLM |",
        "|---|---|---|---|",
    ]
    for c in rows:
        log, lg = c.log, c.log.logged
        b = predicted_budget(log)

        def pair(mine: int, theirs: float | None) -> str:
            return f"{mine / GIB:.2f} / {'-' if theirs is None else f'{theirs:.2f}'}"

        lines.append(
            f"| {log.id} | {pair(b.weight_bytes, lg.weights_gib)} | "
            f"{pair(b.peak_activation_bytes, lg.activation_gib)} | "
            f"{pair(b.non_torch_bytes, lg.non_torch_gib)} |"
        )
    return "\n".join(lines)


def summary_table(rows: list[Comparison]) -> str:
    lines = [
        "| split | logs | before median | before worst | after median | after worst |",
        "|---|---|---|---|---|---|",
    ]
    recent = [c for c in rows if c.log.release >= PROFILED_RELEASE]
    groups = [
        (Split.HELD_OUT.value, [c for c in rows if c.split is Split.HELD_OUT]),
        (Split.FIT.value, [c for c in rows if c.split is Split.FIT]),
        ("held_out, vLLM >= 0.6", [c for c in recent if c.split is Split.HELD_OUT]),
        (  # issue #24's target: median <= 2% on held-out logs of vLLM >= 0.11
            "held_out, vLLM >= 0.11",
            [c for c in rows if c.log.release >= (0, 11) and c.split is Split.HELD_OUT],
        ),
        (  # the releases whose sampler peak (Triton, 0.19.1+) was derived from code alone
            "held_out, vLLM >= 0.19",
            [c for c in rows if c.log.release >= (0, 19) and c.split is Split.HELD_OUT],
        ),
    ]
    for label, subset in groups:
        before = summarize([c.before_error for c in subset])
        after = summarize([c.after_error for c in subset])
        lines.append(
            f"| {label} | {after.count} | {before.median_abs_error:.1%} | "
            f"{_pct(before.worst_abs_error).lstrip('+')} | {after.median_abs_error:.1%} | "
            f"{after.worst_abs_error:.1%} |"
        )
    return "\n".join(lines)


def fit_report() -> str:
    non_torch = fit_non_torch_gib()
    activation = fit_activation(non_torch)
    same = non_torch == NON_TORCH_GIB and activation == ACTIVATION_FIT
    lines = ["non-torch GiB (engine, TP>1):"]
    lines += [
        f"  {engine.value} tp>1={multi}: {value}" for (engine, multi), value in non_torch.items()
    ]
    lines.append(f"hidden_factor: {activation.hidden_factor}")
    lines += [f"sampler_copies[{p.value}]: {c}" for p, c in activation.sampler_copies.items()]
    lines.append(
        "matches sim/memory/terms.py" if same else "DIFFERS from sim/memory/terms.py: update it"
    )
    return "\n".join(lines)


def cudagraph_table() -> str:
    """vLLM's logged CUDA-graph estimate against kvsim's for the graph counts it printed,
    then the refit and each split's errors (`sim.memory.cudagraph`)."""
    lines = [
        "| log | split | graphs PW/FULL | logged GiB | kvsim GiB | error |",
        "|---|---|---|---|---|---|",
    ]
    for split in ("fit", "held_out"):
        for log, error in cudagraph.relative_errors(split):
            flags = f" ({', '.join(log.unmodelled)})" if log.unmodelled else ""
            lines.append(
                f"| {log.id}{flags} | {split} | {log.piecewise_graphs}/{log.full_graphs} | "
                f"{log.estimated_gib:.2f} | {cudagraph.predicted_gib(log):.2f} | {_pct(error)} |"
            )
    refit = cudagraph.fit_cudagraph()
    same = refit == cudagraph.CUDAGRAPH_FIT
    lines.append("")
    lines.append(
        f"fit: first capture {refit.first_capture_gib} GiB, {refit.per_graph_mib} MiB per graph "
        f"({'matches' if same else 'DIFFERS from'} sim/memory/cudagraph.py)"
    )
    for split in ("fit", "held_out"):
        for modelled in (True, False):
            errors = [abs(e) for _, e in cudagraph.relative_errors(split, modelled_only=modelled)]
            label = f"{split}, {'without unmodelled features' if modelled else 'all'}"
            lines.append(
                f"{label}: n={len(errors)}, median |error| {statistics.median(errors):.1%}, "
                f"worst {max(errors):.1%}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the constants and compare")
    parser.add_argument("--terms", action="store_true", help="also print each term")
    parser.add_argument(
        "--cudagraphs", action="store_true", help="the 0.20+ CUDA-graph estimate vs its logs"
    )
    args = parser.parse_args(argv)
    if args.cudagraphs:
        print(cudagraph_table())
        return 0
    if args.fit:
        print(fit_report())
        return 0
    rows = compare_all()
    print(per_log_table(rows))
    if args.terms:
        print()
        print(terms_table(rows))
    print()
    print(summary_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
