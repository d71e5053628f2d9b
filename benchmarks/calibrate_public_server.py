"""`kvsim calibrate --from-bench` on public results of one real server: does fitting on some of
its `vllm bench serve` runs predict the others better than the shipped model?

    python benchmarks/calibrate_public_server.py            # dennislee22's A100, util 0.5
    python benchmarks/calibrate_public_server.py --group dl-qwen2-7b-a100-tp1-u025

A group is the measurements of sim/data/vllm_serving_measurements.yaml whose ids start with the
prefix: one server (same GPU, launch and release) benchmarked at several sizes. Each becomes a
`BenchFile` (its measured TTFT / TPOT / ITL / throughput, its prompts, rate and concurrency, its
dataset), sorted by id; `sim.vllm_bench.calibrate.fit_from_bench` fits the two factors on every
other one and this prints, for the held-out runs, the shipped model's error beside the fitted
one's. Takes a few minutes (the 500-prompt runs replay dozens of times).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import serving_accuracy as sa  # noqa: E402

from sim.scenario.schema import Scenario  # noqa: E402
from sim.vllm_bench.bench_files import FIT_METRICS, BenchFile  # noqa: E402
from sim.vllm_bench.calibrate import evaluate, fit_from_bench  # noqa: E402


def bench_files(prefix: str) -> tuple[list[BenchFile], Scenario]:
    points = [p for p in sa.load_points() if p.id.startswith(prefix)]
    if not points:
        raise SystemExit(f"no measurement id starts with {prefix!r}")
    files = []
    for point in points:
        options, settings = sa.workload_options(point)
        measured = {k: float(point.measured[k]) for k in FIT_METRICS if k in point.measured}
        files.append(BenchFile(Path(point.id), measured, settings, options))
    release = sa.kvsim_release(str(points[0].raw["vllm_version"]))
    return files, sa.scenario_for(points[0], release)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", default="dl-qwen2-7b-a100-tp1-u05-in1024-out1024")
    parser.add_argument("--per-term", action="store_true", help="compute and memory factors")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    files, scenario = bench_files(args.group)
    shipped = evaluate(scenario, Path.cwd(), files)  # the model as it ships
    fit = fit_from_bench(scenario, Path.cwd(), files, per_term=args.per_term)
    print(f"{args.group}: {len(files)} runs, fitted on {len(fit.fit_files)}: "
          f"{fit.factors.described()}")  # fmt: skip
    print("| held-out run | metric | measured | shipped | fitted |")
    print("|---|---|---:|---:|---:|")
    for path in fit.held_out_files:
        for metric, (pred, meas) in fit.compared[path].items():
            base = shipped.compared[path][metric][0]
            print(f"| {path} | {metric} | {meas:.4g} | {base:.4g} ({100 * (base / meas - 1):+.1f}%) "
                  f"| {pred:.4g} ({100 * (pred / meas - 1):+.1f}%) |")  # fmt: skip
    print(f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
