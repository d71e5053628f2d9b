"""The startup logs' split (`split: fit | held_out` in sim/data/vllm_startup_logs.yaml): the
sides are recorded per entry, the benchmark and the fit read them, adding a log never moves
another (`sim.data.split.assign_split`, the serving measurements' rule), and a missing or bad
side is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sim.data.split import assign_split
from sim.errors import InputError
from sim.memory import validation as memory_validation
from sim.memory.terms import NON_TORCH_GIB, VllmEngine
from sim.memory.validation import Split, compare_all, fit_non_torch_gib, load_logs

DATA = Path(__file__).resolve().parents[2] / "sim/data/vllm_startup_logs.yaml"
RAW = yaml.safe_load(DATA.read_text(encoding="utf-8"))["logs"]
#: The logs recorded when the sorted-id parity split was retired (2026-12), first in the file.
PARITY_ERA = 25
#: The log the 25th moved into the fit half under the parity split (v0, TP 1, 1.79 GiB).
MOVED = "pr10511-llama3-8b-h100-tp1"


def _write(tmp_path: Path, entries: list[dict]) -> Path:
    path = tmp_path / "logs.yaml"
    path.write_text(yaml.safe_dump({"logs": entries}), encoding="utf-8")
    return path


def test_the_first_25_logs_keep_the_sides_sorted_id_parity_gave_them_regression():
    """Regression for the parity split (sorted by id, even positions fit), under which one
    inserted log moved MOVED to the fit half and v0's TP-1 non-torch constant 0.26 -> 0.35
    GiB: the sides were recorded as that split last gave them, so no figure moved."""
    era = RAW[:PARITY_ERA]
    order = sorted(e["id"] for e in era)
    assert len(era) == PARITY_ERA
    for entry in era:
        assert entry["split"] == ("fit" if order.index(entry["id"]) % 2 == 0 else "held_out")
    assert next(e for e in era if e["id"] == MOVED)["split"] == "fit"


def test_every_later_log_records_the_rules_side_given_the_logs_before_it():
    """The YAML header's rule for appended logs (none yet: this guards the next one)."""
    for i in range(PARITY_ERA, len(RAW)):
        assert RAW[i]["split"] == assign_split(RAW[:i], RAW[i]), RAW[i]["id"]


def test_the_benchmark_uses_the_recorded_sides():
    assert {c.log.id: c.split.value for c in compare_all()} == {e["id"]: e["split"] for e in RAW}


def test_the_fit_follows_the_recorded_side(tmp_path, monkeypatch):
    """Recording MOVED as held out gives back the v0 TP-1 constant the fit half gave before
    the 25th log (median(0.16, 0.35) -> 0.26 GiB, was 0.35) and moves it in the table."""
    entries = [{**e, "split": "held_out"} if e["id"] == MOVED else e for e in RAW]
    flipped = load_logs(_write(tmp_path, entries))
    monkeypatch.setattr(memory_validation, "load_logs", lambda: flipped)
    assert NON_TORCH_GIB[(VllmEngine.V0, False)] == 0.35
    assert fit_non_torch_gib()[(VllmEngine.V0, False)] == 0.26
    assert next(c for c in compare_all() if c.log.id == MOVED).split is Split.HELD_OUT


_NEW_LOG = st.fixed_dictionaries(
    {
        "id": st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=40),
        "source": st.sampled_from(
            [e["source"] for e in RAW] + ["https://github.com/vllm-project/vllm/issues/99999"]
        ),
        "model": st.sampled_from(["llama-3.1-8b", "qwen2.5-7b", {"name": "qwen3-235b-a22b"}]),
        "gpu": st.sampled_from(["h100-sxm", "a100-80gb-sxm", {"name": "rtx-4090"}]),
        "tp": st.sampled_from([1, 2, 4]),
    }
)


@settings(max_examples=30, deadline=None)
@given(
    new=st.lists(_NEW_LOG, min_size=1, max_size=4, unique_by=lambda e: e["id"]),
    places=st.lists(st.integers(0, 10_000), min_size=4, max_size=4),
)
def test_inserting_logs_anywhere_never_moves_another(tmp_path_factory, new, places):
    """Logs drawn and inserted one by one at any place in the file, each on the side
    `assign_split` gives it, leave every log already there on its side."""
    assume(not {e["id"] for e in new} & {e["id"] for e in RAW})
    tmp_path = tmp_path_factory.mktemp("split")
    entries = list(RAW)
    sides = {log.id: log.split for log in load_logs()}
    for drawn, place in zip(new, places, strict=False):
        log = {**RAW[0], **drawn, "split": assign_split(entries, drawn)}
        entries.insert(place % (len(entries) + 1), log)
        after = {log.id: log.split for log in load_logs(_write(tmp_path, entries))}
        assert after[drawn["id"]].value == log["split"]
        assert {k: v for k, v in after.items() if k != drawn["id"]} == sides
        sides = after


@pytest.mark.parametrize("bad", ["missing", "train", None])
def test_a_log_without_a_valid_split_is_refused_naming_file_entry_and_field(tmp_path, bad):
    entries = [dict(e) for e in RAW[:3]]
    if bad == "missing":
        del entries[1]["split"]
    else:
        entries[1]["split"] = bad
    path = _write(tmp_path, entries)
    with pytest.raises(InputError) as info:
        load_logs(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: entry 2 ({entries[1]['id']}): field split must be")
