"""Replay the whole Azure LLM inference 2023 conversation trace (19,366 requests) once per
scheduler / block-manager design, each in a fresh process, and print a table of wall time
(whole process: imports, load, simulate, write outputs), simulated requests per second and peak
memory (max RSS of the process).

    python benchmarks/replay_azure.py             # the four designs, then v0-v2/walk and /slow
    python benchmarks/replay_azure.py v1-engine   # one design
    python benchmarks/replay_azure.py v0-v2/walk  # the decode cohort off: every step walks
    python benchmarks/replay_azure.py v0-v2/slow  # the decode fast path off as well
    python benchmarks/replay_azure.py --repeat=3  # each row the median of 3 replays
    python benchmarks/replay_azure.py --pair v1-engine  # sources vs compiled core, alternating

The variants change no result (the tests prove it), only the work: `walk` visits every running
request on every step (with the fast path's skipped manager calls), `slow` also calls the
manager for every decode. Target (issue #3): under 10 s and 500 MB per replay on a 2-core
machine. Machines are noisy: compare the rows of one run with each other, not with another
day's run.

`--pair` runs each design on the sources (KVSIM_NATIVE=0) and on the compiled core
(`python scripts/build_native.py` first; see `sim.native`), one after the other in each repeat,
so both rows see the same machine load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _isolated import in_forked_child  # benchmarks/ is the script's folder

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "mistral_azure_conv_swa.yaml"
DESIGNS = ["v0-v1", "v0-v2", "v0-fixed", "v1-engine"]
#: v0-v2 without the decode cohort, and without the decode fast path either.
VARIANTS = ["v0-v2/walk", "v0-v2/slow"]


def command(label: str, out: str) -> list[str]:
    design, _, variant = label.partition("/")
    cmd = [sys.executable, "-m", "sim.cli", "run", str(SCENARIO), "--no-plots", "--json", "-o", out]
    cmd += ["--set", f"scheduler.design={design}"]
    if design == "v1-engine":
        # vLLM's V1 engine turns chunked prefill on by default (spec 1.3); without it, its
        # startup check refuses this pool for Mistral's 32k max_model_len.
        cmd += ["--set", "scheduler.enable_chunked_prefill=true"]
    if variant == "walk":
        cmd += ["--set", "scheduler.decode_cohort=false"]
    elif variant == "slow":
        cmd += ["--set", "scheduler.decode_fast_path=false"]
    return cmd


def replay(label: str, core: str) -> dict:
    env = {**os.environ, "KVSIM_NATIVE": "0"} if core == "sources" else None
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(
            command(label, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        stdout, stderr = proc.communicate()
        wall_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{label}: kvsim run failed ({proc.returncode}): {stderr.strip()}")
        summary = json.loads(stdout)["summary"]
    # communicate() reaped the child: its peak RSS is the max over reaped children so far,
    # so each label runs in its own process tree (see main).
    return {
        "design": label,
        "core": core,
        "wall_s": wall_s,
        "requests": summary["num_requests"],
        "sim_req_per_wall_s": summary["num_requests"] / wall_s,
        "steps": summary["num_steps"],
        "violations": summary["num_violations"],
        "failed": summary["states"]["failed"],
    }


def measure(label: str, core: str) -> dict:
    """Run `replay` in a child process so that ru_maxrss of its children is this replay's alone."""
    return in_forked_child(lambda: replay(label, core))


def median_row(runs: list[dict]) -> dict:
    """The run of the median wall time, with every time and the largest peak."""
    runs = sorted(runs, key=lambda r: r["wall_s"])
    row = dict(runs[len(runs) // 2])
    row["all_wall_s"] = [r["wall_s"] for r in runs]
    row["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    return row


def measure_repeated(label: str, repeat: int, cores: list[str]) -> list[dict]:
    """`repeat` rounds, each running `label` once per core in turn; one median row per core."""
    runs: dict[str, list[dict]] = {core: [] for core in cores}
    for _ in range(repeat):
        for core in cores:
            runs[core].append(measure(label, core))
    return [median_row(runs[core]) for core in cores]


def main() -> None:
    args = sys.argv[1:]
    repeat = 1
    if args and args[0].startswith("--repeat="):
        repeat = int(args.pop(0).split("=", 1)[1])
    pair = "--pair" in args
    args = [a for a in args if a != "--pair"]
    labels = args or [*DESIGNS, *VARIANTS]
    from sim import native  # which core a plain `kvsim run` takes on this checkout

    default_core = "compiled" if native.decide() is native.Selection.COMPILED else "sources"
    if pair and default_core != "compiled":
        raise SystemExit("--pair needs a current compiled core: python scripts/build_native.py")
    cores = ["sources", "compiled"] if pair else [default_core]
    rows = [row for label in labels for row in measure_repeated(label, repeat, cores)]
    header = (
        f"{'design':<11} {'core':<9} {'wall s':>7} {'peak MB':>8} {'requests':>8} {'req/wall-s':>10} "
        f"{'steps':>8} {'violations':>10} {'failed':>6}"
    )
    if repeat > 1:
        header += "  all wall s (median shown)"
    print(header)
    print("-" * len(header))
    for r in rows:
        line = (
            f"{r['design']:<11} {r['core']:<9} {r['wall_s']:>7.1f} {r['peak_rss_mb']:>8.0f} {r['requests']:>8} "
            f"{r['sim_req_per_wall_s']:>10.0f} {r['steps']:>8} {r['violations']:>10} {r['failed']:>6}"
        )
        if repeat > 1:
            line += "  " + " ".join(f"{t:.1f}" for t in r["all_wall_s"])
        print(line)


if __name__ == "__main__":
    main()
