"""Running kvsim in a fresh interpreter from the repository root, as a user's shell would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: The repository root: the working directory and import path of every run.
ROOT = Path(__file__).resolve().parents[2]


def run_in_repo(*args: str) -> subprocess.CompletedProcess[str]:
    """`python ARGS...` from the repository root with this checkout first on the import path
    (so a run imports the tree under test, not an installed kvsim); output captured as text,
    the exit status left to the caller to assert."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
