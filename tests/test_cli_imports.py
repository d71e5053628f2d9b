"""`import sim.cli` (what `kvsim --help` loads) stays light: no data or plotting stack.

typer and rich are the CLI itself; pandas, pyarrow, matplotlib (and torch, never) load only in
the commands that use them. Checked in a fresh interpreter (the test process has them loaded).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("pandas", "pyarrow", "matplotlib", "torch")


def _modules_after(statement: str) -> set[str]:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("statement", ["import sim.cli", "import sim"])
def test_cli_import_loads_no_heavy_package(statement):
    loaded = _modules_after(statement)
    assert "sim" in loaded  # the subprocess imported the package under test
    assert not {name for name in loaded if name.split(".")[0] in HEAVY}


def test_the_heavy_check_sees_a_heavy_import():
    """The check above can fail: pandas loaded after the CLI shows up."""
    loaded = _modules_after("import sim.cli, pandas")
    assert "pandas" in loaded
