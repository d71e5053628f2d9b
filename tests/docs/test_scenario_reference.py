"""docs/scenarios.md is what scripts/scenario_reference.py renders from the schema, and it
covers the schema: every section and every field, with the `#:` comment written above it."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from sim.scenario.schema import Scenario

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "scenario_reference", ROOT / "scripts" / "scenario_reference.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _generator()


def test_committed_page_is_the_generators_output() -> None:
    committed = (ROOT / "docs" / "scenarios.md").read_text(encoding="utf-8")
    assert committed == reference.render(), "run: python scripts/scenario_reference.py"
    assert reference.main(["--check"]) == 0


def _sections(page: str) -> dict[str, str]:
    """Heading path -> the text under it."""
    parts = re.split(r"^## `([\w.]+)`\n", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.parametrize("model", list(reference.section_paths(Scenario)), ids=lambda m: m.__name__)
def test_every_field_of_every_section_is_a_row(model) -> None:
    section = _sections(reference.render())[reference.section_paths(Scenario)[model][0]]
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*)$", section, flags=re.M))
    assert list(rows) == list(model.model_fields)
    comments = reference.field_comments(model)
    for name, row in rows.items():
        # Each `#:` comment in the source is in the row, and a required field says so.
        assert reference._cell(comments.get(name, "")) in row
        assert ("| required |" in f"| {row}") == model.model_fields[name].is_required()


def test_a_section_used_twice_is_one_section_naming_both_paths() -> None:
    from sim.workload.config import LengthDist

    paths = reference.section_paths(Scenario)[LengthDist]
    assert paths[:2] == ["workload.lengths.prompt", "workload.lengths.output"]
    section = _sections(reference.render())[paths[0]]
    assert all(f"`{path}`" in section for path in paths[1:])
