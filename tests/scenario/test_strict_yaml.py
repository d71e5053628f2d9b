"""libyaml's loader and the pure-Python one read every scenario alike: same data, same errors."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.files import strict_yaml
from sim.files.strict_yaml import FAST_LOADER, StrictLoader, load_yaml

needs_libyaml = pytest.mark.skipif(
    FAST_LOADER is StrictLoader, reason="PyYAML was built without libyaml"
)

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)
_keys = st.text(max_size=8) | st.integers(-5, 5)
_data = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)


def _outcome(text: str, pure_python: bool) -> tuple:
    """What a load gives: ("ok", data) or ("error", class, line, problem)."""
    try:
        return ("ok", load_yaml(text, pure_python=pure_python))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        return (
            "error",
            type(error).__name__,
            mark.line if mark else None,
            getattr(error, "problem", None),
        )


@needs_libyaml
@settings(max_examples=200, deadline=None)
@given(_data, st.sampled_from([None, True, False]))
def test_both_loaders_construct_the_same_data(data, flow):
    text = yaml.safe_dump(data, default_flow_style=flow, allow_unicode=True)
    fast = _outcome(text, False)
    # Not always == data: PyYAML's dumper folds some characters (U+0085 in a key); the loaders
    # must agree whatever the text holds.
    assert fast[0] == "ok" and fast == _outcome(text, True)


#: Documents each loader must refuse, with the same error (class, line, message).
_REFUSED = [
    "a: 1\na: 2\n",  # duplicate key
    "cache: {num_gpu_blocks: 10, num_gpu_blocks: 20}\n",  # duplicate in a flow map
    "w:\n  requests:\n    - {arrival_s: 0, arrival_s: 1}\n",  # duplicate inside a list item
    "a: !!python/object:os.system 1\n",  # a Python tag
    "a: !!python/name:os.system\n",
    "a: !custom 3\n",  # an unknown local tag
    "a: [1,\n",  # unclosed flow sequence
    "a: 1\n b: 2\n",  # bad indentation
    "- *nope\n",  # undefined alias
    "\t- a\n",  # a tab
    "a: 'x\n",  # unterminated quote
    "{[1]: 2}\n",  # unhashable key
]


@needs_libyaml
@pytest.mark.parametrize("text", _REFUSED)
def test_both_loaders_refuse_alike(text):
    fast, pure = _outcome(text, False), _outcome(text, True)
    assert fast[0] == "error"
    assert fast == pure


@needs_libyaml
def test_merge_keys_may_still_be_overridden():
    text = "base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  x: 3\n"
    assert (
        load_yaml(text)
        == load_yaml(text, pure_python=True)
        == {
            "base": {"x": 1, "y": 2},
            "use": {"x": 3, "y": 2},
        }
    )


@needs_libyaml
def test_a_big_text_keeps_libyaml_s_error_at_the_same_line(monkeypatch):
    """Past `_REPARSE_CHARS` the pure-Python parser is not waited for: the line still agrees."""
    monkeypatch.setattr(strict_yaml, "_REPARSE_CHARS", 10)
    text = "a: 1\nb: 2\n- *nope\n"
    fast, pure = _outcome(text, False), _outcome(text, True)
    assert fast[:3] == pure[:3]


@needs_libyaml
def test_the_fast_loader_is_libyaml_s():
    assert issubclass(FAST_LOADER, yaml.CSafeLoader)
