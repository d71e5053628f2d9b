"""Compile kvsim's core with mypyc, in place, next to its sources (optional: kvsim is pure Python).

    python scripts/build_native.py           # build (~1-2 min on 2 cores); needs a C compiler
    python scripts/build_native.py --clean   # remove the build: back to the sources

`sim.native.COMPILED` lists the modules; the build type-checks them with the project's mypy
settings, translates them to C, and writes `sim/native_manifest.json` last with a digest of
each source. `import sim` uses the compiled modules only while every digest matches; after an
edit it runs the sources and says so (`sim.native`). `KVSIM_NATIVE=0` forces the sources.
Needs mypy (its mypyc): `pip install -e '.[native]'` or the test extra.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import warnings
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def built_files(root: Path) -> list[Path]:
    """Every extension module and manifest a build left under sim/ (and mypyc's build/ dir)."""
    sim_dir = root / "sim"
    found = [p for suffix in EXTENSION_SUFFIXES for p in sim_dir.rglob(f"*{suffix}")]
    manifest = sim_dir / "native_manifest.json"
    return sorted(set(found)) + ([manifest] if manifest.exists() else [])


def clean(root: Path) -> int:
    files = built_files(root)
    # The manifest goes first: a half-removed build is never taken as current.
    for path in sorted(files, key=lambda p: p.suffix != ".json"):
        path.unlink()
    shutil.rmtree(root / "build" / "native", ignore_errors=True)
    return len(files)


def build(root: Path, jobs: int) -> None:
    try:
        from mypyc.build import mypycify
    except ImportError:
        sys.exit("build_native: mypyc is not installed (pip install -e '.[native]')")
    from setuptools import setup

    sys.path.insert(0, str(root))
    from sim import native  # no compiled module is built now, so this imports the sources

    paths = [str(native.source_path(m, root / "sim").relative_to(root)) for m in native.COMPILED]
    os.chdir(root)  # mypyc names modules from paths relative to the working directory
    extensions = mypycify(
        paths, opt_level="3", group_name=native.GROUP_NAME, target_dir="build/native"
    )
    # setuptools reads pyproject.toml here too; its deprecation notes are not about this build.
    warnings.filterwarnings("ignore", module="setuptools.*")
    setup(
        name="kvsim-native",
        ext_modules=extensions,
        script_args=[
            "--quiet",
            "build_ext",
            "--inplace",
            f"--parallel={jobs}",
            "--build-temp=build/native",
        ],
    )
    digests = native.source_digests(native.COMPILED, root / "sim")
    manifest = native.manifest_path(root / "sim")
    tmp = manifest.with_suffix(".tmp")
    import json

    tmp.write_text(json.dumps({"digests": digests}, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, manifest)  # last, atomically: the build counts only once it is whole
    print(f"build_native: {len(paths)} modules compiled; manifest {manifest.relative_to(root)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="remove the build and stop")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    removed = clean(ROOT)
    if args.clean:
        print(f"build_native: removed {removed} built files; kvsim runs its sources")
        return
    build(ROOT, args.jobs)


if __name__ == "__main__":
    main()
