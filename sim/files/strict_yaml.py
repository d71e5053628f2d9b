"""YAML as kvsim reads it: safe, and a key given twice in one mapping is an error.

Two loaders with one behaviour: `StrictCLoader` on libyaml's C parser (PyYAML's `CSafeLoader`),
used whenever PyYAML was built with it, and `StrictLoader`, the pure-Python fallback. Both
construct with PyYAML's `SafeConstructor` (so a tag such as ``!!python/object`` is refused) plus
`_StrictMappings` (so a duplicate key is refused). With the C parser a 200,000-request inline
workload (13 MB) loads 3.7x faster, 32 s instead of 117 s on a busy 2-core machine
(`python benchmarks/inline_yaml.py`; the rest is PyYAML's Python constructor and implicit
tag resolver, shared by both loaders); what is constructed,
and every construction error (duplicate key, unknown tag), is the same with either
(`tests/scenario/test_strict_yaml.py`). Syntax errors are found at the same line by both, but libyaml
words some of them less helpfully ("found undefined alias", without the alias): so a text of
up to `_REPARSE_CHARS` that the C parser refuses is parsed again in Python for its message
(every hand-written scenario; a big generated one keeps libyaml's words rather than wait).

Example: ``cache: {num_gpu_blocks: 10, num_gpu_blocks: 20}`` fails with
"duplicate key 'num_gpu_blocks' (first on line 1)" at the second key's line. Merge keys
(``<<: *defaults``) may still be overridden: that is what they are for.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class _StrictMappings:
    """The duplicate-key check, shared by both loaders (mixed in before the constructor)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]
                try:
                    seen = key in first_line
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first on line {first_line[key] + 1})",
                        key_node.start_mark,
                    )
                first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)  # type: ignore[misc]


class StrictLoader(_StrictMappings, yaml.SafeLoader):
    """PyYAML's pure-Python safe loader, refusing duplicate keys."""


#: libyaml's parser where PyYAML has it, else None (then `load_yaml` uses `StrictLoader`).
_CSafeLoader: Any = getattr(yaml, "CSafeLoader", None)

if _CSafeLoader is not None:

    class StrictCLoader(_StrictMappings, _CSafeLoader):
        """PyYAML's C (libyaml) safe loader, refusing duplicate keys."""

    FAST_LOADER: type = StrictCLoader
else:  # pragma: no cover - PyYAML built without libyaml
    FAST_LOADER = StrictLoader


# YAML 1.1 (PyYAML) reads `1e-3` and `1.0e300` (no dot, or no exponent sign) as strings;
# YAML 1.2 and every user read them as numbers. The scenario's float fields are strict (no
# strings, `sim.scenario.fields`), so both loaders resolve such a scalar as the float it is:
# `fixed_s: 1e-3` keeps working, and `1e999` is an infinite float that the finite check names.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
for _loader in dict.fromkeys((StrictLoader, FAST_LOADER)):
    _loader.add_implicit_resolver(  # type: ignore[attr-defined]
        "tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+.0123456789")
    )


#: Texts up to this many characters refused by libyaml are parsed again in Python for the
#: message (the pure-Python parser reads ~100 kB/s: at most ~3 s, and only on an error).
_REPARSE_CHARS = 256 << 10


def load_yaml(text: str, *, pure_python: bool = False) -> Any:
    """`yaml.safe_load` that refuses duplicate keys; libyaml's parser unless `pure_python`."""
    if pure_python or FAST_LOADER is StrictLoader:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - SafeLoader's constructor
    try:
        return yaml.load(text, Loader=FAST_LOADER)  # noqa: S506 - SafeLoader's constructor
    except yaml.constructor.ConstructorError:
        raise  # built by the shared Python constructor: the same error either way
    except yaml.YAMLError:
        if len(text) > _REPARSE_CHARS:
            raise
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - raises, in Python's words


__all__ = ["FAST_LOADER", "StrictLoader", "load_yaml"]
