"""Run a few of a release's own functions without importing their module.

`vllm/benchmarks/serve.py` and `datasets.py` import the whole engine (LoRA layers, CUDA ops);
the sampling and timing code this package mirrors is plain Python over numpy. `release_code`
takes the named top-level functions / classes from the file's source (by AST), and executes
just those in a namespace holding the names they use: the release's code, unchanged."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any


def release_code(path: Path, names: tuple[str, ...], namespace: dict[str, Any]) -> dict[str, Any]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    picked = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.name in names
    ]
    assert sorted(n.name for n in picked) == sorted(names), f"{path} lacks one of {names}"
    module = ast.Module(body=picked, type_ignores=[])
    exec(compile(module, str(path), "exec"), namespace)  # noqa: S102 - the release's own code
    return namespace
