"""`import sim.cli.main` (what `kvsim --help` loads) stays light: no data or plotting stack; and
`kvsim run` loads pyarrow (it writes Parquet) but not pandas.

typer and rich are the CLI itself; pandas, pyarrow, matplotlib (and torch, never) load only in
the commands that use them. Checked in a fresh interpreter (the test process has them loaded).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pandas", "pyarrow", "matplotlib", "torch")
#: `kvsim run` needs pyarrow for its Parquet and CSV files, nothing else heavy.
HEAVY_FOR_RUN = ("pandas", "matplotlib", "torch")


def _modules_after(statement: str) -> set[str]:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("statement", ["import sim.cli.main", "import sim"])
def test_cli_import_loads_no_heavy_package(statement):
    loaded = _modules_after(statement)
    assert "sim" in loaded  # the subprocess imported the package under test
    assert not {name for name in loaded if name.split(".")[0] in HEAVY}


def test_the_heavy_check_sees_a_heavy_import():
    """The check above can fail: pandas loaded after the CLI shows up."""
    loaded = _modules_after("import sim.cli.main, pandas")
    assert "pandas" in loaded


#: What `kvsim run` loads: typer's app called as the console script calls it, in a fresh
#: interpreter, then the names of the modules loaded (main() would end the process first).
_RUN = (
    "import json, sys; from sim.cli.main import app; "
    "app(sys.argv[1:], standalone_mode=False); "
    "print(json.dumps(sorted(sys.modules)))"
)


def _modules_after_run(*args: str) -> set[str]:
    command = [sys.executable, "-c", _RUN, "run", *args, "--no-plots", "--json"]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


RUN_SCENARIOS = {
    # The built-in default: the Azure conversation trace (first 1,500 requests, read by
    # sim.workload.plain_csv), and v0-v2 violations, written and printed.
    "default_azure_trace": (),
    "inline_v1_engine": (str(ROOT / "scenarios" / "swa_4_vs_3_v1_engine.yaml"),),
}


@pytest.mark.parametrize("scenario", RUN_SCENARIOS.values(), ids=RUN_SCENARIOS.keys())
def test_kvsim_run_loads_no_pandas(tmp_path, scenario):
    """`kvsim run` writes its tables with pyarrow alone: pandas (~0.2 s) is not imported."""
    loaded = _modules_after_run(*scenario, "-o", str(tmp_path / "out"))
    assert (tmp_path / "out" / "requests.parquet").exists()  # the run ran and wrote
    assert "pyarrow" in loaded and "sim.engine.engine" in loaded
    assert not {name for name in loaded if name.split(".")[0] in HEAVY_FOR_RUN}


def test_kvsim_run_of_sessions_does_load_pandas(tmp_path):
    """The check above can fail: a multi-turn workload's `sessions` table is made by pandas."""
    scenario = str(ROOT / "scenarios" / "sessions_chat_v1.yaml")
    loaded = _modules_after_run(scenario, "-o", str(tmp_path / "out"))
    assert "pandas" in loaded
