"""Errors reported as the right thing: bad input exit 2 (one line), a finding 1, a bug 3."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import sim.engine.run
import sim.memory.host
import sim.scenario.resolve
from sim.cli.main import EXIT_BAD_INPUT, EXIT_FINDING, EXIT_INTERNAL, EXIT_INTERRUPTED, app
from sim.errors import MAX_ERROR_CHARS, InputError, one_line
from sim.scenario.schema import ScenarioError, load_scenario
from sim.workload.errors import WorkloadError

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

TINY = """\
name: {name}
model: null
cache: {{block_size: 16, num_gpu_blocks: {blocks}, num_cpu_blocks: 0, sliding_window: null}}
scheduler: {{design: v1-engine, max_model_len: 64}}
workload:
  kind: inline
  requests:
    - {{arrival_s: 0.0, prompt_tokens: 8, output_tokens: 2}}
step_time: {{linear: {{fixed_s: 0.01}}}}
expect: {{violations: {expect}}}
"""


def tiny(tmp_path: Path, name: str = "tiny", blocks: int = 16, expect: str = "none") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(TINY.format(name=name, blocks=blocks, expect=expect))
    return path


def test_input_errors_share_one_base():
    assert issubclass(ScenarioError, InputError) and issubclass(WorkloadError, InputError)
    from sim.cli.main import INPUT_ERRORS

    assert ValueError not in INPUT_ERRORS and FileNotFoundError not in INPUT_ERRORS


# ---------------------------------------------------------------- exit codes
def test_exit_0_and_1_and_2_for_check(tmp_path):
    clean = tiny(tmp_path, "clean")
    assert runner.invoke(app, ["check", str(clean)]).exit_code == 0
    wrong = tiny(tmp_path, "wrong", expect="any")  # a clean run that expected a violation
    assert runner.invoke(app, ["check", str(wrong)]).exit_code == EXIT_FINDING
    bad = runner.invoke(app, ["run", str(tmp_path / "nope.yaml"), "--no-plots"])
    assert bad.exit_code == EXIT_BAD_INPUT and "Traceback" not in bad.output


def test_internal_value_error_is_not_bad_input(tmp_path, monkeypatch):
    """Regression: INPUT_ERRORS held ValueError, so a kvsim bug printed as "bad input, exit 2"."""

    def buggy(*args, **kwargs):
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr(sim.engine.run, "run", buggy)
    result = runner.invoke(
        app, ["run", str(tiny(tmp_path)), "--no-plots", "-o", str(tmp_path / "o")]
    )
    assert result.exit_code == EXIT_INTERNAL
    assert "Traceback" in result.stderr and "an internal invariant broke" in result.stderr
    assert "bug in kvsim" in result.stderr
    assert not (tmp_path / "o").exists()  # nothing written for a run that crashed
    assert not list(tmp_path.glob(".o.partial-*"))


def test_internal_error_in_another_command_is_exit_3(tmp_path, monkeypatch):
    import sim.planning

    def buggy(*args, **kwargs):
        raise KeyError("oops")

    monkeypatch.setattr(sim.planning, "load_base", buggy)
    result = runner.invoke(app, ["sweep", str(tiny(tmp_path)), "--set", "seed=0,1"])
    assert result.exit_code == EXIT_INTERNAL and "KeyError" in result.stderr


def test_ctrl_c_is_exit_130(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.engine.run, "run", interrupted)
    result = runner.invoke(
        app, ["run", str(tiny(tmp_path)), "--no-plots", "-o", str(tmp_path / "o")]
    )
    assert result.exit_code == EXIT_INTERRUPTED
    assert "interrupted: nothing was written" in result.stderr


def test_console_script_exit_2_is_one_line(tmp_path):
    """Through `main()` (the installed `kvsim`), not only the in-process test runner."""
    code = "import sys; from sim.cli.main import main; sys.argv = ['kvsim', *sys.argv[1:]]; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "run", str(tmp_path / "nope.yaml"), "--no-plots"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == EXIT_BAD_INPUT
    assert done.stderr.strip() == f"error: {tmp_path / 'nope.yaml'}: no such file"


# ---------------------------------------------------------------- memory
def _no_workload(*args, **kwargs):
    raise AssertionError("the pool must be refused before the workload is even loaded")


def test_pool_of_400_million_blocks_is_refused_up_front(tmp_path, monkeypatch):
    """Regression: num_gpu_blocks 400000000 was killed by the kernel after eating all memory."""
    monkeypatch.setattr(sim.memory.host, "available_memory", lambda: (16 << 30, "MemAvailable"))
    monkeypatch.setattr(sim.scenario.resolve, "load_workload", _no_workload)
    path = tiny(tmp_path, blocks=400_000_000)
    result = runner.invoke(app, ["run", str(path), "--no-plots", "-o", str(tmp_path / "o")])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "cache.num_gpu_blocks: 400000000 GPU blocks need about 152 GB" in line
    assert "v1-engine block objects (380 B each)" in line and "17.2 GB" in line


def test_pool_of_1e12_blocks_is_refused_up_front(tmp_path, monkeypatch):
    """Regression: 1e12 blocks gave a MemoryError traceback. No machine has 380 TB."""
    monkeypatch.setattr(sim.scenario.resolve, "load_workload", _no_workload)
    path = tiny(tmp_path, blocks=10**12)
    result = runner.invoke(app, ["run", str(path), "--no-plots", "-o", str(tmp_path / "o")])
    assert result.exit_code == EXIT_BAD_INPUT and "Traceback" not in result.output
    assert "1000000000000 GPU blocks need about 3.8e+05 GB" in result.stderr


def test_pool_estimate_counts_cpu_blocks_only_for_v0(monkeypatch):
    from sim.kv.config import Design

    monkeypatch.setattr(sim.memory.host, "available_memory", lambda: (2_000, "test"))
    # v0-v2: (3 + 2) blocks x 240 B = 1200 B > half of 2000 B; v1-engine has no CPU pool.
    assert "3 GPU + 2 CPU blocks" in sim.memory.host.check_pool_fits(Design.V0_V2, 3, 2)
    assert sim.memory.host.check_pool_fits(Design.V0_V2, 2, 2) is None  # 960 B
    assert sim.memory.host.check_pool_fits(Design.V1_ENGINE, 2, 10**9) is None  # 760 B


# ---------------------------------------------------------------- error text
@given(st.text())
def test_one_line_is_one_short_line(text):
    line = one_line(text)
    assert "\n" not in line and "\r" not in line and len(line) <= MAX_ERROR_CHARS


def test_big_headerless_trace_error_is_capped(tmp_path):
    """Regression: a 10 MB file without a header printed its whole first line as the error."""
    row = ",".join(str(i % 997) for i in range(20_000)) + "\n"
    trace = tmp_path / "headerless.csv"
    trace.write_text(row * (10_000_000 // len(row) + 1))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "model: null\nscheduler: {max_model_len: 64}\ncache: {num_gpu_blocks: 16}\n"
        "step_time: {linear: {fixed_s: 0.01}}\n"
        "workload: {kind: trace, path: headerless.csv}\n"
    )
    result = runner.invoke(app, ["run", str(scenario), "--no-plots", "-o", str(tmp_path / "o")])
    assert result.exit_code == EXIT_BAD_INPUT
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and line.endswith("…")
    assert len(line) <= len("error: ") + MAX_ERROR_CHARS
    assert "headerless.csv:1: column 'arrival_s': missing required column" in line


# ---------------------------------------------------------------- YAML and --slo
def test_duplicate_yaml_keys_are_refused(tmp_path):
    """Regression: `num_gpu_blocks` given twice silently took the last value."""
    path = tmp_path / "dup.yaml"
    path.write_text(TINY.format(name="dup", blocks=16, expect="none") + "name: other\n")
    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    assert str(error.value) == (f"{path}:11: invalid YAML: duplicate key 'name' (first on line 1)")
    nested = tmp_path / "nested.yaml"
    nested.write_text("cache:\n  num_gpu_blocks: 10\n  num_gpu_blocks: 20\n")
    result = runner.invoke(app, ["run", str(nested), "--no-plots"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "nested.yaml:3: invalid YAML: duplicate key 'num_gpu_blocks'" in result.stderr


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    path = tmp_path / "merge.yaml"
    text = TINY.format(name="merge", blocks=16, expect="none")
    text = text.replace(
        "cache: {block_size: 16,", "base: &b {block_size: 8}\ncache: {<<: *b, block_size: 16,"
    )
    path.write_text(text)
    with pytest.raises(ScenarioError, match="unknown key 'base'"):  # parsed; the schema speaks
        load_scenario(path)


# ---------------------------------------------------------------- check reports
def test_check_with_a_bad_scenario_still_writes_the_reports(tmp_path):
    """Regression: one bad file in `kvsim check DIR` meant no JUnit and no JSON at all."""
    folder = tmp_path / "scenarios"
    folder.mkdir()
    tiny(folder, "a-good")
    (folder / "b-bad.yaml").write_text("name: [unclosed\n")
    junit, report = tmp_path / "junit.xml", tmp_path / "check.json"
    result = runner.invoke(
        app, ["check", str(folder), "--junit", str(junit), "--json", str(report)]
    )
    assert result.exit_code == EXIT_BAD_INPUT  # bad input wins over pass / fail
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "b-bad.yaml:2: invalid YAML" in line
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("2", "1", "0")
    error = suite.find("testcase[@name='b-bad']/error")
    assert error is not None and error.get("type") == "BadInput"
    assert "invalid YAML" in error.get("message")
    data = json.loads(report.read_text())
    assert (data["exit_code"], data["num_passed"], data["num_bad_input"]) == (2, 1, 1)
    assert [s["status"] for s in data["scenarios"]] == ["passed", "bad_input"]


def test_check_report_path_is_checked_before_running(tmp_path, monkeypatch):
    import sim.ci.check

    monkeypatch.setattr(sim.ci.check, "check_paths", _no_workload)
    result = runner.invoke(app, ["check", str(tiny(tmp_path)), "--junit", str(tmp_path)])
    assert result.exit_code == EXIT_BAD_INPUT and "is a folder; give a file name" in result.stderr


def test_setup_vllm_has_no_machine_specific_default():
    """Regression: the wheel folder defaulted to one machine's /work/vllm-src/wheels."""
    script = (ROOT / "scripts" / "setup_vllm.sh").read_text()
    assert 'WHEEL_DIR="${VLLM_WHEEL_DIR:-}"' in script
    assert "/work/" not in script


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["capacity", "{s}", "--slo", "ttft_p99=1s", "--seeds", "0,x"], "'x' is not an integer"),
        (["capacity", "{s}", "--slo", "ttft_p99=1s", "--tolerance", "2"], "--tolerance 2.0"),
        (["capacity", "{s}", "--slo", "ttft_p99=1s", "--target-rate", "0"], "--target-rate"),
        (["capacity", "{s}", "--slo", "ttft_p99"], "expected METRIC=DURATION"),
        (["sweep", "{s}", "--set", "seed=0", "--set", "seed=1"], "given twice"),
        (["run", "{s}", "--set", "cache"], "expected KEY=VALUE"),
        (["fuzz", "--budget", "soon"], "--budget 'soon'"),
        (["verify", "--design", "v9"], "--design 'v9'"),
        (["verify", "--vllm-root", "{s}.missing"], "no vllm package under"),
        (["plot", "{s}"], "is a regular file, not a folder"),
        (["plot", "{s}.missing"], "no such directory"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(tmp_path, args, message):
    scenario = str(tiny(tmp_path))
    result = runner.invoke(app, [a.format(s=scenario) for a in args])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line


@pytest.mark.parametrize("design", ["v0-v1", "v0-v2", "v0-fixed", "v1-engine"])
def test_bytes_per_block_bound_what_a_pool_takes(design):
    """The refusal is only as good as its estimate: building a pool stays within it."""
    from sim.kv.config import Design
    from sim.memory.host import peak_bytes_per_block

    for prefix_caching in (False, True):
        for cpu in (False, True):
            measured = peak_bytes_per_block(Design(design), 20_000, prefix_caching, cpu=cpu)
            assert measured <= sim.memory.host.BYTES_PER_BLOCK[Design(design)]


def test_output_piped_into_head_is_not_an_internal_error(tmp_path):
    """Regression: `kvsim ... | head -1` printed an "internal error" traceback
    (BrokenPipeError); a reader that goes away is a closed pipe, exit 141, nothing on stderr."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = (
        "import sys; from sim.cli.main import main; "
        "sys.argv = ['kvsim', 'run', 'scenarios/swa_4_vs_3_v0_v2.yaml', '--no-plots', "
        f"'-o', {str(tmp_path / 'out')!r}]; main()"
    )
    kvsim = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**__import__("os").environ, "PYTHONPATH": str(root)},
    )
    assert kvsim.stdout is not None and kvsim.stderr is not None
    kvsim.stdout.close()  # the reader goes away before kvsim prints its summary
    stderr = kvsim.stderr.read().decode()
    assert kvsim.wait(timeout=300) == 141, stderr
    assert "internal error" not in stderr and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("design", ["v0-v1", "v0-v2", "v0-fixed", "v1-engine"])
def test_prefix_caching_with_sliding_window_on_v0_is_bad_input(tmp_path, design):
    """vLLM 0.5.4 refuses the pair at startup; kvsim said "internal error" (the v0 manager's
    ValueError). The V1 engine supports it, so that run goes through."""
    scenario = tiny(tmp_path)
    result = runner.invoke(
        app,
        ["run", str(scenario), "--no-plots", "--json", "-o", str(tmp_path / "out"),
         "--set", f"scheduler.design={design}", "--set", "cache.sliding_window=32",
         "--set", "cache.enable_prefix_caching=true"],
    )  # fmt: skip
    if design == "v1-engine":
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    lines = result.output.strip().splitlines()
    assert lines == [
        f"error: {scenario}: cache.enable_prefix_caching: vLLM's v0 engine refuses prefix caching with a "
        "sliding window (here 32 tokens); set it to false, or use scheduler.design: v1-engine"
    ]


@pytest.mark.parametrize("design", ["v0-v1", "v0-v2", "v0-fixed"])
def test_chunked_prefill_with_sliding_window_on_v0_v1_is_bad_input(tmp_path, design):
    """vLLM 0.5.4 refuses chunked prefill with a window for BlockSpaceManagerV1 only (the V2
    manager runs it); kvsim ran the pair on v0-v1."""
    scenario = tiny(tmp_path)
    result = runner.invoke(
        app,
        ["run", str(scenario), "--no-plots", "--json", "-o", str(tmp_path / "out"),
         "--set", f"scheduler.design={design}", "--set", "cache.sliding_window=32",
         "--set", "scheduler.enable_chunked_prefill=true"],
    )  # fmt: skip
    if design != "v0-v1":
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.output.strip().splitlines() == [
        f"error: {scenario}: scheduler.enable_chunked_prefill: vLLM's v0 BlockSpaceManagerV1 refuses chunked "
        "prefill with a sliding window (here 32 tokens); set it to false, or use "
        "scheduler.design: v0-v2"
    ]
