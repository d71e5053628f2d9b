"""Which half of a public data file a NEW entry joins: `fit` (may tune kvsim's constants) or
`held_out` (only measures their error).

The serving measurements (`vllm_serving_measurements.yaml`) and the startup logs
(`vllm_startup_logs.yaml`) record each entry's side (`split: fit | held_out`), chosen once by
`assign_split` when the entry is appended and never recomputed, so adding an entry moves no
other. (Both replaced a split by sorted-id parity, under which one inserted id moved every
later entry across.) `check_split` is the loaders' one-line refusal of a missing or bad field.
The CUDA-graph estimates keep their own id-hash rule (`sim.memory.cudagraph.split_rule`),
which is stable too.

Example: a source's entries of one setup, appended to a file whose halves are level, take
fit, held_out, fit; a second setup from the same source then starts on held_out (the source
has two fit entries against one).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from sim.errors import InputError
from sim.files.strict_yaml import load_yaml

#: The two sides, in the order the YAML files and tables name them.
SPLITS = ("fit", "held_out")


def source_key(url: str) -> str:
    """The thread or repository a source URL belongs to: host/owner/repo[/issues|pull/N].
    Example: '.../vllm/pull/9668#x' -> 'github.com/vllm-project/vllm/pull/9668'."""
    parsed = urlparse(url)
    parts = [p for p in parsed.path.split("/") if p]
    if parsed.netloc == "github.com" and len(parts) >= 2:
        if len(parts) >= 4 and parts[2] in ("issues", "pull"):
            return "/".join([parsed.netloc, *parts[:4]])
        return "/".join([parsed.netloc, *parts[:2]])
    return parsed.netloc + parsed.path


def _name(value: Any) -> str:
    """A catalog name, or the `name` of a geometry dict (a model or GPU outside the catalog)."""
    return str(value["name"] if isinstance(value, Mapping) else value)


def _strata(entry: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    """The groups `assign_split` balances, narrowest first: the entry's setup (source, model,
    GPU, TP), its source, every entry."""
    source = source_key(str(entry["source"]))
    setup = (source, _name(entry["model"]), _name(entry["gpu"]), str(entry.get("tp", 1)))
    return (setup, (source,), ())


def assign_split(before: list[dict[str, Any]], entry: Mapping[str, Any]) -> str:
    """The side a NEW entry takes, given the entries already in the file (`before`, each with
    its recorded `split`): the side with fewer entries of the same setup (source thread or
    repository, model, GPU, TP); on a tie, the side with fewer entries of the same source; then
    fewer entries overall; then `fit`. A source's second entry therefore lands opposite its
    first, so every source with two or more entries has both sides. The rule is applied once,
    when an entry is appended; the loaders read the recorded side, so adding an entry never
    moves another. Example: a source's entries in file order a1, a2, a3 of one setup -> fit,
    held_out, fit (when the file's overall counts are level before a1)."""
    for stratum in _strata(entry):
        counts = dict.fromkeys(SPLITS, 0)
        for other in before:
            if stratum in _strata(other):
                counts[str(other["split"])] += 1
        if counts["fit"] != counts["held_out"]:
            return "fit" if counts["fit"] < counts["held_out"] else "held_out"
    return "fit"


def check_split(name: str, row: int, entry: Mapping[str, Any], rule: str) -> str:
    """The entry's recorded side, or an `InputError` naming the file, the entry (1-based row
    and id) and the field. `rule`: where a new entry's side comes from, for the message.

    >>> check_split("m.yaml", 2, {"id": "a", "split": "fit"}, "assign_split")
    'fit'
    """
    side = entry.get("split")
    if side not in SPLITS:
        raise InputError(
            f"{name}: entry {row} ({entry.get('id')}): field split must be 'fit' or 'held_out' "
            f"(got {side!r}); a new entry takes {rule}'s side"
        )
    return str(side)


def load_split_entries(data_file: str, key: str, path: Path | None = None) -> list[dict[str, Any]]:
    """The entries under `key` of `sim/data/<data_file>` (or of `path`, a file of the same
    form), in file order, each with a valid recorded `split` (`check_split`) and a unique id."""
    name = str(path) if path is not None else f"sim/data/{data_file}"
    text = (
        path.read_text(encoding="utf-8")
        if path is not None
        else resources.files("sim.data").joinpath(data_file).read_text(encoding="utf-8")
    )
    # libyaml's parser (`load_yaml`): the serving file is ~2,000 lines and loaded per test,
    # and a key given twice in one entry is refused instead of silently keeping the last.
    try:
        entries: list[dict[str, Any]] = load_yaml(text)[key]
    except yaml.YAMLError as error:  # a syntax error, or a key given twice in one entry
        raise InputError(f"{name}: {' '.join(str(error).split())}") from None
    seen: set[str] = set()
    for row, entry in enumerate(entries, 1):
        check_split(name, row, entry, "sim.data.split.assign_split")
        if not isinstance(entry.get("id"), str):  # `id: 1e5` reads as a number: quote it
            raise InputError(
                f"{name}: entry {row}: field id must be a string, got {entry.get('id')!r}"
            )
        if entry.get("id") in seen:
            raise InputError(f"{name}: entry {row} ({entry.get('id')}): field id is a duplicate")
        seen.add(str(entry.get("id")))
    return entries


__all__ = ["SPLITS", "assign_split", "check_split", "load_split_entries", "source_key"]
