"""Determinism across processes: the same scenario run under different PYTHONHASHSEED values
writes the same files, byte for byte (tables, summary, PNGs).

Running twice in one process (`tests/engine/test_engine.py`, `tests/planning/test_sweep.py`) cannot catch an
order that follows `hash(str)`: a set of strings iterated, a dict keyed by hashes of text.
Python randomizes those per process, so each run here is a fresh interpreter with its own
PYTHONHASHSEED (0, 12345 and one drawn at random, printed on failure). The scenario exercises
what hashes most: closed-loop sessions with prefix caching on two replicas under the
prefix-cache-aware router, with plots on.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = """\
name: determinism
model: null
cache: {block_size: 16, num_gpu_blocks: 256, num_cpu_blocks: 0, sliding_window: null,
        enable_prefix_caching: true}
scheduler: {design: v1-engine, max_model_len: 2048, max_num_seqs: 8}
engine: {num_replicas: 2, router: prefix_cache_aware}
workload:
  kind: sessions
  seed: 5
  sessions:
    source: synthetic
    num_sessions: 12
    arrival: {process: poisson, rate_per_s: 4.0}
    turns: {min: 2, max: 5}
    first_prompt: {kind: uniform, min_tokens: 50, max_tokens: 400}
    new_tokens: {kind: uniform, min_tokens: 10, max_tokens: 60}
    output: {kind: uniform, min_tokens: 5, max_tokens: 40}
    think_s: {kind: exponential, mean_s: 0.5}
step_time: {linear: {fixed_s: 0.005}}
"""


def _run(folder: Path, hash_seed: str) -> dict[str, bytes]:
    """`kvsim run s.yaml -o out` (plots on) in a fresh interpreter; every output file's bytes."""
    folder.mkdir()
    (folder / "s.yaml").write_text(SCENARIO)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONHASHSEED=hash_seed)
    done = subprocess.run(
        [sys.executable, "-m", "sim.cli", "run", "s.yaml", "-o", "out", "--plots"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = folder / "out"
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_outputs_are_byte_identical_across_hash_seeds(tmp_path: Path) -> None:
    seeds = ["0", "12345", str(random.randrange(1, 2**32))]
    runs = {seed: _run(tmp_path / f"hash{seed}", seed) for seed in seeds}
    first = runs[seeds[0]]
    assert any(name.endswith(".png") for name in first), sorted(first)  # plots were written
    assert "sessions.parquet" in first, sorted(first)
    for seed in seeds[1:]:
        assert sorted(runs[seed]) == sorted(first), f"PYTHONHASHSEED={seed}: other files"
        differ = [name for name in first if runs[seed][name] != first[name]]
        assert not differ, f"PYTHONHASHSEED=0 and {seed} wrote different bytes: {differ}"
