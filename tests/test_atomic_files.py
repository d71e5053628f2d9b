"""Single output files (sweep tables, plots, profiles, coefficients, CI reports) are written whole.

Regression: before `sim.outdir.staged_file`, `kvsim sweep`/`capacity` wrote their tables, and
`kvsim calibrate` its profile and coefficients, straight to the target path, so an interrupt or a
full disk mid-write left a truncated file under the final name.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sim import plots  # noqa: E402
from sim.outdir import OutputPathError, staged_file, write_text_atomic  # noqa: E402
from sim.planning.executor import write_table  # noqa: E402


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@settings(max_examples=25, deadline=None)
@given(old=st.text(max_size=200), new=st.text(max_size=200), fail=st.booleans())
def test_staged_file_gives_the_old_file_or_the_new_one(tmp_path_factory, old, new, fail):
    folder = tmp_path_factory.mktemp("out")
    path = folder / "table.csv"
    path.write_text(old, encoding="utf-8")
    try:
        with staged_file(path) as tmp:
            assert tmp.parent == folder and tmp.suffix == ".csv" and tmp != path
            tmp.write_text(new[: len(new) // 2], encoding="utf-8")
            if fail:
                raise KeyboardInterrupt
            tmp.write_text(new, encoding="utf-8")
    except KeyboardInterrupt:
        assert fail
    assert path.read_text(encoding="utf-8") == (old if fail else new)
    assert hidden(folder) == []


def test_staged_file_creates_the_folder_and_uses_the_umask(tmp_path):
    path = write_text_atomic(tmp_path / "a" / "b" / "x.json", "{}\n")
    assert path.read_text() == "{}\n"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600


def test_staged_file_under_a_file_is_bad_output_path(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputPathError, match="is a file, not a folder"):
        write_text_atomic(tmp_path / "f" / "x.json", "{}")


def test_interrupted_sweep_table_keeps_the_previous_one(tmp_path, monkeypatch):
    write_table(pd.DataFrame({"rate": [1.0, 2.0]}), tmp_path, "sweep")
    before = {n: (tmp_path / n).read_bytes() for n in ("sweep.csv", "sweep.parquet")}

    real_to_csv = pd.DataFrame.to_csv

    def to_csv_then_interrupt(self, path, **kw):
        real_to_csv(self.head(1), path, **kw)  # a partial file on disk ...
        raise KeyboardInterrupt  # ... then Ctrl-C

    monkeypatch.setattr(pd.DataFrame, "to_csv", to_csv_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_table(pd.DataFrame({"rate": [3.0, 4.0, 5.0]}), tmp_path, "sweep")
    assert (tmp_path / "sweep.csv").read_bytes() == before["sweep.csv"]
    assert hidden(tmp_path) == []


def test_plot_is_saved_in_the_format_of_its_name(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    png = plots.save(fig, tmp_path / "x.png")
    svg = plots.save(fig, tmp_path / "x.svg")
    plt.close(fig)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in svg.read_bytes()[:400]
    assert hidden(tmp_path) == []
