"""`sim.kv.pins`: one version type for every design, and nothing else that names a version.

* every (design, pin) pair resolves, for a scenario and for a manager, to the one `VllmPin`;
  a name another design takes, or no design, is the one-line error the schema reports;
* no module in `sim/` compares a string with a pin's name (a behaviour that differs by version
  is a `VllmPin` property);
* every public method of the faithful KV models has a docstring that cites its upstream
  `file.py:Lstart-end (release)` or says it is kvsim's own; where the cited wheel is installed
  (`.vllm/<release>`), a citation of a same-named function starts at its `def`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from sim.kv import Design, KVCacheConfig, make_manager
from sim.kv.pins import (
    PINS_BY_DESIGN,
    SCENARIO_DEFAULT,
    UNPINNED_MANAGER,
    VllmPin,
    find_pin,
    manager_pin,
    resolve_pin,
)

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "sim"
FAITHFUL = [SIM / "kv" / name for name in ("v0_v1", "v0_v2", "v1_engine")]
PAIRS = [(design, pin) for design, pins in PINS_BY_DESIGN.items() for pin in pins]
#: `Upstream[ `name`]: `vllm/<path>:L<a>-<b> (<release>)`` as the faithful docstrings write it.
CITATION = re.compile(
    r"Upstream(?: `(?:\w+\.)?(\w+)`)?: `vllm/([\w/]+\.py):L(\d+)-(\d+) \(([\d.]+)\)`"
)


@pytest.mark.parametrize(("design", "pin"), PAIRS, ids=lambda x: getattr(x, "value", x))
def test_every_design_pin_pair_resolves_to_the_one_type(design, pin):
    assert resolve_pin(design, pin.value) is pin
    assert resolve_pin(design.value, pin.value) is pin
    assert manager_pin(design, pin.value) is pin
    assert find_pin(pin.value) is pin


def test_every_pin_belongs_to_a_design_and_each_default_is_one_of_its_pins():
    assert {pin for pins in PINS_BY_DESIGN.values() for pin in pins} == set(VllmPin)
    assert set(PINS_BY_DESIGN) == set(Design)
    for design in Design:
        assert resolve_pin(design, None) is SCENARIO_DEFAULT[design] in PINS_BY_DESIGN[design]
        assert manager_pin(design, None) is UNPINNED_MANAGER[design] in PINS_BY_DESIGN[design]


@pytest.mark.parametrize("design", list(Design), ids=lambda d: d.value)
def test_a_pin_of_another_design_is_refused_naming_the_designs_pins(design):
    names = ", ".join(pin.value for pin in PINS_BY_DESIGN[design])
    for pin in set(VllmPin) - set(PINS_BY_DESIGN[design]):
        with pytest.raises(ValueError, match="unknown vLLM version") as error:
            resolve_pin(design, pin.value)
        assert str(error.value).endswith(f"; pinned: {names}")
        with pytest.raises(ValueError, match="unknown vLLM version"):
            manager_pin(design, pin.value)
    assert find_pin("0.9") is None


@pytest.mark.parametrize(
    ("design", "pin"),
    [pair for pair in PAIRS if pair[0] is not Design.V0_V1],  # one pin, nothing reads it
    ids=lambda x: getattr(x, "value", x),
)
def test_a_pinned_manager_carries_the_pin(design, pin):
    """The managers that differ by pin expose it (the V1 scheduler reads `pin` from its
    manager); a config without `vllm_pin` gets the design's unpinned default."""
    pinned = make_manager(design, KVCacheConfig(16, 16, vllm_pin=pin.value))
    unpinned = make_manager(design, KVCacheConfig(16, 16))
    assert pinned.pin is pin
    assert unpinned.pin is UNPINNED_MANAGER[design]


def _string_constants(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for elt in node.elts for s in _string_constants(elt)]
    return []


def test_no_module_in_sim_compares_a_string_with_a_pin_name():
    names = {pin.value for pin in VllmPin}
    found = []
    for path in sorted(SIM.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                hits = {s for side in sides for s in _string_constants(side)} & names
                if hits:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {sorted(hits)}")
    assert not found, "compare a VllmPin property instead: " + "; ".join(found)


def _public_methods(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            yield node.name, node
        if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
            continue
        if any(getattr(base, "id", None) == "Protocol" for base in node.bases):
            continue  # an interface: its stubs are documented where they are implemented
        for fn in node.body:
            if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_"):
                yield f"{node.name}.{fn.name}", fn


def _faithful_methods():
    for package in FAITHFUL:
        for path in sorted(package.glob("*.py")):
            for name, fn in _public_methods(path):
                yield path, name, fn


def test_every_public_method_of_a_faithful_kv_model_cites_upstream_or_says_it_is_kvsims_own():
    missing = []
    for path, name, fn in _faithful_methods():
        doc = ast.get_docstring(fn) or ""
        if ".py:L" not in doc and "kvsim's own" not in doc:
            missing.append(f"{path.relative_to(ROOT)}:{fn.lineno} {name}")
    assert len(list(_faithful_methods())) > 200  # the scan sees the modules
    assert not missing, "no upstream citation: " + ", ".join(missing)


def test_a_citation_of_a_same_named_upstream_function_starts_at_its_def():
    checked = 0
    wrong = []
    for _path, name, fn in _faithful_methods():
        for match in CITATION.finditer(" ".join((ast.get_docstring(fn) or "").split())):
            upstream_name, rel, start, end, release = match.groups()
            source = ROOT / ".vllm" / release / "vllm" / rel
            if not source.exists():
                continue
            lines = source.read_text().splitlines()
            start_i, end_i = int(start), int(end)
            if not 1 <= start_i <= end_i <= len(lines):
                wrong.append(f"{name}: {rel}:L{start}-{end} outside the file")
                continue
            wanted = upstream_name or name.rsplit(".", 1)[-1]
            if f"def {wanted}(" not in lines[start_i - 1]:
                wrong.append(f"{name}: {rel}:L{start} is not `def {wanted}`")
            checked += 1
    if checked == 0:
        pytest.skip("no upstream wheel installed under .vllm/")
    assert checked > 100 or not (ROOT / ".vllm" / "0.5.4").exists()
    assert not wrong, "; ".join(wrong)
