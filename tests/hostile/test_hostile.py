"""Runs every case of `tests/hostile/cases_*.py` (see `harness.py` for what is asserted)."""

from __future__ import annotations

import importlib
import pkgutil
from collections import Counter
from pathlib import Path

import pytest

from tests.hostile import harness
from tests.hostile.harness import CLASSES, Case


def _all_cases() -> list[Case]:
    cases: list[Case] = []
    package = Path(__file__).parent
    for info in sorted(pkgutil.iter_modules([str(package)]), key=lambda m: m.name):
        if info.name.startswith("cases_"):
            module = importlib.import_module(f"tests.hostile.{info.name}")
            cases.extend(module.CASES)
    return cases


CASES = _all_cases()


def test_the_table_covers_every_class():
    counts = Counter(case.klass for case in CASES)
    assert set(counts) <= set(CLASSES), set(counts) - set(CLASSES)
    assert all(counts[klass] > 0 for klass in CLASSES), counts
    assert len(CASES) >= 300, len(CASES)
    ids = Counter(case.id for case in CASES)
    assert not [i for i, n in ids.items() if n > 1], [i for i, n in ids.items() if n > 1]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_hostile(case: Case, tmp_path: Path):
    folder = tmp_path / "case"
    folder.mkdir()
    harness.prepare(case, folder)
    before = harness.snapshot(folder, case.outputs)
    repo_runs = (
        sorted((harness.ROOT / "runs").glob("*")) if (harness.ROOT / "runs").exists() else []
    )
    argv = harness.argv_in(case, folder)
    if case.subprocess:
        answer = harness.run_in_subprocess(argv, folder, harness.timeout_of(case))
    else:
        answer = harness.run_in_process(argv, folder)
    shown = f"kvsim {' '.join(argv)}\nexit {answer.exit}\n{answer.output[-3000:]}"
    assert answer.exit == case.exit, shown
    assert "Traceback" not in answer.output, shown
    assert case.fragment.lower() in answer.output.lower(), shown
    if case.exit == 2:
        errors = harness.error_lines(answer.output)
        boxed = "Usage:" in answer.output  # typer's own usage errors are a small box
        assert boxed or len(errors) == 1, shown
    after = harness.snapshot(folder, case.outputs)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    # New files are allowed only where the case says it writes (its outputs) or under runs/.
    changed = {k for k in changed if not (k not in before and k.split("/")[0] == "runs")}
    assert not changed, f"{shown}\nchanged outside the outputs: {sorted(changed)}"
    repo_runs_after = (
        sorted((harness.ROOT / "runs").glob("*")) if (harness.ROOT / "runs").exists() else []
    )
    assert repo_runs_after == repo_runs, "wrote into the repository's runs/"
