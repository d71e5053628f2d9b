"""docs/findings.md, "Hybrid layouts of catalog models": its Python example prints what the
page says, and the `kvsim run` it quotes runs and reports the quoted vLLM log lines."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

from sim.engine.run import resolve
from sim.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[2]
FINDINGS = ROOT / "docs" / "findings.md"


def _section() -> str:
    text = FINDINGS.read_text(encoding="utf-8")
    start = text.index("**Hybrid layouts of catalog models (issue #23 item 1)**")
    end = text.find("\n**", start + 10)
    return text[start : end if end != -1 else len(text)]


def test_the_python_example_prints_what_the_page_says():
    (code,) = re.findall(r"```python\n(.*?)```", _section(), flags=re.S)
    expected = [line.removeprefix("# ") for line in code.splitlines() if line.startswith("# ")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(FINDINGS), "exec"), {})
    assert out.getvalue().splitlines() == expected


def test_the_quoted_run_reports_the_quoted_log_lines(tmp_path):
    section = " ".join(_section().split())  # the page wraps lines
    (command,) = re.findall(r"`(kvsim run scenarios/\S+\.yaml)`", section)
    path = ROOT / command.split()[-1]
    out = subprocess.run(
        [sys.executable, "-m", "sim.cli", *command.split()[1:], "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    logged = resolve(load_scenario(path), base_dir=path.parent).inputs["vllm_kv_cache_log"]
    for line in logged:
        assert f"`{line}`" in section, line
