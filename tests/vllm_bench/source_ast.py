"""What the pinned releases' sources declare, read by AST (never imported, never typed by hand):
the `vllm serve` options (`serve_option_strings`) and `vllm bench serve`'s result keys
(`bench_result_keys`)."""

from __future__ import annotations

import ast
from pathlib import Path

#: Where each release declares `make_arg_parser` and the frontend's options.
CLI_ARGS = {
    "0.11.0": "vllm/entrypoints/openai/cli_args.py",
    "0.19.1": "vllm/entrypoints/openai/cli_args.py",
    "0.20.0": "vllm/entrypoints/openai/cli_args.py",
    "0.25.1": "vllm/entrypoints/openai/cli_args.py",
    "0.26.0": "vllm/entrypoints/openai/cli_args.py",
    "0.33.0": "vllm/entrypoints/common/cli_args.py",
}
FRONTEND_CLASSES = ("BaseFrontendArgs", "FrontendArgs")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _add_argument_strings(node: ast.AST) -> set[str]:
    """Every option string literal passed to an `add_argument(...)` call under `node`."""
    found: set[str] = set()
    for call in ast.walk(node):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "add_argument"
        ):
            for arg in call.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("-"):
                    found.add(arg.value)
    for loop in ast.walk(node):  # `for flag, kind in [("--x", str), ...]: add_argument(flag, ...)`
        if isinstance(loop, ast.For) and isinstance(loop.iter, ast.List | ast.Tuple):
            if not _add_argument_calls(loop):
                continue
            for item in loop.iter.elts:
                first = item.elts[0] if isinstance(item, ast.Tuple) else item
                if isinstance(first, ast.Constant) and str(first.value).startswith("--"):
                    found.add(first.value)
    return found


def _add_argument_calls(node: ast.AST) -> bool:
    return any(
        isinstance(c, ast.Call)
        and isinstance(c.func, ast.Attribute)
        and c.func.attr == "add_argument"
        for c in ast.walk(node)
    )


def _functions(tree: ast.Module, name: str) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]


def _frontend_fields(tree: ast.Module) -> set[str]:
    """`--field-name` for each annotated field of the frontend dataclasses (their
    `add_cli_args` registers one option per field, named after it)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in FRONTEND_CLASSES:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    name = item.target.id
                    if not name.startswith("_") and "ClassVar" not in ast.unparse(item.annotation):
                        found.add("--" + name.replace("_", "-"))
    return found


def serve_option_strings(root: Path, version: str) -> set[str]:
    """The option strings `vllm serve` registers: `EngineArgs` / `AsyncEngineArgs.add_cli_args`
    (vllm/engine/arg_utils.py), `make_arg_parser` and the frontend's fields."""
    engine = _tree(root / "vllm/engine/arg_utils.py")
    strings: set[str] = set()
    for function in _functions(engine, "add_cli_args"):
        strings |= _add_argument_strings(function)
    cli = _tree(root / CLI_ARGS[version])
    for function in _functions(cli, "make_arg_parser"):
        strings |= _add_argument_strings(function)
    return strings | _frontend_fields(cli)


def bench_result_keys(root: Path) -> dict[str, object]:
    """`vllm bench serve`'s result keys in vllm/benchmarks/serve.py: the generation result dict
    of `benchmark`, the keys `main_async` always sets (`result_json[...] = ...` at its top
    level), the per-metric key templates of `process_one_metric`, the metrics it is called
    for, and the per-request fields dropped without --save-detailed."""
    tree = _tree(root / "vllm/benchmarks/serve.py")
    (benchmark,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "benchmark"
    ]
    (main_async,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "main_async"
    ]
    result_dicts = [
        node.value
        for node in ast.walk(benchmark)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "result" for t in node.targets)
        and isinstance(node.value, ast.Dict)
    ]
    # The generation branch's dict is the one with per-token latencies.
    generation = next(d for d in result_dicts if any(
        isinstance(k, ast.Constant) and k.value == "itls" for k in d.keys))  # fmt: skip
    result_keys = [k.value for k in generation.keys if isinstance(k, ast.Constant)]
    top_level = [
        node.targets[0].slice.value
        for node in main_async.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Subscript)
        and isinstance(node.targets[0].value, ast.Name)
        and node.targets[0].value.id == "result_json"
        and isinstance(node.targets[0].slice, ast.Constant)
    ]
    (process,) = _functions(benchmark, "process_one_metric")
    templates = sorted(
        "".join(
            v.value if isinstance(v, ast.Constant) else "{}" for v in node.targets[0].slice.values
        )
        for node in ast.walk(process)
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Subscript)
        and isinstance(node.targets[0].slice, ast.JoinedStr)
    )
    metric_calls = [
        node.args[0].value
        for node in ast.walk(benchmark)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "process_one_metric"
        and isinstance(node.args[0], ast.Constant)
    ]
    detailed: list[str] = []
    for node in ast.walk(main_async):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.List):
            names = [e.value for e in node.iter.elts if isinstance(e, ast.Constant)]
            if "itls" in names:
                detailed = names
    return {"result": result_keys, "main_async": top_level, "templates": templates,
            "metrics": metric_calls, "detailed": detailed}  # fmt: skip
