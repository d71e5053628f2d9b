"""sim/data/split.py: the side a new entry of a public data file takes (`assign_split`) and
the loaders' refusal of a missing or bad recorded side (`check_split`). The files' own sides
are checked in tests/benchmarks/test_serving_accuracy.py and
tests/memory/test_startup_log_split.py."""

from __future__ import annotations

import pytest

from sim.data.split import assign_split, check_split, load_split_entries
from sim.errors import InputError

SOURCE = "https://github.com/vllm-project/vllm/issues/1"


def _append(entries: list[dict], **fields) -> str:
    entry = {"source": SOURCE, "model": "llama-3.1-8b", "gpu": "h100-sxm", "tp": 1, **fields}
    entries.append({**entry, "split": assign_split(entries, entry)})
    return entries[-1]["split"]


def test_the_module_docstrings_example():
    """One setup's entries alternate from fit; the same source's next setup starts on the
    side its source has fewer of."""
    entries: list[dict] = []
    assert [_append(entries) for _ in range(3)] == ["fit", "held_out", "fit"]
    assert _append(entries, tp=2) == "held_out"


def test_a_geometry_dict_is_the_setup_of_its_name():
    """A model or GPU outside the catalog (a dict with `name`) counts with its catalog name."""
    entries: list[dict] = []
    _append(entries, gpu="rtx-4090")
    assert _append(entries, gpu={"name": "rtx-4090", "memory_gb": 24}) == "held_out"
    assert _append(entries, model={"name": "llama-3.1-8b"}, gpu={"name": "rtx-4090"}) == "fit"


def test_overall_counts_break_a_tie_between_sources():
    entries: list[dict] = []
    _append(entries)  # fit
    assert _append(entries, source="https://github.com/other/repo/issues/2") == "held_out"


@pytest.mark.parametrize("entry", [{"id": "a"}, {"id": "a", "split": "train"}])
def test_check_split_names_file_entry_and_field_in_one_line(entry):
    with pytest.raises(InputError) as info:
        check_split("logs.yaml", 3, entry, "sim.data.split.assign_split")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("logs.yaml: entry 3 (a): field split must be 'fit' or 'held_out'")


def test_a_duplicate_id_is_refused_naming_file_entry_and_field(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "logs:\n  - {id: a, split: fit}\n  - {id: b, split: held_out}\n  - {id: a, split: fit}\n",
        encoding="utf-8",
    )
    with pytest.raises(InputError, match=r"m.yaml: entry 3 \(a\): field id is a duplicate$"):
        load_split_entries("unused.yaml", "logs", path)
    path.write_text("logs:\n  - {id: a, split: fit}\n  - {id: b}\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"m.yaml: entry 2 \(b\): field split must be"):
        load_split_entries("unused.yaml", "logs", path)


def test_an_id_that_reads_as_a_number_is_refused_in_one_line(tmp_path):
    """Regression: `id: 0e0` reads as a float (kvsim's loaders take 1e5 as a number), and the
    serving table's sort by id then failed with a TypeError instead of naming the field."""
    path = tmp_path / "m.yaml"
    path.write_text("logs:\n  - {id: a, split: fit}\n  - {id: 0e0, split: held_out}\n", "utf-8")
    with pytest.raises(InputError, match=r"m.yaml: entry 2: field id must be a string, got 0.0$"):
        load_split_entries("unused.yaml", "logs", path)


def test_a_key_given_twice_in_one_entry_is_refused_naming_the_file(tmp_path):
    """The data files load with kvsim's strict YAML loader: a repeated key is an error, not a
    silent choice of the last value."""
    path = tmp_path / "m.yaml"
    path.write_text("logs:\n  - {id: a, split: fit, split: held_out}\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"m.yaml: .*duplicate key 'split'"):
        load_split_entries("unused.yaml", "logs", path)
