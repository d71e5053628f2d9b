"""The optional compiled core: which modules mypyc compiles, and which copy `import sim` uses.

kvsim is pure Python. `python scripts/build_native.py` compiles the modules in `COMPILED` (the
schedulers, the four designs' KV managers, the auditor; not the engine loop, the records or
the step-time model) with mypyc into extension modules next to their sources; the same code,
type-checked and translated to C, about 2x as fast on a whole-trace replay
(`benchmarks/replay_azure.py --pair`: 3.3 vs 6.4 s on v0-v2, 2.8 vs 5.7 s on v1-engine). The
sources stay the reference: every test runs on them, and the tables of a compiled run are
byte-identical (CI runs the whole suite on both; `tests/test_native.py`).

Which copy is used, decided once when `sim` is imported (`select`):

* no build (no manifest next to this file): the sources, as always;
* a build whose manifest matches the sources byte for byte: the compiled modules;
* a build older than a source (a module edited since): the sources, with one warning on stderr;
  a compiled module is never used with a source that says something else;
* ``KVSIM_NATIVE=0`` in the environment: the sources, whatever is built.

It is all or nothing: the compiled modules call each other directly, so a mix of compiled and
source copies of the core is never loaded.

    >>> from sim import native
    >>> native.selected() in set(native.Selection)
    True
"""

from __future__ import annotations

import enum
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

#: The modules mypyc compiles (`scripts/build_native.py`). Left out on purpose:
#: `sim.kv.v1_engine.free_queue` (its queues subclass OrderedDict and deque, which native
#: classes cannot) and `sim.scheduler.v1.release` (frozen dataclasses over an ABC, which mypyc
#: 2.4 cannot build; called once per admission, not per block).
COMPILED: tuple[str, ...] = (
    "sim.audit.auditor",
    "sim.audit.base",
    "sim.audit.in_flight",
    "sim.audit.liveness",
    "sim.audit.v0",
    "sim.audit.v1",
    "sim.audit.violations",
    "sim.kv.pin_behaviours",
    "sim.kv.pins",
    "sim.kv.types",
    "sim.kv.v0_fixed.manager",
    "sim.kv.v0_v1.manager",
    "sim.kv.v0_v1.access",
    "sim.kv.v0_v1.alloc",
    "sim.kv.v0_v1.evictor",
    "sim.kv.v0_v1.hashing",
    "sim.kv.v0_v1.queries",
    "sim.kv.v0_v2.block_table",
    "sim.kv.v0_v2.cpu_gpu",
    "sim.kv.v0_v2.evictor",
    "sim.kv.v0_v2.manager",
    "sim.kv.v0_v2.naive",
    "sim.kv.v0_v2.prefix_caching",
    "sim.kv.v0_v2.trackers",
    "sim.kv.v1_engine.admission",
    "sim.kv.v1_engine.block_pool",
    "sim.kv.v1_engine.chunked_local",
    "sim.kv.v1_engine.coordinator",
    "sim.kv.v1_engine.decode_shortcuts",
    "sim.kv.v1_engine.free_order",
    "sim.kv.v1_engine.full_variants",
    "sim.kv.v1_engine.hybrid_coordinator",
    "sim.kv.v1_engine.hybrid_layout",
    "sim.kv.v1_engine.mamba",
    "sim.kv.v1_engine.mamba_checkpoint",
    "sim.kv.v1_engine.manager",
    "sim.kv.v1_engine.pool_queries",
    "sim.kv.v1_engine.single_type",
    "sim.scheduler.budget",
    "sim.scheduler.fast.cohort",
    "sim.scheduler.config",
    "sim.scheduler.fast.layer",
    "sim.scheduler.lifecycle",
    "sim.scheduler.v1.priority_ties",
    "sim.scheduler.request",
    "sim.scheduler.v0.scheduler",
    "sim.scheduler.v0.hooks",
    "sim.scheduler.v0.outputs",
    "sim.scheduler.fast.v0",
    "sim.scheduler.v1.scheduler",
    "sim.scheduler.fast.v1",
)

#: mypyc's shared runtime library for the group: `sim/native__mypyc.<abi>.so`.
GROUP_NAME = "sim.native"
#: Written last by the build: the source digest of every compiled module.
MANIFEST_NAME = "native_manifest.json"
#: ``KVSIM_NATIVE=0``: use the sources even where a current build exists.
ENV_SWITCH = "KVSIM_NATIVE"

_PACKAGE_DIR = Path(__file__).resolve().parent


class Selection(enum.Enum):
    """Which copy of the core this process imports."""

    #: Nothing is built: the sources.
    SOURCES = "sources"
    #: A build matching the sources: the compiled modules.
    COMPILED = "compiled"
    #: A build exists but a source changed after it: the sources (warned once).
    STALE_BUILD = "stale build, sources used"
    #: ``KVSIM_NATIVE=0``: the sources.
    DISABLED = "disabled by KVSIM_NATIVE=0, sources used"


def source_path(module: str, package_dir: Path = _PACKAGE_DIR) -> Path:
    """`sim.kv.types` -> `<package_dir>/kv/types.py`."""
    parts = module.split(".")
    if parts[0] != "sim":
        raise ValueError(f"{module!r} is not a module of sim")
    return package_dir.joinpath(*parts[1:]).with_suffix(".py")


def source_digests(
    modules: Sequence[str] = COMPILED, package_dir: Path = _PACKAGE_DIR
) -> dict[str, str]:
    """Module name -> BLAKE2b digest of its source bytes (what the manifest records)."""
    return {
        module: hashlib.blake2b(source_path(module, package_dir).read_bytes()).hexdigest()
        for module in modules
    }


def manifest_path(package_dir: Path = _PACKAGE_DIR) -> Path:
    return package_dir / MANIFEST_NAME


def decide(package_dir: Path = _PACKAGE_DIR, environ: dict[str, str] | None = None) -> Selection:
    """Which copy to import (see the module docstring); reads files, changes nothing."""
    env = os.environ if environ is None else environ
    manifest = manifest_path(package_dir)
    if not manifest.exists():
        return Selection.SOURCES
    if env.get(ENV_SWITCH, "1") == "0":
        return Selection.DISABLED
    try:
        built = json.loads(manifest.read_text())["digests"]
    except (OSError, ValueError, KeyError, TypeError):
        return Selection.STALE_BUILD  # unreadable: never trust the build
    if built != source_digests(COMPILED, package_dir):
        return Selection.STALE_BUILD
    return Selection.COMPILED


class _SourcesFirst(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' sources before the path finder finds their extensions."""

    def __init__(self, modules: Sequence[str]) -> None:
        self._modules = frozenset(modules)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._modules:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


_selected: Selection | None = None


def select() -> Selection:
    """Decide once per process (called by `import sim`) and make imports follow the decision."""
    global _selected
    if _selected is not None:
        return _selected
    _selected = decide()
    apply(_selected, sys.meta_path, sys.stderr)
    return _selected


#: What `import sim` says on stderr when it runs the sources because a build is stale.
STALE_WARNING = (
    "kvsim: the compiled core is older than its sources; running the sources "
    "(rebuild: python scripts/build_native.py, or remove it: --clean)"
)


def apply(selection: Selection, meta_path: list[Any], stderr: TextIO) -> None:
    """Make `meta_path` import the sources where `selection` says so; warn on a stale build."""
    if selection in (Selection.STALE_BUILD, Selection.DISABLED):
        meta_path.insert(0, _SourcesFirst(COMPILED))
    if selection is Selection.STALE_BUILD:
        print(STALE_WARNING, file=stderr)


def selected() -> Selection:
    """The decision `select` made for this process."""
    return select()


def loaded_compiled() -> list[str]:
    """The modules of `COMPILED` imported so far from an extension module (tests use it)."""
    return sorted(
        name
        for name in COMPILED
        if (module := sys.modules.get(name)) is not None
        and str(getattr(module, "__file__", "")).endswith(
            tuple(importlib.machinery.EXTENSION_SUFFIXES)
        )
    )
