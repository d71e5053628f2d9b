"""Single output files (sweep tables, plots, profiles, coefficients, CI reports) are written whole.

Regression: before `sim.files.outdir.staged_file`, `kvsim sweep`/`capacity` wrote their tables, and
`kvsim calibrate` its profile and coefficients, straight to the target path, so an interrupt or a
full disk mid-write left a truncated file under the final name.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sim.files.outdir import (  # noqa: E402
    OutputPathError,
    check_distinct_outputs,
    check_output_file,
    staged_file,
    write_text_atomic,
)
from sim.planning.executor import write_table  # noqa: E402
from sim.plots import run as plots  # noqa: E402


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
    # bytes, not read_text: universal newlines would read a written "\r" back as "\n"
    assert path.read_bytes().decode("utf-8") == (old if fail else new)
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


# ---------------------------------------------------------------- targets that are not files
def _null_node(path: Path) -> Path:
    """A copy of /dev/null's node (1, 3) at `path`; skips where mknod is not permitted."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD (not permitted here)")
    return path


def test_a_device_node_is_written_in_place_never_renamed_over(tmp_path):
    """Regression: `--json /dev/full` exited 0 and left /dev/full a regular file."""
    node = _null_node(tmp_path / "null")
    write_text_atomic(node, "report\n")
    assert stat.S_ISCHR(node.lstat().st_mode) and node.lstat().st_rdev == os.makedev(1, 3)
    assert hidden(tmp_path) == []


def test_a_full_device_is_an_output_path_error(tmp_path):
    try:
        os.mknod(tmp_path / "full", stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD (not permitted here)")
    with pytest.raises(OutputPathError, match="full: cannot write .No space left on device."):
        write_text_atomic(tmp_path / "full", "report\n")
    assert stat.S_ISCHR((tmp_path / "full").lstat().st_mode)


def test_a_fifo_with_no_reader_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OutputPathError, match="a FIFO with no reader"):
        write_text_atomic(tmp_path / "fifo", "report\n")
    assert stat.S_ISFIFO((tmp_path / "fifo").lstat().st_mode)


def test_a_fifo_with_a_reader_gets_the_whole_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    text = "x" * 300_000  # more than a pipe holds: the writes wait for the reader
    for _ in range(200):  # until the reader's open is counted (it blocks until a writer opens)
        try:
            write_text_atomic(fifo, text)
            break
        except OutputPathError:
            time.sleep(0.01)
    reader.join(timeout=10)
    assert got == [text.encode()] and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_nothing_reaches_a_device_when_the_writer_fails(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no reader: were anything copied in, the open would fail loudly
    with pytest.raises(KeyboardInterrupt), staged_file(fifo) as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt
    assert not Path(str(tmp)).exists()


def test_a_symlink_to_a_file_is_written_through_and_kept(tmp_path):
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "real.json").write_text("old")
    (tmp_path / "latest.json").symlink_to("reports/real.json")
    write_text_atomic(tmp_path / "latest.json", "new")
    assert os.readlink(tmp_path / "latest.json") == "reports/real.json"
    assert (tmp_path / "reports" / "real.json").read_text() == "new"
    assert hidden(tmp_path) == [] and hidden(tmp_path / "reports") == []


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.symlink_to(p.parent / "nowhere"), "a symlink to nothing"),
        (lambda p: p.mkdir(), "is a folder"),
    ],
)
def test_targets_that_cannot_hold_a_file_are_refused(tmp_path, make, message):
    make(tmp_path / "target")
    with pytest.raises(OutputPathError, match=message):
        check_output_file(tmp_path / "target")
    with pytest.raises(OutputPathError, match=message):
        write_text_atomic(tmp_path / "target", "x")


def test_a_socket_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # AF_UNIX paths are short: bind a relative name
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("sock")
    with pytest.raises(OutputPathError, match="sock: is a socket"):
        check_output_file(Path("sock"))


# ---------------------------------------------------------------- one path, two outputs
def test_one_file_for_two_options_is_refused_however_spelled(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "r").write_text("old")
    (tmp_path / "link").symlink_to("r")
    os.link(tmp_path / "r", tmp_path / "hard")
    for other in ("r", "./r", "sub/../r", str(tmp_path / "r"), "link", "hard"):
        with pytest.raises(OutputPathError, match="given to both --junit and --json"):
            check_distinct_outputs(
                {"--junit": tmp_path / "r", "--json": Path(os.path.join(tmp_path, other))}
            )
    check_distinct_outputs({"--junit": tmp_path / "r", "--json": None})
    check_distinct_outputs({"--junit": tmp_path / "a", "--json": tmp_path / "b"})


def test_an_output_that_is_an_input_is_refused(tmp_path):
    (tmp_path / "s.yaml").write_text("name: s")
    with pytest.raises(OutputPathError, match=r"-o is an input of this command"):
        check_distinct_outputs({"-o": tmp_path / "." / "s.yaml"}, [tmp_path / "s.yaml"])
