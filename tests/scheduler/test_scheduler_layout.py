"""The V1 scheduler's shape (issues #13 "Readable", #21 "Structure"): one faithful class in one
module no larger than the upstream file it mirrors, the speed layer behind a small named hook
set that is all the faithful code knows of it, and no shortcut code in the faithful modules.

That the shortcuts change no result is proven elsewhere (tests/scheduler/test_decode_fast_path.py,
tests/scheduler/test_decode_cohort.py, tests/engine/test_engine.py); here: that the seam is where the docs say.
The v0 scheduler's shape: tests/scheduler/test_layout_v0_scheduler.py.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import sim.scheduler
from sim.audit import audited
from sim.kv import Design, KVCacheConfig, make_manager
from sim.scheduler import Policy, SchedulerConfig, V1Scheduler
from sim.scheduler.fast.v1 import V1DecodeShortcuts, with_decode_shortcuts
from sim.scheduler.v1.scheduler import NoSpeedLayer, SpeedHooks

SCHEDULER_DIR = Path(sim.scheduler.__file__).parent
REPO = SCHEDULER_DIR.parent.parent

#: The faithful V1 modules: upstream's code, read line by line against the cited source.
FAITHFUL_MODULES = ["v1/scheduler", "v1/release", "v1/priority_ties"]

#: A faithful mirror of one upstream file -> that file (0.11.0) and its length in lines, the
#: most the mirror may have (`test_upstream_line_counts_are_the_installed_ones` checks them).
MIRRORS = {"v1/scheduler": ("vllm/v1/core/sched/scheduler.py", 1296)}

#: The speed layer's modules on the V1 side (`fast/v0.py` is the v0 scheduler's).
FAST_MODULES = ["fast/layer", "fast/cohort", "fast/v1"]

#: The hooks: the only names of the speed layer the faithful V1 modules may use.
HOOKS = {
    "joined",
    "left",
    "before_call",
    "after_call",
    "refusal_known",
    "refused",
    "step_done",
    "materialize",
    "use_cohort",
}

#: Names only the decode shortcuts may use (their state on `Request`, their helpers).
SHORTCUT_NAMES = {
    "touch_len",
    "needs_sync",
    "cohort",
    "membership",
    "cohort_clock",
    "cohort_event",
    "cohort_tokens",
    "order_key",
    "outsiders",
    "quiet",
    "add_quiet_decode",
    "apply_quiet_decodes",
    "bulk",
}

#: The most lines a function of a faithful module may have.
MAX_FUNCTION_LINES = 60
#: The most lines any other scheduler module may have (v0/ is checked in its own test).
MAX_MODULE_LINES = 400


def _tree(module: str) -> ast.Module:
    return ast.parse((SCHEDULER_DIR / f"{module}.py").read_text())


def _names(module: str) -> set[str]:
    """Every identifier a module's code uses (names, attributes, definitions, imports; not
    docstrings)."""
    names = set()
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _defined(module: str) -> set[str]:
    """The functions, classes and methods a module defines, dunders aside."""
    return {
        node.name
        for node in ast.walk(_tree(module))
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("__")
    }


#: What the speed layer defines: its classes, functions and methods.
FAST_NAMES = set().union(*(_defined(module) for module in FAST_MODULES))


@pytest.mark.parametrize("module", FAITHFUL_MODULES)
def test_faithful_modules_use_no_fast_layer_name_but_the_hooks(module):
    """The whitelist: `_sync`, `_refresh_touch`, `shortcuts.*`, the cohort's methods would
    all show here; a hook is the only way in."""
    assert _names(module) & FAST_NAMES <= HOOKS


def test_the_hooks_are_the_speed_hooks_protocol_and_every_one_is_used():
    protocol = {name for name, _ in inspect.getmembers(SpeedHooks) if not name.startswith("_")}
    no_op = {name for name, _ in inspect.getmembers(NoSpeedLayer) if not name.startswith("_")}
    assert protocol == no_op == HOOKS
    assert all(callable(getattr(V1DecodeShortcuts, name)) for name in HOOKS)
    assert _names("v1/scheduler") & FAST_NAMES == HOOKS  # none is dead


def test_faithful_modules_import_nothing_from_the_speed_layer():
    """Only the layer knows the scheduler (no import circle): it installs itself."""
    for module in FAITHFUL_MODULES:
        for node in ast.walk(_tree(module)):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("sim.scheduler.fast"), module


def test_the_speed_layer_reads_no_private_member_of_anything_but_itself():
    for module in FAST_MODULES:
        for node in ast.walk(_tree(module)):
            if not isinstance(node, ast.Attribute):
                continue
            private = node.attr.startswith("_") and not node.attr.endswith("__")
            if private:
                owner = node.value
                assert isinstance(owner, ast.Name) and owner.id in {"self", "cls"}, (
                    f"{module}: .{node.attr}"
                )


#: The faithful functions that use a shortcut name, and why: `_update_after_schedule` advances
#: the quiet decodes' computed tokens with the others (upstream advances every scheduled
#: request); from 0.19.1 a PRIORITY victim is un-scheduled, a quiet decode included, and
#: whether it was scheduled (it refunded tokens) decides the loop index.
SHORTCUT_USERS = {
    "v1/scheduler": {"_update_after_schedule"},
    "v1/release": {"unschedule_victim"},
    "v1/priority_ties": set(),
}


@pytest.mark.parametrize("module", FAITHFUL_MODULES)
def test_v1_faithful_code_touches_the_shortcuts_only_where_upstream_counts_them(module):
    users = set()
    for function in ast.walk(_tree(module)):
        if isinstance(function, ast.FunctionDef):
            for node in ast.walk(function):
                name = node.attr if isinstance(node, ast.Attribute) else None
                if name in SHORTCUT_NAMES:
                    users.add(function.name)
    assert users == SHORTCUT_USERS[module]


def test_v1_scheduler_is_one_class():
    classes = [node for node in _tree("v1/scheduler").body if isinstance(node, ast.ClassDef)]
    schedulers = [node.name for node in classes if node.name.endswith("Scheduler")]
    assert schedulers == ["V1Scheduler"]
    assert V1Scheduler.__bases__ == (object,)


@pytest.mark.parametrize("module", FAITHFUL_MODULES)
def test_faithful_modules_are_no_larger_than_upstream_and_have_short_functions(module):
    lines = len((SCHEDULER_DIR / f"{module}.py").read_text().splitlines())
    assert lines <= MIRRORS.get(module, ("", MAX_MODULE_LINES))[1]
    long = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(_tree(module))
        if isinstance(node, ast.FunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    }
    assert long == {}


def test_other_scheduler_modules_are_at_most_400_lines():
    mirrors = {SCHEDULER_DIR / f"{module}.py" for module in MIRRORS}
    sizes = {
        str(path.relative_to(SCHEDULER_DIR)): len(path.read_text().splitlines())
        for path in SCHEDULER_DIR.rglob("*.py")
        if path not in mirrors and "v0" not in path.relative_to(SCHEDULER_DIR).parts
    }
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_upstream_line_counts_are_the_installed_ones():
    for upstream, lines in MIRRORS.values():
        path = REPO / ".vllm" / "0.11.0" / upstream
        if not path.exists():
            pytest.skip("vLLM 0.11.0's sources are not installed under .vllm/")
        assert len(path.read_text().splitlines()) == lines


def _config(fast_path: bool, policy: Policy = Policy.FCFS) -> SchedulerConfig:
    return SchedulerConfig(max_model_len=256, decode_fast_path=fast_path, policy=policy)


def _manager():
    return audited(make_manager(Design.V1_ENGINE, KVCacheConfig(num_gpu_blocks=64, block_size=16)))


def test_v1_scheduler_alone_has_no_speed_layer():
    scheduler = V1Scheduler(_config(True), _manager())
    assert isinstance(scheduler.speed, NoSpeedLayer)
    assert scheduler.running_phase == scheduler.running_loop
    assert scheduler.use_decode_cohort(None) is False


@pytest.mark.parametrize("fast_path", [False, True])
def test_v1_running_phase_is_upstreams_unless_the_shortcuts_replace_it(fast_path):
    scheduler = with_decode_shortcuts(V1Scheduler(_config(fast_path), _manager()))
    if fast_path:
        assert isinstance(scheduler.speed, V1DecodeShortcuts)
        assert scheduler.running_phase == scheduler.speed.schedule_running
    else:
        assert isinstance(scheduler.speed, NoSpeedLayer)
        assert scheduler.running_phase == scheduler.running_loop
    assert scheduler.use_decode_cohort(None) is fast_path


def test_no_cohort_under_the_priority_policy():
    """The priority policy takes a victim anywhere in `running`: the cohort stays off, the
    fast path alone stays on."""
    scheduler = with_decode_shortcuts(V1Scheduler(_config(True, Policy.PRIORITY), _manager()))
    assert scheduler.use_decode_cohort(None) is False
    assert isinstance(scheduler.speed, V1DecodeShortcuts) and scheduler.speed.cohort is None
