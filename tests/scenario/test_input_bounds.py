"""Bounded inputs: non-regular paths refused unopened, the scenario size cap, `kvsim step`'s
batch bounds, and replicas counted by the up-front memory check (the hostile suite's
`cases_bounds.py` drives the CLI; these pin the functions)."""

from __future__ import annotations

import os
import re
import socket
import stat
from pathlib import Path

import pytest

from sim.errors import PathError
from sim.files.inputs import (
    NotRegularFileError,
    non_regular_reason,
    read_capped_bytes,
    refuse_non_regular,
    require_folder,
    require_regular_file,
)


def _node(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))
        except PermissionError:
            pytest.skip("mknod of a character device is not permitted here")
    elif kind == "socket":
        old = Path.cwd()
        os.chdir(tmp_path)
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(path.name)
            sock.close()
        finally:
            os.chdir(old)
    elif kind == "folder":
        path.mkdir()
    return path


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("fifo", "is a FIFO (named pipe), not a regular file"),
        ("device", "is a character device, not a regular file"),
        ("socket", "is a socket, not a regular file"),
        ("folder", "is a folder, not a regular file"),
    ],
)
def test_each_non_regular_kind_is_named(tmp_path, kind, said):
    path = _node(tmp_path, kind)
    assert non_regular_reason(path) == said
    with pytest.raises(NotRegularFileError, match=f"^{re.escape(f'{path}: {said}')}$"):
        refuse_non_regular(path)
    link = tmp_path / "link.yaml"
    link.symlink_to(path)  # followed, as open() would follow it
    assert non_regular_reason(link) == said


def test_regular_and_missing_paths_pass_refuse_but_missing_fails_require(tmp_path):
    regular = tmp_path / "s.yaml"
    regular.write_text("a: 1\n")
    assert non_regular_reason(regular) is None
    refuse_non_regular(tmp_path / "missing.yaml")  # the caller says "no such file"
    require_regular_file(regular)
    with pytest.raises(PathError, match="no such file"):
        require_regular_file(tmp_path / "missing.yaml")


def test_require_folder(tmp_path):
    require_folder(tmp_path)
    with pytest.raises(PathError, match="no such directory"):
        require_folder(tmp_path / "missing")
    with pytest.raises(NotRegularFileError, match="is a FIFO .*not a folder"):
        require_folder(_node(tmp_path, "fifo"))


def test_read_capped_bytes_refuses_past_the_limit(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_capped_bytes(path, 10, lambda n: PathError(str(n))) == b"x" * 10
    with pytest.raises(PathError, match="^11$"):
        path.write_bytes(b"x" * 11)
        read_capped_bytes(path, 10, lambda n: PathError(str(n)))


def test_scenario_over_the_cap_names_the_cap_and_the_way_out(tmp_path):
    from sim.scenario.schema import MAX_SCENARIO_BYTES, ScenarioError, load_scenario

    path = tmp_path / "big.yaml"
    path.write_bytes(b"# " + b"x" * MAX_SCENARIO_BYTES)
    with pytest.raises(ScenarioError, match="more than a scenario file may have.*trace file"):
        load_scenario(path)


def test_scenario_crlf_and_bom_still_read(tmp_path):
    """Reading bytes (for the cap) keeps what read_text accepted: CRLF ends, a UTF-8 BOM."""
    from sim.scenario.schema import load_scenario
    from tests.hostile.harness import tiny

    path = tmp_path / "s.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + tiny().replace("\n", "\r\n").encode())
    assert load_scenario(path).name == "tiny"


# --------------------------------------------------------------------------- kvsim step


def test_step_counts_are_bounded_before_any_list_is_built():
    from sim.cli.step import MAX_STEP_SEQS, parse_decodes, parse_prefills
    from sim.scenario.schema import ScenarioError

    assert len(parse_decodes([f"{MAX_STEP_SEQS}x1"])) == MAX_STEP_SEQS
    with pytest.raises(ScenarioError, match="--decode .* sequences in one step"):
        parse_decodes([f"{MAX_STEP_SEQS}x1", "1x1"])
    with pytest.raises(ScenarioError, match="--prefill .* sequences in one step"):
        parse_prefills(["1x10"], already=MAX_STEP_SEQS)
    with pytest.raises(ScenarioError, match="more than the model's 100"):
        parse_decodes(["1x101"], max_context=100)
    with pytest.raises(ScenarioError, match="more than the model's 100"):
        parse_prefills(["1x51@50"], max_context=100)  # PRIOR + TOKENS
    assert parse_prefills(["1x50@50"], max_context=100) == ((50, 50),)
    with pytest.raises(ScenarioError, match="more than 18 digits"):
        parse_decodes(["1x" + "9" * 5000])  # int() itself would raise past 4300 digits


# --------------------------------------------------------------------------- replicas


def test_replicas_enter_the_pool_estimate(monkeypatch):
    import sim.memory.host
    from sim.kv.config import Design

    monkeypatch.setattr(sim.memory.host, "available_memory", lambda: (10**9, "test"))
    # 1000 blocks x 240 B = 240 kB for one replica: fits in 500 MB; x 10,000 replicas does not.
    assert sim.memory.host.check_pool_fits(Design.V0_V2, 1000, 0) is None
    said = sim.memory.host.check_pool_fits(Design.V0_V2, 1000, 0, num_replicas=10_000)
    assert said is not None and said.startswith("10000 replicas of 1000 GPU")
    # Replicas cost memory of their own, beyond their blocks.
    per_replica = sim.memory.host.REPLICA_BYTES
    assert sim.memory.host.check_pool_fits(Design.V0_V2, 1, 0, 10**9 // per_replica) is not None


def test_num_replicas_is_named_when_they_do_not_fit(monkeypatch, tmp_path):
    import sim.memory.host
    from sim.scenario.resolve import resolve
    from sim.scenario.schema import ScenarioError, load_scenario
    from tests.hostile.harness import tiny

    monkeypatch.setattr(sim.memory.host, "available_memory", lambda: (10**8, "test"))
    path = tmp_path / "s.yaml"
    path.write_text(tiny().replace("expect:", "engine: {num_replicas: 10000}\nexpect:"))
    with pytest.raises(ScenarioError, match="^engine.num_replicas: 10000 replicas of 64"):
        resolve(load_scenario(path), tmp_path)


def test_calibrate_to_measured_refuses_a_fifo_profile_in_one_line(tmp_path):
    """`python -m calibrate.to_measured PROFILE` (a calibrate input) answers as kvsim does."""
    import subprocess
    import sys

    os.mkfifo(tmp_path / "p.json")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "calibrate.to_measured", str(tmp_path / "p.json")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: profile {tmp_path / 'p.json'}: is a FIFO (named pipe), not a regular file"
    ]
