"""examples/github-actions/kvsim-check.yml works as written in a fresh user repository.

The test builds the layout its README describes in a temporary folder (kvsim's source under
`kvsim/`, kvsim's own 4-vs-3 scenarios copied to `kvsim-scenarios/`) and runs every `run:`
step as written: the install step is checked, not run (it installs this very checkout), and
every `kvsim` step runs with this checkout's code and must pass and write its reports.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "github-actions"
WORKFLOW = EXAMPLE / "kvsim-check.yml"


def _steps() -> list[dict]:
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    (job,) = workflow["jobs"].values()
    return job["steps"]


def _run_commands() -> list[list[str]]:
    return [shlex.split(step["run"]) for step in _steps() if "run" in step]


def test_workflow_has_no_placeholders_or_unbacked_cache() -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    assert not re.search(r"YOUR-|<[A-Za-z ]+>|TODO|CHANGEME", text)
    for step in _steps():
        options = step.get("with") or {}
        if "cache" in options:
            # setup-python's pip cache needs a requirements file to key on.
            assert "cache-dependency-path" in options, step


def test_workflow_fuzz_is_deterministic() -> None:
    (fuzz,) = [c for c in _run_commands() if c[:2] == ["kvsim", "fuzz"]]
    seed = fuzz[fuzz.index("--seed") + 1]
    assert seed.isdigit(), f"--seed {seed}: a fixed integer, not a per-run value"
    assert "--max-cases" in fuzz  # a case count, not only a time budget, bounds the run


def test_setup_commands_in_the_example_readme_name_real_files() -> None:
    text = (EXAMPLE / "README.md").read_text(encoding="utf-8")
    (setup,) = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    for line in setup.splitlines():
        words = shlex.split(line)
        if words[0] == "cp":
            for source in words[1:-1]:
                pattern = source.removeprefix("kvsim/")
                assert list(ROOT.glob(pattern)), f"{source}: nothing in kvsim matches"


@pytest.fixture()
def user_repo(tmp_path: Path) -> Path:
    """The layout examples/github-actions/README.md asks for."""
    (tmp_path / "kvsim").symlink_to(ROOT, target_is_directory=True)
    scenarios = tmp_path / "kvsim-scenarios"
    scenarios.mkdir()
    for path in sorted(ROOT.glob("scenarios/swa_4_vs_3_*.yaml")):
        shutil.copy(path, scenarios / path.name)
    return tmp_path


def test_workflow_steps_run_as_written(user_repo: Path) -> None:
    commands = _run_commands()
    install, *rest = commands
    assert install[:4] == ["python", "-m", "pip", "install"]
    assert (user_repo / install[4] / "pyproject.toml").exists()
    assert [c[:2] for c in rest] == [["kvsim", "check"], ["kvsim", "fuzz"]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GITHUB_ACTIONS": "true", "COLUMNS": "200"}
    for command in rest:
        done = subprocess.run(
            [sys.executable, "-c", "from sim.cli.main import main; main()", *command[1:]],
            cwd=user_repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    reports = user_repo / "reports"
    for name in ("kvsim-junit.xml", "kvsim-check.json", "kvsim-fuzz.json"):
        assert (reports / name).stat().st_size > 0, name
