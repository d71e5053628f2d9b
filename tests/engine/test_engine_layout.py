"""The engine's layout: simulated time lives in sim/engine/ only, and one step loop drives every
replica (co-located or disaggregated), so their idle, stall and livelock rules cannot drift.

The checks read the sources (ast), so a second loop or a stray `import simpy` fails here before
it changes a table.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import sim

SIM_ROOT = Path(sim.__file__).parent
ENGINE_DIR = SIM_ROOT / "engine"


@functools.cache
def _modules() -> tuple[tuple[Path, ast.Module], ...]:
    return tuple((path, ast.parse(path.read_text())) for path in sorted(SIM_ROOT.rglob("*.py")))


def _module_level_imports(tree: ast.Module) -> list[str]:
    """The modules imported by statements run at import time (not inside a def or class)."""
    found: list[str] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found.append(node.module)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    pending.append(child)
            if isinstance(node, ast.Try):
                for handler in node.handlers:
                    pending.extend(handler.body)
    return found


def _functions(tree: ast.Module) -> list[ast.FunctionDef]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]


def _calls(function: ast.FunctionDef, attribute: str) -> bool:
    """Whether `function` calls a method named `attribute` (e.g. `scheduler.schedule(...)`)."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attribute
        for node in ast.walk(function)
    )


def _is_generator(function: ast.FunctionDef) -> bool:
    return any(isinstance(node, (ast.Yield, ast.YieldFrom)) for node in ast.walk(function))


def _where(path: Path, function: ast.FunctionDef) -> str:
    return f"{path.relative_to(SIM_ROOT.parent)}::{function.name}"


def test_simpy_is_imported_at_module_level_only_inside_sim_engine():
    offenders = [
        str(path.relative_to(SIM_ROOT.parent))
        for path, tree in _modules()
        if ENGINE_DIR not in path.parents
        and any(name.split(".")[0] == "simpy" for name in _module_level_imports(tree))
    ]
    assert offenders == []


def test_the_check_sees_a_module_level_import_in_a_guarded_block():
    tree = ast.parse("try:\n    import simpy\nexcept ImportError:\n    pass\n")
    assert _module_level_imports(tree) == ["simpy"]
    assert _module_level_imports(ast.parse("def f():\n    import simpy\n")) == []


def test_exactly_one_simpy_process_calls_a_scheduler():
    """A SimPy process (a generator) that calls `schedule(...)` is a replica step loop: there
    is one, shared by `Engine` and `DisaggEngine` (two once held their own)."""
    loops = [
        _where(path, function)
        for path, tree in _modules()
        for function in _functions(tree)
        if _is_generator(function) and _calls(function, "schedule")
    ]
    assert loops == ["sim/engine/step_loop.py::run"]


def test_exactly_one_function_waits_out_a_step_and_applies_it():
    """Yielding a timeout and then `update(plan, now)` is running a step's batch: one place."""
    steps = [
        _where(path, function)
        for path, tree in _modules()
        for function in _functions(tree)
        if _calls(function, "timeout") and _calls(function, "update")
    ]
    assert steps == ["sim/engine/step_loop.py::_step"]


def test_the_livelock_cut_off_is_decided_in_the_step_loop_only():
    """Only the step loop counts empty steps against `livelock_limit` (the two engines' loops
    once had cut-offs of their own, which differed)."""
    users = [
        _where(path, function)
        for path, tree in _modules()
        for function in _functions(tree)
        if any(
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "livelock_limit"
            for node in ast.walk(function)
        )
        or any(
            isinstance(node, ast.Name) and node.id == "empty_streak" for node in ast.walk(function)
        )
    ]
    assert users == ["sim/engine/step_loop.py::run", "sim/engine/step_loop.py::_empty_step"]
