"""`sim/data/vllm_serve_flags/<v>.json` is what the release's real parser builds today.

Each release of `sim.vllm_bench.flags.RELEASES` (0.11.0, 0.19.1, 0.20.0, 0.25.1, 0.26.0,
0.33.0) has its `make_arg_parser` run in its own process (`scripts/vllm_serve_flags.py`; one
transformers per process), and its table must equal the committed one, arity and negative
forms included, so `kvsim import-vllm` parses as `vllm serve` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.vllm_bench.flags import RELEASES
from tests.harness.vllm_install import root_or_skip

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.vllm

PROGRAM = """
import json, runpy, sys
module = runpy.run_path("scripts/vllm_serve_flags.py")
print("TABLE " + json.dumps(module["flag_table"](sys.argv[1])))
"""


@pytest.mark.parametrize("version", RELEASES)
def test_the_committed_table_is_the_real_parsers(version: str) -> None:
    root_or_skip(version)
    # A fresh interpreter, not tests.harness.zygote: `flag_table`'s `_RealV1` puts stand-ins
    # for vLLM's compiled modules (`vllm._C`, ...) in sys.modules before its first vLLM import,
    # and the config modules read them at import; a zygote has imported them without those.
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, version],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("TABLE "))
    committed = json.loads((ROOT / f"sim/data/vllm_serve_flags/{version}.json").read_text())
    assert json.loads(line.removeprefix("TABLE ")) == committed["flags"]
