"""Every option `vllm serve` registers at a pinned release is in kvsim's table and classified.

The option strings are read from the release's source by AST (`source_ast`), not imported and
not typed here; `sim/data/vllm_serve_flags/<v>.json` (written from the real parser by
scripts/vllm_serve_flags.py) must hold exactly those options, and every `dest` must be in
exactly one class of `sim.vllm_bench.flags`.
"""

from __future__ import annotations

import pytest

from sim.vllm_bench import flags
from sim.vllm_bench.flags import FlagClass, flag_class, serve_options
from tests.harness.vllm_install import root_or_skip
from tests.vllm_bench.source_ast import serve_option_strings

CLASSES = (flags.MODELLED, flags.NO_EFFECT, flags.SPECULATIVE, flags.UNMODELLED)


@pytest.mark.parametrize("version", flags.RELEASES)
def test_the_table_holds_exactly_the_options_the_release_source_registers(version: str) -> None:
    declared = serve_option_strings(root_or_skip(version), version)
    rows = serve_options(version)
    in_table = {s for row in rows for s in (*row.options, *row.negative)}
    assert declared - in_table == set()  # an option of the source kvsim would not parse
    # A row none of whose spellings the source declares would be an option vLLM lacks.
    assert [row.dest for row in rows if not set(row.options) & declared] == []


@pytest.mark.parametrize("version", flags.RELEASES)
def test_every_option_the_release_source_registers_is_classified(version: str) -> None:
    declared = serve_option_strings(root_or_skip(version), version)
    by_string = {
        s: row.dest for row in serve_options(version) for s in (*row.options, *row.negative)
    }
    unclassified = sorted(s for s in declared if flag_class(by_string[s]) is None)
    assert unclassified == []


@pytest.mark.parametrize("version", flags.RELEASES)
def test_every_option_of_the_committed_table_is_classified(version: str) -> None:
    """Without vLLM installed: a row of a committed table with no class would be imported
    without anyone having decided what it does (a new option must be classified first)."""
    assert [row.dest for row in serve_options(version) if flag_class(row.dest) is None] == []


def test_a_table_is_committed_for_each_release_and_only_for_them() -> None:
    from importlib import resources

    folder = resources.files("sim.data").joinpath("vllm_serve_flags")
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))
    assert names == sorted(f"{v}.json" for v in flags.RELEASES)


def test_each_dest_is_in_exactly_one_class() -> None:
    for a in range(len(CLASSES)):
        for b in range(a + 1, len(CLASSES)):
            assert CLASSES[a] & CLASSES[b] == frozenset()


def test_no_class_names_a_dest_that_no_release_has() -> None:
    known = {row.dest for v in flags.RELEASES for row in serve_options(v)}
    assert set().union(*CLASSES) - known == set()


def test_every_modelled_option_has_a_field() -> None:
    from sim.vllm_bench.importer import FIELD_OF

    assert flags.MODELLED - {"model"} == set(FIELD_OF)


@pytest.mark.parametrize(
    ("dest", "kind"),
    [
        ("port", FlagClass.NO_EFFECT),
        ("api_key", FlagClass.NO_EFFECT),
        ("max_num_seqs", FlagClass.MODELLED),
        ("enforce_eager", FlagClass.UNMODELLED),
        ("speculative_config", FlagClass.SPECULATIVE),
        ("enable_bf16x3_router_gemm", FlagClass.UNMODELLED),  # only 0.26.0 has it
    ],  # fmt: skip
)
def test_classes_of_familiar_options(dest: str, kind: FlagClass) -> None:
    assert flag_class(dest) is kind


def test_an_unknown_release_is_bad_input() -> None:
    from sim.errors import InputError

    with pytest.raises(InputError, match="0.11.0, 0.19.1, 0.20.0, 0.25.1, 0.26.0, 0.33.0 only"):
        serve_options("0.9.9")


def test_the_readme_and_the_cli_help_list_exactly_the_releases_with_tables() -> None:
    """The releases README.md and `kvsim import-vllm --help` offer are the ones kvsim has a
    table for (a release added or dropped updates both)."""
    import re
    from pathlib import Path

    from typer.testing import CliRunner

    from sim.cli.main import app

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    (row,) = [line for line in readme.splitlines() if line.startswith("| `kvsim import-vllm")]
    (prose,) = re.findall(r"`--vllm-version` picks the release.*?\(the default\)", readme, re.S)
    help_text = CliRunner().invoke(app, ["import-vllm", "--help"], env={"COLUMNS": "250"}).output
    for text in (row, prose, help_text):
        assert set(re.findall(r"\b0\.\d+\.\d+\b", text)) == set(flags.RELEASES)
