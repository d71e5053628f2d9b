"""Class 1, never damage what is not ours: output targets, shared paths, scenario names, locks."""

from __future__ import annotations

from tests.hostile.harness import Case, tiny

CASES: list[Case] = [
    Case(
        "outputs",
        ("run", "s.yaml", "--no-plots", "-o", "s.yaml"),
        2,
        "not a folder",
        files={"s.yaml": tiny()},
        name="run -o onto the scenario file itself",
    ),
    Case(
        "outputs",
        ("check", "s.yaml", "--junit", "d"),
        2,
        "is a folder",
        files={"s.yaml": tiny(), "d/keep.txt": "mine"},
        name="check --junit onto a folder",
    ),
    Case(
        "outputs",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        0,
        "outputs",
        files={"s.yaml": tiny()},
        outputs=("out",),
        name="run into a new folder",
    ),
]
