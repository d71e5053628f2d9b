"""Digest every table kvsim writes for a fixed set of runs, to prove a change kept them byte-identical.

A restructuring must change no output. This script runs each job below in a fresh process
(`python -m sim.cli ...`, plots off), hashes every file the job wrote, and either saves the
digests or compares them with a saved set:

    python scripts/golden_tables.py --save /tmp/before.json     # on the old commit
    python scripts/golden_tables.py --against /tmp/before.json  # on the new one: exit 1 on a diff
    python scripts/golden_tables.py --list                       # the jobs, nothing run
    python scripts/golden_tables.py --only azure --against F     # the jobs whose name has 'azure'

Run both sides in the same checkout folder (e.g. `git stash` / `git checkout` there, not a
second worktree): `scenario.yaml` records the absolute trace path, so another folder differs.

The jobs: every bundled scenario (`scenarios/*.yaml`, the packaged default), the whole Azure
2023 conversation trace (19,366 requests) on every design and every pin, the Mooncake FAST'25
trace (first 600 requests) on four replicas under each router, a small sweep, a capacity search
and `kvsim step`. About 4 minutes on 2 cores (`--jobs 2`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCEN = ROOT / "scenarios"
AZURE = SCEN / "mistral_azure_conv_swa.yaml"
MOONCAKE = SCEN / "mooncake_prefix_caching.yaml"

#: (design, pin) pairs: every design at every pin it accepts.
AZURE_PINS = [
    ("v0-v1", "0.5.4"),
    ("v0-v2", "0.5.4"),
    ("v0-v2", "0.5.4+7380"),
    ("v0-fixed", "0.5.4"),
    ("v1-engine", "4ac7713"),
    ("v1-engine", "0.11.0"),
    ("v1-engine", "0.33.0"),
]
ROUTERS = ["round_robin", "least_outstanding", "least_kv_usage", "prefix_cache_aware"]


@dataclass(frozen=True)
class Job:
    """One kvsim command; `{out}` in argv is the job's output folder (or file stem)."""

    name: str
    argv: tuple[str, ...]


def _sets(**pairs: object) -> tuple[str, ...]:
    out: list[str] = []
    for key, value in pairs.items():
        out += ["--set", f"{key.replace('__', '.')}={value}"]
    return tuple(out)


def jobs() -> list[Job]:
    """Every job, in a fixed order."""
    found: list[Job] = []
    for path in sorted(SCEN.glob("*.yaml")):
        if "disagg" in path.name:
            argv: tuple[str, ...] = ("disagg", str(path), "-o", "{out}")
        else:
            argv = ("run", str(path), "--no-plots", "-o", "{out}")
        found.append(Job(f"scenario/{path.stem}", argv))
    default = ROOT / "sim" / "data" / "scenarios" / "default.yaml"
    found.append(Job("scenario/default", ("run", str(default), "--no-plots", "-o", "{out}")))
    for design, pin in AZURE_PINS:
        extra = _sets(scheduler__design=design, scheduler__vllm_version=pin)
        if design == "v1-engine":
            extra += _sets(scheduler__enable_chunked_prefill="true")
        found.append(
            Job(f"azure/{design}@{pin}", ("run", str(AZURE), "--no-plots", "-o", "{out}", *extra))
        )
    for router in ROUTERS:
        extra = _sets(
            engine__num_replicas=4,
            engine__router=router,
            workload__first_n=600,
            workload__rate_scale=1,
        )
        found.append(
            Job(f"mooncake/4x{router}", ("run", str(MOONCAKE), "--no-plots", "-o", "{out}", *extra))
        )
    found.append(
        Job(
            "sweep/rate",
            (
                "sweep",
                str(AZURE),
                "--set",
                "workload.rate_scale=0.5,1",
                "--set",
                "scheduler.max_num_seqs=64,128",
                "--no-plots",
                "-j",
                "1",
                "-o",
                "{out}/sweep",
            ),
        )
    )
    found.append(
        Job(
            "capacity/ttft",
            (
                "capacity",
                str(AZURE),
                "--slo",
                "ttft_p99=5s",
                "--set",
                "workload.first_n=300",
                "-o",
                "{out}/capacity.csv",
            ),
        )
    )
    found.append(
        Job(
            "step/llama",
            (
                "step",
                "--model",
                "llama-3.1-8b",
                "--gpu",
                "h100-sxm",
                "--decode",
                "8x1024",
                "--prefill",
                "1x2048",
                "--json",
            ),
        )
    )
    return found


#: Columns that measure this machine, not the simulation (a sweep point's wall time).
WALL_CLOCK_COLUMNS = ("wall_s",)


def _canonical(path: Path) -> bytes:
    """A file's bytes, or, for a table with a wall-clock column, the table without it."""
    data = path.read_bytes()
    if path.suffix == ".jsonl" and b'"wall_s"' in data:
        rows = [json.loads(line) for line in data.decode().splitlines() if line]
        for row in rows:
            for column in WALL_CLOCK_COLUMNS:
                row.pop(column, None)
        return "\n".join(json.dumps(row, sort_keys=True) for row in rows).encode()
    if path.suffix in (".csv", ".parquet"):
        import pandas as pd

        table = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        present = [c for c in WALL_CLOCK_COLUMNS if c in table.columns]
        if present:
            dtypes = ",".join(f"{c}:{t}" for c, t in table.dtypes.items())
            return (dtypes + "\n" + table.drop(columns=present).to_csv()).encode()
    return data


def run_job(job: Job) -> dict[str, str]:
    """Run one job in a fresh process and return {relative path: sha256} of what it wrote."""
    with tempfile.TemporaryDirectory(prefix="kvsim-golden-") as tmp:
        out = Path(tmp) / "out"
        argv = [a.replace("{out}", str(out)) for a in job.argv]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(
            [sys.executable, "-m", "sim.cli", *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
        )
        digests: dict[str, str] = {
            "exit": str(done.returncode),
            "stdout": hashlib.sha256(done.stdout.replace(tmp, "TMP").encode()).hexdigest(),
        }
        if done.returncode not in (0, 1):
            digests["stderr"] = done.stderr[-2000:]
        for path in sorted(Path(tmp).rglob("*")):
            if path.is_file():
                data = _canonical(path).replace(tmp.encode(), b"TMP")
                digests[str(path.relative_to(tmp))] = hashlib.sha256(data).hexdigest()
        return digests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--save", type=Path)
    parser.add_argument("--against", type=Path)
    parser.add_argument("--only", default="")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    selected = [job for job in jobs() if args.only in job.name]
    if args.list:
        for job in selected:
            print(job.name, " ".join(job.argv))
        return 0
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        results = dict(zip([j.name for j in selected], pool.map(run_job, selected), strict=True))
    broken = [name for name, digests in results.items() if "stderr" in digests]
    for name in broken:
        print(f"job {name} failed to run:\n{results[name]['stderr']}", file=sys.stderr)
    if broken:
        return 2
    if args.save:
        args.save.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        print(f"saved {len(results)} jobs, {sum(len(r) for r in results.values())} digests")
    if args.against:
        before = json.loads(args.against.read_text())
        diffs = [
            f"{name}: {key}"
            for name, digests in results.items()
            for key in sorted(set(digests) | set(before.get(name, {})))
            if digests.get(key) != before.get(name, {}).get(key)
        ]
        for line in diffs:
            print("DIFFERS", line)
        print(f"{len(results)} jobs compared: {len(diffs)} differences")
        return 1 if diffs else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
