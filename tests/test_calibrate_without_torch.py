"""Without torch (the optional `calibrate` extra), tests/test_calibrate.py skips with a reason.

A plain `pip install -e '.[test]'` has no torch; collection must not fail there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_calibrate_tests_skip_with_a_reason_when_torch_is_absent(tmp_path):
    # A `torch` package that fails to import the way a missing one does, first on the path.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-o", "addopts=", "tests/test_calibrate.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    # Exit 5 is "no tests ran" (the module skipped as a whole); a collection error exits 2.
    assert result.returncode == 5 and "1 skipped" in output, output
    assert "error" not in output.lower(), output
    assert "torch is not installed" in output, output
