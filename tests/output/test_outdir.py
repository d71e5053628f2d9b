"""Output folders: checked before the run, written whole or not at all, never interleaved."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import sim.engine.run
import sim.output.results
from sim.cli.main import EXIT_BAD_INPUT, EXIT_INTERRUPTED, app
from sim.files import lock as outdir_lock
from sim.files.lock import lock_path
from sim.files.outdir import (
    FolderBusyError,
    OutputPathError,
    commit_staging,
    folder_lock,
    staged_folder,
    start_staging,
)
from sim.scenario.schema import ScenarioError, load_scenario, name_problem
from tests.cli.test_errors import tiny

runner = CliRunner()


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _must_not_run(*args, **kwargs):
    raise AssertionError("the output path must be refused before the simulation runs")


@pytest.fixture
def old_run(tmp_path) -> Path:
    """A complete earlier run at tmp_path/out (one request)."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(tiny(tmp_path)), "--no-plots", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


# ---------------------------------------------------------------- bad output paths
def existing_file(tmp: Path) -> Path:
    (tmp / "file").write_text("x")
    return tmp / "file"


def under_a_file(tmp: Path) -> Path:
    return existing_file(tmp) / "sub"


def foreign_folder(tmp: Path) -> Path:
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("my own notes")
    return tmp / "mine"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (existing_file, "exists and is not a folder"),
        (under_a_file, "is a file, not a folder"),
        (foreign_folder, "holds no earlier run ('notes.txt', ...)"),
    ],
)
def test_bad_output_folder_is_bad_input_before_the_run(tmp_path, monkeypatch, make, message):
    out = make(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    monkeypatch.setattr(sim.engine.run, "run", _must_not_run)
    result = runner.invoke(app, ["run", str(tiny(tmp_path)), "--no-plots", "-o", str(out)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {out}: ") and message in line
    assert all(p.read_bytes() == data for p, data in before.items())  # nothing touched


def test_bad_output_folder_for_sweep_and_capacity(tmp_path):
    (tmp_path / "file").write_text("x")
    scenario = str(tiny(tmp_path))
    for args in (
        ["sweep", scenario, "--set", "cache.num_gpu_blocks=16,32", "-o", str(tmp_path / "file")],
        ["capacity", scenario, "--slo", "ttft_p99=1s", "-o", str(tmp_path / "file")],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == EXIT_BAD_INPUT, result.output
        assert "exists and is not a folder" in result.stderr


def test_unwritable_parent_is_bad_input(tmp_path):
    """Root may write anywhere, so the unwritable place is one no one can create a folder in."""
    with pytest.raises(OutputPathError, match="cannot"):
        start_staging(Path("/proc/kvsim-no-such-place/run"))


# ---------------------------------------------------------------- whole or nothing
def test_interrupted_write_leaves_the_old_run_intact(tmp_path, old_run, monkeypatch):
    """Regression: Ctrl-C while writing left an old summary.json next to new tables."""
    before = snapshot(old_run)
    real_write = sim.output.results.write_arrow_table  # how `kvsim run` writes its violations

    def write_then_interrupt(table, folder, name):
        real_write(table, folder, name)  # a new table is half-way into the temporary folder
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.output.results, "write_arrow_table", write_then_interrupt)
    path = tiny(tmp_path, "bigger", blocks=32)
    result = runner.invoke(app, ["run", str(path), "--no-plots", "-o", str(old_run)])
    assert result.exit_code == EXIT_INTERRUPTED
    assert f"interrupted: nothing was written; {old_run} is as it was" in result.stderr
    assert snapshot(old_run) == before
    assert leftovers(tmp_path) == []


def test_interrupted_api_write_result_leaves_no_new_folder(tmp_path, monkeypatch):
    result = sim.engine.run.run(tiny(tmp_path))

    def interrupt(frame, path):
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.output.results, "_write_csv", interrupt)
    with pytest.raises(KeyboardInterrupt):
        sim.output.results.write_result(result, tmp_path / "new")
    assert not (tmp_path / "new").exists() and leftovers(tmp_path) == []


def test_second_run_replaces_the_first_whole(tmp_path, old_run):
    (old_run / "stale.csv").write_text("from an older kvsim")  # e.g. a table no longer written
    path = tiny(tmp_path, "second", blocks=32)
    result = runner.invoke(app, ["run", str(path), "--no-plots", "-o", str(old_run)])
    assert result.exit_code == 0, result.output
    assert not (old_run / "stale.csv").exists()
    assert "second" in (old_run / "scenario.yaml").read_text()
    assert leftovers(tmp_path) == []  # the replaced folder is removed


def test_concurrent_commits_leave_exactly_one_whole_run(tmp_path):
    """Eight commits into one folder at once: the result is one writer's files, all of them.

    (`staged_folder` refuses a second writer while the first holds the folder's lock; the
    commit itself stays safe for writers that stage without it.)
    """
    target = tmp_path / "out"
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            staging = start_staging(target)
            for name in ("summary.json", "requests.csv", "steps.csv"):
                (staging / name).write_text(f"writer {k}")
            barrier.wait()
            commit_staging(staging, target)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    contents = {p.read_text() for p in target.iterdir()}
    assert len(contents) == 1 and len(list(target.iterdir())) == 3
    assert leftovers(tmp_path) == []


def test_commit_into_a_missing_target(tmp_path):
    staging = start_staging(tmp_path / "a" / "b")
    (staging / "summary.json").write_text("{}")
    commit_staging(staging, tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b" / "summary.json").read_text() == "{}"
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700


# ---------------------------------------------------------------- the folder's lock
def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    """Regression: two runs into one folder both said "outputs written"; one result was gone."""
    target = tmp_path / "out"
    with folder_lock(target):
        assert lock_path(target).read_text() == f"{os.getpid()}\n"
        with (
            pytest.raises(
                FolderBusyError, match=rf"out: is being written by .* \(pid {os.getpid()}\)"
            ),
            staged_folder(target),
        ):
            raise AssertionError("a second writer must not get a staging folder")
        assert not target.exists() and leftovers(tmp_path) == [".out.lock"]
    assert leftovers(tmp_path) == []  # released and removed
    with staged_folder(target) as staging:  # free again
        (staging / "summary.json").write_text("{}")
    assert (target / "summary.json").exists() and leftovers(tmp_path) == []


def test_run_into_a_held_folder_is_refused_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(sim.engine.run, "run", _must_not_run)
    out = tmp_path / "out"
    with folder_lock(out):
        result = runner.invoke(app, ["run", str(tiny(tmp_path)), "--no-plots", "-o", str(out)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line == (
        f"error: {out}: is being written by another kvsim run (pid {os.getpid()}); wait for it "
        "to finish, or give another output folder"
    )


def test_a_stale_lock_file_is_taken_over(tmp_path):
    """A run killed with SIGKILL leaves its lock file; its flock died with it."""
    lock_path(tmp_path / "out").write_text("99999999\n")
    with folder_lock(tmp_path / "out"):
        assert lock_path(tmp_path / "out").read_text() == f"{os.getpid()}\n"
    assert leftovers(tmp_path) == []


def test_a_lock_file_removed_by_its_holder_is_not_taken(tmp_path):
    """The holder unlinks the file before it unlocks: whoever locked that file locks afresh."""
    target = tmp_path / "out"
    with folder_lock(target):
        early = os.open(lock_path(target), os.O_RDWR)  # a second run opened it just before
    try:
        assert not outdir_lock._still_named(early, lock_path(target))
        with folder_lock(target):  # locks a new file, not the removed one
            assert outdir_lock._still_named(early, lock_path(target)) is False
            assert lock_path(target).exists()
    finally:
        os.close(early)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "folder"])
def test_a_lock_path_that_is_not_a_file_is_refused(tmp_path, kind):
    lock = lock_path(tmp_path / "out")
    if kind == "fifo":
        os.mkfifo(lock)  # opening it could block: refused without opening
    elif kind == "symlink":
        (tmp_path / "elsewhere").write_text("not ours")
        lock.symlink_to(tmp_path / "elsewhere")
    else:
        lock.mkdir()
    with (
        pytest.raises(FolderBusyError, match="lock path is not a regular file"),
        folder_lock(tmp_path / "out"),
    ):
        pass
    if kind == "symlink":
        assert (tmp_path / "elsewhere").read_text() == "not ours"


# ---------------------------------------------------------------- scenario names
@settings(max_examples=300, deadline=None)
@given(name=st.text(max_size=40) | st.sampled_from(["..", ".", "/abs", "a/../..", "a\\b", ""]))
def test_an_accepted_name_is_one_folder_directly_under_runs(name):
    """The invariant behind the `name` check: runs/<name> is a child of runs/, never elsewhere."""
    if name_problem(name) is None:
        target = Path("runs") / name
        assert target.parent == Path("runs") and target.name == name
        assert os.path.normpath(target) == str(target) and not name.startswith(".")


@pytest.mark.parametrize("name", ["../x", "/etc", "a/b", "a\\b", "", ".", "..", ".h", "n" * 129])
def test_a_scenario_name_outside_runs_is_refused_naming_the_field(tmp_path, name):
    """Regression: `name: ../x` or an absolute name wrote the run outside runs/."""
    path = tiny(tmp_path)
    path.write_text(path.read_text().replace("name: tiny", f"name: {json.dumps(name)}"))
    with pytest.raises(ScenarioError, match=rf"^{path}: name: .* the name is the run's folder"):
        load_scenario(path)


def test_ordinary_names_are_kept():
    for name in ("swa-4-vs-3-v0-v2", "v1.2 run", "résumé", "a..b", "n" * 128):
        assert name_problem(name) is None, name
