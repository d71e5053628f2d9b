"""A `vllm serve MODEL [--flag ...]` command line, parsed the way the release's parser does.

The options and their arity are the release's own (`sim.vllm_bench.flags.serve_options`, read
from its real parser); the parsing is Python's `argparse` over those options (vLLM's
`FlexibleArgumentParser` is an `ArgumentParser`, so unambiguous prefixes are accepted too),
after the rewriting that 0.33.0 `vllm/utils/argparse_utils.py` `FlexibleArgumentParser.parse_args`
(L313-502) does first:

* `--model M` anywhere becomes the positional model;
* underscores in an option name (up to its first `.`) become dashes: `--max_num_seqs 8`;
* `-O3` / `-O=3` / `-O 3` become `--optimization-level 3`;
* dotted options become one JSON value: `--compilation-config.mode 3` is
  `--compilation-config '{"mode": 3}'` (`+` appends: `--x.y+ a,b`).

Both `--flag=value` and `--flag value` work (argparse's own), and boolean options take their
negative forms (`--no-enable-prefix-caching`, 0.33.0's `--disable-prefix-caching`).
`--config FILE` (options from a YAML file) is not read. Values are kept as the strings the
user wrote (lists for `nargs="+"`); `sim.vllm_bench.importer` converts the ones it models.

Example::

    >>> args = parse_serve_line("vllm serve meta-llama/Llama-3.1-8B --max_num_seqs=64 "
    ...                         "--no-enable-prefix-caching -tp 2", "0.33.0")
    >>> args.model, args.values["max_num_seqs"], args.values["enable_prefix_caching"]
    ('meta-llama/Llama-3.1-8B', '64', False)
    >>> args.values["tensor_parallel_size"]
    '2'
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from sim.errors import InputError
from sim.vllm_bench.flags import ServeOption, serve_options


class ServeLineError(InputError):
    """A `vllm serve` line that vLLM's parser would refuse, or that kvsim cannot read."""


@dataclass(frozen=True, slots=True)
class ServeArgs:
    """What the line set: the model and, per option `dest`, the value as written
    (True/False for a boolean option, a list for a multi-value one)."""

    model: str
    values: dict[str, Any] = field(default_factory=dict)
    #: dest -> the option string the user typed (for messages).
    spelled: dict[str, str] = field(default_factory=dict)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ServeLineError(f"vllm serve line: {message}")


class _Bool(argparse.Action):
    """A boolean option: its positive forms set True, `negative` forms False."""

    def __init__(self, option_strings: Sequence[str], dest: str, negative=(), **kwargs) -> None:
        self.negative = frozenset(negative)
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, option_string not in self.negative)
        _record(namespace, self.dest, option_string)


class _Store(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if self.const == "append":
            values = [*getattr(namespace, self.dest, []), values]
        elif values is None:  # nargs "?" given bare
            values = True
        setattr(namespace, self.dest, values)
        _record(namespace, self.dest, option_string)


class _StoreTrue(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, True)
        _record(namespace, self.dest, option_string)


def _record(namespace: argparse.Namespace, dest: str, option: str | None) -> None:
    spelled = getattr(namespace, "_spelled", {})
    spelled[dest] = option or dest
    namespace._spelled = spelled


def build_parser(options: Sequence[ServeOption]) -> argparse.ArgumentParser:
    """An argparse parser with the release's options; nothing is set unless given."""
    parser = _Parser(prog="vllm serve", add_help=False)
    parser.add_argument("model_tag", nargs="?", default=argparse.SUPPRESS)
    for opt in options:
        strings = list(dict.fromkeys([*opt.options, *opt.negative]))
        common: dict[str, Any] = {"dest": opt.dest, "default": argparse.SUPPRESS}
        if opt.kind == "bool":
            parser.add_argument(*strings, action=_Bool, negative=opt.negative, **common)
        elif opt.kind == "store_true":
            parser.add_argument(*strings, action=_StoreTrue, **common)
        elif opt.kind == "append":
            parser.add_argument(*strings, action=_Store, const="append", **common)
        else:
            nargs = opt.nargs
            parser.add_argument(*strings, action=_Store, nargs=nargs, **common)
    return parser


def _split(line: str) -> list[str]:
    try:
        words = shlex.split(line)
    except ValueError as error:
        raise ServeLineError(f"vllm serve line: cannot split it into words: {error}") from None
    if words[:2] == ["vllm", "serve"]:
        return words[2:]
    if words[:1] == ["serve"]:
        return words[1:]
    raise ServeLineError(
        f"vllm serve line: expected it to start with `vllm serve`, got {line[:40]!r}"
    )


def _model_first(args: list[str]) -> list[str]:
    """`--model M` / `--model=M` anywhere moves to the front (L326-357)."""
    for i, arg in enumerate(args):
        if arg == "--model" and i + 1 < len(args):
            return [args[i + 1], *args[:i], *args[i + 2 :]]
        if arg.startswith("--model="):
            return [arg.removeprefix("--model="), *args[:i], *args[i + 1 :]]
    return args


_NAME = re.compile(r"(?<=--)[^\.]*")


def _normalise(args: list[str]) -> list[str]:
    """Dashes for underscores in option names, and the `-O` forms (L376-403)."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            key = _NAME.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
            out.append(f"{key}{eq}{value}")
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(arg)
    return out


def _dotted(args: list[str]) -> list[str]:
    """`--x.a.b V` options merged into one `--x JSON` (L404-500)."""
    merged: dict[str, dict[str, Any]] = {}
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        name, eq, value = arg.partition("=")
        if not (arg.startswith("-") and "." in name):
            out.append(arg)
            continue
        if not eq:
            if i + 1 >= len(args):
                raise ServeLineError(f"vllm serve line: {name} needs a value")
            value, skip = args[i + 1], True
        if name.endswith("+"):
            name, value = name[:-1], json.dumps(value.split(","))
        key, *keys = name.split(".")
        try:
            parsed: Any = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        node = merged.setdefault(key, {})
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = parsed
    for key, nested in merged.items():
        out += [key, json.dumps(nested)]
    return out


def parse_serve_line(line: str, version: str) -> ServeArgs:
    """Parse `line` with the options of `vllm serve` at `version` (see the module docstring)."""
    args = _dotted(_normalise(_model_first(_split(line))))
    if "--config" in args or any(a.startswith("--config=") for a in args):
        raise ServeLineError(
            "vllm serve line: --config (options from a YAML file) is not read by kvsim; "
            "write the options on the line"
        )
    namespace = build_parser(serve_options(version)).parse_args(args)
    values = {k: v for k, v in vars(namespace).items() if not k.startswith("_")}
    model = values.pop("model_tag", None)
    if model is None:
        raise ServeLineError("vllm serve line: no model (vllm serve MODEL ...)")
    return ServeArgs(model=model, values=values, spelled=getattr(namespace, "_spelled", {}))
