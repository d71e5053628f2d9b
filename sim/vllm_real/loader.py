"""Load vLLM's real block-manager modules from an install folder, without running `vllm/__init__`.

`vllm/__init__.py` imports the whole engine (CUDA ops, distributed, the OpenAI server), which
cannot run on a CPU-only machine. The block managers themselves are pure Python, so we register
a bare package object named ``vllm`` whose ``__path__`` points at the installed folder; Python
then imports only the submodules we ask for (and what they import).

An install folder (a "root") is what ``scripts/setup_vllm.sh`` makes::

    .vllm/0.5.4/vllm/...               pip install --no-deps --target .vllm/0.5.4 vllm==0.5.4
    .vllm/0.5.4/vllm-0.5.4.dist-info/  (gives the version)
    .vllm/0.11.0/_deps/...             pure-Python packages the V1-engine modules import

Only one vLLM can be loaded per process at a time (they share the module name ``vllm``);
loading a different root stashes the previous one's modules out of ``sys.modules`` (and puts
them back when that root is loaded again). Objects built from either keep working.

torch is imported here (vLLM needs it), so this module is only imported when a real manager is
actually requested; ``import sim`` never reaches it.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from sim.errors import InputError, PathError
from sim.files.inputs import refuse_non_regular, require_folder

#: Where `scripts/setup_vllm.sh` installs, relative to the repository root.
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_INSTALL_DIR = REPO_ROOT / ".vllm"
#: Name of the folder (inside a root) holding pure-Python dependencies.
DEPS_DIRNAME = "_deps"


class VllmNotAvailableError(ImportError, InputError):
    """The requested vLLM install is missing or cannot be imported (bad input: exit 2)."""


@dataclass(frozen=True, slots=True)
class VllmInstall:
    """One loaded vLLM: its folder and version string (e.g. "0.5.4")."""

    root: Path
    version: str

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return version_tuple(self.version)


def version_tuple(version: str) -> tuple[int, ...]:
    """ "0.11.0" -> (0, 11, 0); stops at the first non-numeric part ("0.5.4+cu124" -> (0, 5, 4))."""
    out: list[int] = []
    for part in version.replace("+", ".").split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def env_var_for(version: str) -> str:
    """KVSIM_VLLM_ROOT_0_5_4 for "0.5.4": lets a user point at an install elsewhere."""
    return "KVSIM_VLLM_ROOT_" + version.replace(".", "_")


def resolve_root(vllm_root: str | Path | None = None, vllm_version: str | None = None) -> Path:
    """The install folder for an explicit path, or for a version set up by the script.

    Order for a version: ``$KVSIM_VLLM_ROOT_<v>``, then ``<repo>/.vllm/<v>``.
    Raises VllmNotAvailableError saying what to run when nothing is found.
    """
    if vllm_root is None and vllm_version is None:
        raise InputError("give a vLLM install folder (vllm_root) or a version (vllm_version)")
    if vllm_root is not None:
        root = Path(vllm_root).expanduser().resolve()
        if root.exists():  # a FIFO or a file given as the install: say what it is, open nothing
            try:
                require_folder(root, "--vllm-root, a vLLM install")
            except PathError as error:
                raise VllmNotAvailableError(str(error)) from None
        if not (root / "vllm").is_dir():
            raise VllmNotAvailableError(
                f"no vllm package under {root} (expected {root}/vllm/); "
                "run scripts/setup_vllm.sh <version> to make one"
            )
        return root
    assert vllm_version is not None
    env = os.environ.get(env_var_for(vllm_version))
    candidates = ([Path(env)] if env else []) + [DEFAULT_INSTALL_DIR / vllm_version]
    for cand in candidates:
        if (cand / "vllm").is_dir():
            return cand.resolve()
    raise VllmNotAvailableError(
        f"vLLM {vllm_version} is not installed: looked in "
        + ", ".join(str(c) for c in candidates)
        + f"; run `bash scripts/setup_vllm.sh {vllm_version}` (or set {env_var_for(vllm_version)})"
    )


def read_version(root: Path) -> str:
    """Version from the install's dist-info folder name, else from vllm/version.py text."""
    for info in sorted(root.glob("vllm-*.dist-info")):
        return info.name[len("vllm-") : -len(".dist-info")]
    for name in ("version.py", "_version.py"):
        path = root / "vllm" / name
        if path.exists():
            refuse_non_regular(path)  # a FIFO would block the read forever
            for line in path.read_text().splitlines():
                if "__version__" in line and "=" in line and ("'" in line or '"' in line):
                    return line.split("=", 1)[1].strip().strip("'\"").split("'")[0]
    raise VllmNotAvailableError(f"cannot tell the vLLM version of {root}")


# Process-wide by nature: it mirrors what sys.modules["vllm"] currently is.
_loaded: dict[str, VllmInstall] = {}


#: Per-root snapshots of the ``vllm.*`` modules, so switching back never re-imports them
#: (a re-import would register vLLM's torch custom ops twice, which torch rejects).
_stashed: dict[Path, dict[str, types.ModuleType]] = {}


def _stash_vllm_modules() -> None:
    names = [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]
    current = _loaded.get("current")
    if current is not None:
        _stashed[current.root] = {n: sys.modules[n] for n in names}
    for name in names:
        del sys.modules[name]


def load_vllm(vllm_root: str | Path | None = None, vllm_version: str | None = None) -> VllmInstall:
    """Make ``import vllm.<submodule>`` resolve into the given install; return what was loaded.

    Idempotent for the same root. The compiled extensions (*.so) must have been deleted from
    the install (the setup script does it): on a CPU-only torch they crash at import, and
    without them vLLM falls back to Python and only logs a warning.
    """
    root = resolve_root(vllm_root, vllm_version)
    current = _loaded.get("current")
    if current is not None and current.root == root and "vllm" in sys.modules:
        return current
    version = read_version(root)
    if vllm_version is not None and version_tuple(version) != version_tuple(vllm_version):
        raise VllmNotAvailableError(f"{root} holds vLLM {version}, not {vllm_version}")
    leftover = sorted(p.name for p in (root / "vllm").rglob("*.so"))
    if leftover:
        raise VllmNotAvailableError(
            f"{root} still has compiled extensions ({', '.join(leftover[:3])}...), which crash "
            "on a CPU-only torch; delete them (scripts/setup_vllm.sh does)"
        )
    try:
        import torch  # noqa: F401  (vLLM needs it; fail with a clear message if absent)
    except ImportError as exc:  # pragma: no cover - torch is in the dev venv
        raise VllmNotAvailableError(
            "vLLM's modules need torch (pip install torch, CPU build)"
        ) from exc
    deps = root / DEPS_DIRNAME
    if deps.is_dir() and str(deps) not in sys.path:
        # Appended, not prepended: the project's own packages keep priority.
        sys.path.append(str(deps))
    _stash_vllm_modules()
    if root in _stashed:
        sys.modules.update(_stashed.pop(root))
        install = VllmInstall(root, version)
        _loaded["current"] = install
        return install
    # vLLM logs a warning per missing compiled op; keep the console quiet unless asked.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    pkg = types.ModuleType("vllm")
    pkg.__path__ = [str(root / "vllm")]
    pkg.__file__ = str(root / "vllm" / "__init__.py")
    pkg.__package__ = "vllm"
    pkg.__version__ = version  # type: ignore[attr-defined]
    sys.modules["vllm"] = pkg
    install = VllmInstall(root, version)
    _loaded["current"] = install
    logging.getLogger("vllm").setLevel(logging.ERROR)
    return install


def import_vllm(module: str, install: VllmInstall) -> types.ModuleType:
    """Import ``vllm.<module>`` from `install` (loading it first if another vLLM is current)."""
    load_vllm(install.root)
    try:
        return importlib.import_module(f"vllm.{module}")
    except ImportError as exc:
        raise VllmNotAvailableError(
            f"vllm.{module} from {install.root} (vLLM {install.version}) failed to import: {exc}; "
            f"run `bash scripts/setup_vllm.sh {install.version}` to install its dependencies"
        ) from exc
