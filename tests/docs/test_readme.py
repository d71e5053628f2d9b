"""README.md and docs/*.md tell the truth to a newcomer: every example in them runs as written.

The fenced blocks of every page (README.md, then docs/*.md in name order) are extracted and run
the way a reader would run them:

* ```python blocks: saved as a script and run in a fresh interpreter from the repository root
  (so `sim.sweep` / `sim.capacity` start their worker pools from an unguarded script);
* ```bash blocks: every `kvsim ...` line (the install lines are what CI itself runs);
* ```console blocks: the `$ kvsim ...` command, whose shown output lines must appear, in order;
* ```yaml blocks: a scenario that `kvsim check` accepts and whose `expect:` holds;
* the command table: every `--flag` it names exists in that command's `--help`;
* every docs page is linked from the README, and every relative link resolves.

Commands run in a temporary folder that links the repository's `scenarios/`, `sim/` and
`examples/` (the scenarios name their traces as ``../sim/data/...``), so outputs land there, not
in the checkout. A console block may hold several `$ kvsim` commands: they run in order there.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
KVSIM = [sys.executable, "-c", "from sim.cli.main import main; main()"]


def page_blocks(language: str) -> list[tuple[str, str]]:
    """(page, body) of every fenced block of one language, page by page, in order."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        bodies = re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)
        found += [(str(page.relative_to(ROOT)), body) for body in bodies]
    return found


def blocks(language: str) -> list[str]:
    """The bodies of every page's fenced blocks of one language, in order."""
    return [body for _, body in page_blocks(language)]


def _ids(language: str) -> list[str]:
    return [f"{page}-{i}" for i, (page, _) in enumerate(page_blocks(language))]


def _env() -> dict[str, str]:
    # A wide terminal, so rich does not wrap the lines compared below; this checkout's code.
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250", "MPLBACKEND": "Agg"}


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    """A folder where the README's relative paths resolve, outputs land in tmp_path."""
    for name in ("scenarios", "sim", "examples"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    return tmp_path


def kvsim(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*KVSIM, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600
    )


def test_readme_has_the_blocks_this_test_runs() -> None:
    readme = [body for page, body in page_blocks("python") if page == "README.md"]
    assert len(readme) == 1  # the README's short example; the others live in docs/
    assert sum("sim.capacity(" in body for body in blocks("python")) == 1
    assert blocks("console") and blocks("yaml")
    assert any("kvsim " in block for block in blocks("bash"))


@pytest.mark.parametrize("index", range(len(blocks("python"))), ids=_ids("python"))
def test_readme_python_api_runs_as_a_script(tmp_path: Path, index: int) -> None:
    """test_readme_python_snippet_as_a_script: the pool used to break on an unguarded script."""
    source = blocks("python")[index]
    assert 'if __name__ == "__main__"' not in source  # the point: it runs without the guard
    script = tmp_path / "readme_example.py"
    script.write_text(source, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    if "sim.capacity(" not in source:
        return
    # The capacity example answers something: a positive rate inside its own interval.
    match = re.search(
        r"([\d.]+) req/s per replica \(95% interval ([\d.]+)-([\d.]+); ok\)", done.stdout
    )
    assert match, done.stdout
    mean, low, high = map(float, match.groups())
    assert 0 < low <= mean <= high
    # The SLO no rate meets is reported with its reason, not as a bare zero.
    assert "fails at the minimum scale 0.1: ttft_p99" in done.stdout
    assert "at any load" in done.stdout


def _kvsim_lines(block: str) -> list[list[str]]:
    """Each `kvsim ...` command of a bash block (commands joined by && are split)."""
    commands = []
    for line in block.splitlines():
        for part in line.split("&&"):
            words = shlex.split(part)
            if words and words[0] == "kvsim":
                commands.append(words[1:])
    return commands


def test_readme_bash_kvsim_commands_run(workdir: Path) -> None:
    commands = [c for block in blocks("bash") for c in _kvsim_lines(block)]
    assert ["run"] in commands  # the default scenario; the other lines install and test
    for args in commands:
        done = kvsim([*args, "--no-plots"], workdir)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "outputs written to runs/" in done.stdout


def _console_steps(block: str) -> list[tuple[list[str], list[str]]]:
    """A console block's `$ kvsim ...` commands, each with the lines shown under it."""
    steps: list[tuple[list[str], list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            assert line.startswith("$ kvsim "), line
            steps.append((shlex.split(line.removeprefix("$ kvsim ")), []))
        else:
            assert steps, f"a console block starts with its command: {line!r}"
            steps[-1][1].append(line)
    return steps


@pytest.mark.parametrize("index", range(len(blocks("console"))), ids=_ids("console"))
def test_readme_console_output_is_what_kvsim_prints(workdir: Path, index: int) -> None:
    """Each console block (the 4-vs-3 run, `kvsim step`, `kvsim disagg`, import-vllm / bench
    serve / compare-bench): its commands, run in order in one folder, and every line each shows,
    in that order (`kvsim run` without plots)."""
    for args, shown in _console_steps(blocks("console")[index]):
        done = kvsim([*args, "--no-plots"] if args[0] == "run" else args, workdir)
        assert done.returncode == 0, done.stderr[-3000:]
        printed = [line.rstrip() for line in done.stdout.splitlines()]
        at = 0
        for line in (line.rstrip() for line in shown if line.strip() != "..."):
            assert line in printed[at:], f"README shows {line!r}; kvsim printed:\n{done.stdout}"
            at = printed.index(line, at) + 1
        # The "next" commands it prints work as printed: shrink, then check the minimal scenario.
        for line in shown:
            if line.strip().startswith(("kvsim shrink", "kvsim check")):
                step = kvsim(shlex.split(line.strip())[1:], workdir)
                assert step.returncode == 0, (line, step.stdout, step.stderr)


@pytest.mark.parametrize("index", range(len(blocks("yaml"))), ids=_ids("yaml"))
def test_readme_scenario_yaml_is_valid_and_its_expect_holds(tmp_path: Path, index: int) -> None:
    path = tmp_path / "readme_scenario.yaml"
    path.write_text(blocks("yaml")[index], encoding="utf-8")
    done = kvsim(["check", str(path)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _table_commands() -> list[tuple[str, list[str]]]:
    """(command, flags) for each `kvsim COMMAND ...` in a command table of any page."""
    found = []
    lines = [line for page in PAGES for line in page.read_text(encoding="utf-8").splitlines()]
    for line in lines:
        if not line.startswith("| `kvsim "):
            continue
        usage = line.split("|")[1]
        # A command and, for a group (`kvsim bench serve`), its subcommand.
        for code in re.findall(r"`kvsim ([\w-]+(?: [a-z][\w-]*)?)([^`]*)`", usage):
            found.append((code[0], re.findall(r"--[a-z][a-z-]*", code[1])))
    return found


def test_readme_command_table_names_real_commands_and_flags() -> None:
    from typer.testing import CliRunner

    from sim.cli.main import app

    table = _table_commands()
    assert {name for name, _ in table} >= {"run", "check", "fuzz", "shrink", "sweep", "capacity"}
    runner = CliRunner()
    for name, flags in table:
        help_text = runner.invoke(app, [*name.split(), "--help"], env={"COLUMNS": "250"})
        assert help_text.exit_code == 0, (name, help_text.output)
        for flag in flags:
            assert flag in help_text.output, f"kvsim {name} has no {flag}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)[#)]", README.read_text(encoding="utf-8")))
    assert linked == {str(page.relative_to(ROOT)) for page in PAGES[1:]}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    """Every [text](path) to a file of this repository names one that exists."""
    for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
        assert (page.parent / target).exists(), f"{page.name} links {target}, which is missing"


def _listed_packages() -> set[str]:
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `(sim/[\w/]+)/` \|", text, flags=re.M))


def test_layout_page_lists_every_package_and_only_real_ones() -> None:
    """docs/layout.md has one row per package under sim/ (a folder with an __init__.py, or data)."""
    packages = {str(init.parent.relative_to(ROOT)) for init in (ROOT / "sim").rglob("__init__.py")}
    assert _listed_packages() == (packages - {"sim"}) | {"sim/data"}
