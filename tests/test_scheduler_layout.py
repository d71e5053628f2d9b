"""The schedulers' shape (issue #13, "Readable"): upstream's phases in modules of at most ~400
lines, the decode shortcuts behind one seam, and faithful phases with no shortcut code in them.

That the shortcuts change no result is proven elsewhere (tests/test_decode_fast_path.py,
tests/test_decode_cohort.py, tests/test_engine.py); here: that the seam is where the docs say.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sim.scheduler
from sim.audit import audited
from sim.kv import Design, KVCacheConfig, make_manager
from sim.scheduler import Policy, SchedulerConfig, V0Scheduler, V1Scheduler
from sim.scheduler.fast.v1 import V1DecodeShortcuts

SCHEDULER_DIR = Path(sim.scheduler.__file__).parent

#: The faithful phases: upstream's methods, read line by line against the cited source.
FAITHFUL_MODULES = [
    "v1/running",
]

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


def _names(module: str) -> set[str]:
    """Every identifier a module's code uses (names and attributes; not docstrings)."""
    tree = ast.parse((SCHEDULER_DIR / f"{module}.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
    return names


@pytest.mark.parametrize("module", FAITHFUL_MODULES)
def test_faithful_phases_have_no_shortcut_code(module):
    assert _names(module) & SHORTCUT_NAMES == set()


def test_v1_faithful_code_touches_the_shortcuts_only_in_update_after_schedule():
    """v1.py's one use of a shortcut name: `_update_after_schedule` advances the quiet
    decodes' computed tokens with the others (upstream advances every scheduled request)."""
    tree = ast.parse((SCHEDULER_DIR / "v1" / "scheduler.py").read_text())
    users = set()
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef):
            for node in ast.walk(function):
                name = node.attr if isinstance(node, ast.Attribute) else None
                if name in SHORTCUT_NAMES:
                    users.add(function.name)
    assert users == {"_update_after_schedule"}


def test_scheduler_modules_are_at_most_400_lines():
    sizes = {
        p.name: len(p.read_text().splitlines())
        for p in SCHEDULER_DIR.rglob("*.py")
        if p != SCHEDULER_DIR / "v0" / "scheduler.py"  # upstream's size: test_layout_v0_scheduler
    }
    assert {name: n for name, n in sizes.items() if n > 400} == {}


def _config(fast_path: bool, policy: Policy = Policy.FCFS) -> SchedulerConfig:
    return SchedulerConfig(max_model_len=256, decode_fast_path=fast_path, policy=policy)


def _manager(design: Design):
    return audited(make_manager(design, KVCacheConfig(num_gpu_blocks=64, block_size=16)))


@pytest.mark.parametrize("fast_path", [False, True])
def test_v1_running_phase_is_upstreams_unless_the_shortcuts_replace_it(fast_path):
    scheduler = V1Scheduler(_config(fast_path), _manager(Design.V1_ENGINE))
    if fast_path:
        assert isinstance(scheduler.shortcuts, V1DecodeShortcuts)
        assert scheduler.running_phase == scheduler.shortcuts.schedule_running
    else:
        assert scheduler.shortcuts is None
        assert scheduler.running_phase == scheduler._schedule_running
    assert scheduler.use_decode_cohort(None) is fast_path


@pytest.mark.parametrize("make", [V0Scheduler, V1Scheduler])
def test_no_cohort_under_the_priority_policy(make):
    """The priority policy re-sorts `running` (v0) or takes a victim anywhere in it (V1): the
    cohort stays off, the fast path alone stays on."""
    design = Design.V1_ENGINE if make is V1Scheduler else Design.V0_V2
    scheduler = make(_config(True, Policy.PRIORITY), _manager(design))
    assert scheduler.use_decode_cohort(None) is False
    assert scheduler.shortcuts is not None and scheduler.shortcuts.cohort is None
