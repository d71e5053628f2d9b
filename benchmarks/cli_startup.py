"""Time the CLI's startup: `kvsim --help` and `import sim.cli.main`, each in a fresh interpreter.

    python benchmarks/cli_startup.py            # median of 9 runs of each
    python benchmarks/cli_startup.py --runs=21

Target (issue #13): `kvsim --help` under 0.3 s. The commands import their heavy packages
(pandas, pyarrow, matplotlib) when they run, so startup is the interpreter, typer, rich and
kvsim's command modules; tests/cli/test_cli_imports.py checks which modules load (no timing in
tests). Machines are noisy: compare rows of one run, or runs on one machine.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ROWS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import sim.cli.main": [sys.executable, "-c", "import sim.cli.main"],
    "kvsim --help": [sys.executable, "-m", "sim.cli", "--help"],
}


def wall_s(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    runs = 9
    for arg in sys.argv[1:]:
        if arg.startswith("--runs="):
            runs = int(arg.split("=", 1)[1])
        else:
            raise SystemExit(f"unknown argument {arg!r} (expected --runs=N)")
    print(f"{'what':<16} {'median s':>9} {'min s':>7} {'max s':>7}  ({runs} runs each)")
    for name, command in ROWS.items():
        times = [wall_s(command) for _ in range(runs)]
        print(f"{name:<16} {statistics.median(times):>9.3f} {min(times):>7.3f} {max(times):>7.3f}")


if __name__ == "__main__":
    main()
