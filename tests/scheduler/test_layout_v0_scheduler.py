"""The v0 scheduler's shape (issue #21, "Structure"): upstream's one class in one module, read
beside vLLM 0.5.4's `vllm/core/scheduler.py` method by method, with the speed layer sealed
behind the named hooks of `sim.scheduler.v0.hooks.V0Hooks`.

That the layer changes no result is proven elsewhere (tests/scheduler/test_decode_fast_path.py,
tests/scheduler/test_decode_cohort.py, tests/engine/test_engine.py); here: that the seal is where the docs say.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import sim
import sim.scheduler
from sim.audit import audited
from sim.kv import Design, KVCacheConfig, make_manager
from sim.scheduler import SchedulerConfig, V0Scheduler
from sim.scheduler.fast.v0 import V0DecodeShortcuts
from sim.scheduler.v0.hooks import NoShortcuts

SIM_DIR = Path(sim.__file__).parent
SCHEDULER_DIR = Path(sim.scheduler.__file__).parent
FAITHFUL = SCHEDULER_DIR / "v0" / "scheduler.py"
LAYER = SCHEDULER_DIR / "fast" / "v0.py"
UPSTREAM = SIM_DIR.parent / ".vllm" / "0.5.4" / "vllm" / "core" / "scheduler.py"
#: The length of 0.5.4's `vllm/core/scheduler.py` (checked against the file where installed).
UPSTREAM_LINES = 1213


def _protocol_methods(path: Path, name: str) -> set[str]:
    """The public methods a class defines, read from its source: the compiled core
    (`sim.native`) builds protocols without their functions in `vars()`."""
    tree = ast.parse(path.read_text())
    found = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return {
        n.name for n in found.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
    }


#: The hooks: every public method of the `V0Hooks` protocol.
HOOK_NAMES = _protocol_methods(SCHEDULER_DIR / "v0" / "hooks.py", "V0Hooks")
#: The only names the faithful module may import from the speed layer (`sim.scheduler.fast`).
FAST_IMPORTS = {"v0_shortcuts"}
#: The layer's own state and helpers, which the faithful module must not name.
LAYER_NAMES = {
    "_sync",
    "_refresh_touch",
    "touch_len",
    "needs_sync",
    "cohort",
    "membership",
    "order_key",
    "outsiders",
    "quiet",
    "bulk",
    "add_quiet_decode",
    "apply_quiet_decodes",
    "join_running",
    "leave_running",
    "skip_repeated_later",
    "_later_key",
    "_later_free",
    "fast_path_enabled",
    "V0DecodeShortcuts",
}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _scheduler_class() -> ast.ClassDef:
    (cls,) = [n for n in _tree(FAITHFUL).body if isinstance(n, ast.ClassDef)]
    assert cls.name == "V0Scheduler"
    return cls


def _methods(cls: ast.ClassDef) -> list[ast.FunctionDef]:
    return [n for n in cls.body if isinstance(n, ast.FunctionDef)]


def _upstream_lines() -> list[str]:
    if not UPSTREAM.exists():
        pytest.skip(f"vLLM 0.5.4 sources not installed at {UPSTREAM}")
    return UPSTREAM.read_text().splitlines()


def test_hook_set_is_small_and_named():
    assert "on_join" in HOOK_NAMES and "before_manager_call" in HOOK_NAMES
    assert len(HOOK_NAMES) <= 16
    # Both implementations provide every hook.
    for impl in (NoShortcuts, V0DecodeShortcuts):
        assert {n for n in HOOK_NAMES if not callable(getattr(impl, n, None))} == set()


def test_faithful_module_imports_only_the_hook_factory_from_the_layer():
    imported = set()
    for node in ast.walk(_tree(FAITHFUL)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "sim.scheduler.fast"
        ):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("sim.scheduler.fast") for a in node.names)
    assert imported == FAST_IMPORTS


def test_faithful_module_calls_only_hooks_on_the_layer():
    """Every use of `self.shortcuts` is a hook call (or its one assignment in `__init__`), and
    no name of the layer's own appears in the faithful module."""
    tree = _tree(FAITHFUL)
    used = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "shortcuts"
        ):
            used.add(node.attr)
    assert used <= HOOK_NAMES, used - HOOK_NAMES
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert names & LAYER_NAMES == set()
    # `shortcuts` is read only as `self.shortcuts.<hook>`.
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "shortcuts":
            parent = parents[node]
            assigned = isinstance(parent, ast.Assign) and node in parent.targets
            assert assigned or isinstance(parent, (ast.Attribute, ast.AnnAssign)), ast.unparse(
                parent
            )


def test_v0_scheduler_is_one_class_in_one_module():
    """No phase classes: `V0Scheduler` is defined once, in `v0/scheduler.py`, with no base
    class, and no other scheduler class lives in the v0 package."""
    definitions = []
    for path in SIM_DIR.rglob("*.py"):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef) and node.name == "V0Scheduler":
                definitions.append((path, node))
    assert [path for path, _ in definitions] == [FAITHFUL]
    assert definitions[0][1].bases == []
    assert inspect.getmro(V0Scheduler) == (V0Scheduler, object)
    for path in (SCHEDULER_DIR / "v0").glob("*.py"):
        classes = [n.name for n in _tree(path).body if isinstance(n, ast.ClassDef)]
        assert not [c for c in classes if "Phase" in c or "Scheduler" in c and path != FAITHFUL]


def test_layer_uses_no_private_member_of_another_object():
    """fast/v0.py reads `_x` members only on itself: nothing private of the scheduler (it
    holds no scheduler at all, only `queues`, whose one use is `running`)."""
    tree = _tree(LAYER)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not (
                node.attr.startswith("__")  # `super().__init__`
            )
        ):
            assert isinstance(node.value, ast.Name) and node.value.id == "self", ast.unparse(node)
        if isinstance(node, ast.Attribute) and node.attr == "scheduler":
            raise AssertionError(f"the layer holds the scheduler: {ast.unparse(node)}")
    queue_reads = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "queues"
    }
    assert queue_reads == {"running"}
    imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "sim.scheduler.v0.scheduler" not in imports  # no import cycle through the class


def test_faithful_module_is_no_larger_than_upstreams():
    lines = len(FAITHFUL.read_text().splitlines())
    assert lines <= UPSTREAM_LINES
    if UPSTREAM.exists():
        assert len(UPSTREAM.read_text().splitlines()) == UPSTREAM_LINES


def test_functions_are_under_60_lines():
    long = {}
    for node in ast.walk(_tree(FAITHFUL)):
        if isinstance(node, ast.FunctionDef):
            body_start = node.body[0].end_lineno if ast.get_docstring(node) else node.lineno
            assert node.end_lineno is not None and body_start is not None
            if node.end_lineno - body_start > 60:
                long[node.name] = node.end_lineno - body_start
    assert long == {}


CITATION = re.compile(r"scheduler\.py:L(\d+)(?:-(\d+))?")


def test_every_public_method_cites_upstream_lines():
    for method in _methods(_scheduler_class()):
        if method.name.startswith("_") and method.name != "__init__":
            continue
        doc = ast.get_docstring(method)
        assert doc and CITATION.search(doc), method.name


def test_public_citations_start_at_an_upstream_def():
    """Each `scheduler.py:Lx-y` names a range of 0.5.4's file that opens with a `def`."""
    upstream = _upstream_lines()
    for method in _methods(_scheduler_class()):
        for first, last in CITATION.findall(ast.get_docstring(method) or ""):
            start, end = int(first), int(last or first)
            assert 1 <= start <= end <= len(upstream), method.name
            assert upstream[start - 1].lstrip().startswith("def "), (method.name, start)


def test_methods_follow_upstreams_order():
    """The methods named after an upstream method (their docstring opens with it) come in
    the order upstream defines them."""
    upstream = _upstream_lines()
    defs = {}
    for number, line in enumerate(upstream, start=1):
        match = re.match(r"\s+def (\w+)\(", line)
        if match and match.group(1) not in defs:
            defs[match.group(1)] = number
    order = []
    for method in _methods(_scheduler_class()):
        match = re.match(r"`(?:Scheduler\.)?(\w+)`", ast.get_docstring(method) or "")
        if match and match.group(1) in defs:
            order.append((defs[match.group(1)], method.name))
    assert len(order) >= 15
    assert order == sorted(order)


def _config(fast_path: bool) -> SchedulerConfig:
    return SchedulerConfig(max_model_len=256, decode_fast_path=fast_path)


@pytest.mark.parametrize("fast_path", [False, True])
def test_hooks_are_no_ops_unless_the_fast_path_is_on(fast_path):
    manager = audited(make_manager(Design.V0_V2, KVCacheConfig(num_gpu_blocks=64, block_size=16)))
    scheduler = V0Scheduler(_config(fast_path), manager)
    expected = V0DecodeShortcuts if fast_path else NoShortcuts
    assert type(scheduler.shortcuts) is expected
    assert scheduler.use_decode_cohort(None) is fast_path
