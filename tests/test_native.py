"""The optional compiled core (`sim.native`, `scripts/build_native.py`).

Two parts:
* which copy `import sim` takes (sources, a current build, a stale build, KVSIM_NATIVE=0), on a
  fake package tree: runs everywhere;
* a built core gives the same tables as the sources, byte for byte: runs where a build exists,
  and must run under KVSIM_REQUIRE_NATIVE=1 (CI's compiled tier builds first), where a missing
  or stale build fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim import native
from sim.native import COMPILED, Selection, decide, source_digests, source_path

ROOT = Path(__file__).resolve().parents[1]
REQUIRE = os.environ.get("KVSIM_REQUIRE_NATIVE") == "1"


def fake_package(tmp_path: Path) -> Path:
    """A sim/ tree with one small source per compiled module (what `decide` reads)."""
    package = tmp_path / "sim"
    for module in COMPILED:
        path = source_path(module, package)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {module}\n")
    return package


def write_manifest(package: Path, digests: dict[str, str]) -> None:
    native.manifest_path(package).write_text(json.dumps({"digests": digests}))


def test_no_build_means_sources(tmp_path):
    assert decide(fake_package(tmp_path), environ={}) is Selection.SOURCES


def test_a_current_build_is_used(tmp_path):
    package = fake_package(tmp_path)
    write_manifest(package, source_digests(COMPILED, package))
    assert decide(package, environ={}) is Selection.COMPILED


def test_editing_one_source_makes_the_whole_build_stale(tmp_path):
    package = fake_package(tmp_path)
    write_manifest(package, source_digests(COMPILED, package))
    edited = source_path(COMPILED[-1], package)
    edited.write_text(edited.read_text() + "x = 1\n")
    assert decide(package, environ={}) is Selection.STALE_BUILD


def test_a_build_of_another_module_list_is_stale(tmp_path):
    package = fake_package(tmp_path)
    write_manifest(package, source_digests(COMPILED[:-1], package))
    assert decide(package, environ={}) is Selection.STALE_BUILD


@pytest.mark.parametrize("text", ["", "{", "[]", '{"digests": 3}'])
def test_an_unreadable_manifest_is_never_trusted(tmp_path, text):
    package = fake_package(tmp_path)
    native.manifest_path(package).write_text(text)
    assert decide(package, environ={}) is Selection.STALE_BUILD


def test_kvsim_native_0_forces_the_sources(tmp_path):
    package = fake_package(tmp_path)
    write_manifest(package, source_digests(COMPILED, package))
    assert decide(package, environ={"KVSIM_NATIVE": "0"}) is Selection.DISABLED


def test_every_compiled_module_has_a_source():
    for module in COMPILED:
        assert source_path(module).is_file(), module


def _probe(env_extra: dict[str, str]) -> dict:
    """In a fresh interpreter: the selection, and which compiled modules came from extensions."""
    code = (
        "import importlib, json; from sim import native; "
        "[importlib.import_module(name) for name in native.COMPILED]; "
        "print(json.dumps({'selected': native.selected().name, "
        "'loaded': native.loaded_compiled()}))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout)


def test_kvsim_native_0_loads_no_extension_module():
    probe = _probe({"KVSIM_NATIVE": "0"})
    assert probe["loaded"] == []
    assert probe["selected"] in {"SOURCES", "DISABLED"}


built = decide() is Selection.COMPILED
needs_build = pytest.mark.skipif(
    not built and not REQUIRE,
    reason="no current compiled core (python scripts/build_native.py builds one)",
)


@needs_build
def test_a_current_build_loads_every_compiled_module():
    assert decide() is Selection.COMPILED, "KVSIM_REQUIRE_NATIVE=1 but no current build"
    probe = _probe({})
    assert probe["selected"] == "COMPILED"
    assert probe["loaded"] == sorted(COMPILED)


RUNS = [
    ("swa_4_vs_3_v0_v1", []),
    ("swa_4_vs_3_v0_v2", []),
    ("swa_4_vs_3_v0_fixed", []),
    ("swa_4_vs_3_v1_engine", []),
    ("gemma2_hybrid_v1", []),
    ("mooncake_prefix_caching", ["--set", "engine.num_replicas=2"]),
    ("mistral_azure_conv_swa", ["--set", "workload.first_n=1500"]),
    (  # v0-v1 with prefix caching: its cached allocator, evictor and set-order frees
        "mooncake_prefix_caching",
        [
            "--set",
            "workload.first_n=300",
            "--set",
            "scheduler.design=v0-v1",
            "--set",
            "scheduler.vllm_version=null",
        ],
    ),  # fmt: skip
    (
        "mistral_azure_conv_swa",
        ["--set", "workload.first_n=1500", "--set", "scheduler.design=v0-fixed"],
    ),
    (
        "mistral_azure_conv_swa",
        [
            "--set",
            "workload.first_n=1500",
            "--set",
            "scheduler.design=v1-engine",
            "--set",
            "scheduler.enable_chunked_prefill=true",
        ],
    ),
]


def _run(scenario: str, extra: list[str], out: Path, env_extra: dict[str, str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    cmd = [sys.executable, "-m", "sim.cli", "run", str(ROOT / "scenarios" / f"{scenario}.yaml")]
    cmd += ["--no-plots", "--json", "-o", str(out), *extra]
    subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)


@needs_build
@pytest.mark.parametrize(("scenario", "extra"), RUNS, ids=lambda v: v if isinstance(v, str) else "")
def test_compiled_and_sources_write_the_same_tables(tmp_path, scenario, extra):
    assert decide() is Selection.COMPILED, "KVSIM_REQUIRE_NATIVE=1 but no current build"
    _run(scenario, extra, tmp_path / "compiled", {})
    _run(scenario, extra, tmp_path / "sources", {"KVSIM_NATIVE": "0"})
    for table in ("requests.csv", "steps.csv", "violations.csv"):
        compiled = (tmp_path / "compiled" / table).read_bytes()
        assert compiled == (tmp_path / "sources" / table).read_bytes(), table


@pytest.mark.parametrize("selection", list(Selection))
def test_a_stale_or_disabled_build_imports_the_sources_and_only_stale_warns(selection):
    import io

    meta_path: list = []
    stderr = io.StringIO()
    native.apply(selection, meta_path, stderr)
    uses_sources = selection in (Selection.STALE_BUILD, Selection.DISABLED)
    assert len(meta_path) == (1 if uses_sources else 0)
    assert (stderr.getvalue() == native.STALE_WARNING + "\n") == (
        selection is Selection.STALE_BUILD
    )
    if uses_sources:
        finder = meta_path[0]
        spec = finder.find_spec("sim.kv.types", None)
        assert spec is not None and spec.origin == str(source_path("sim.kv.types"))
        assert (
            finder.find_spec("sim.engine.engine", None) is None
        )  # never compiled: the path finder's
