"""Write `sim/data/vllm_serve_flags/<version>.json`: every option of a release's `vllm serve`
parser, as its own argparse builds it, for kvsim's `import-vllm` to parse a command line the
same way without vLLM installed.

Builds the release's real parser on CPU (`make_arg_parser` of 0.33.0
`vllm/entrypoints/common/cli_args.py`; of 0.11.0, 0.19.1, 0.20.0, 0.25.1 and 0.26.0
`vllm/entrypoints/openai/cli_args.py`), with the
platform faked as `sim.vllm_real.defaults_lockstep` fakes it, and records per option: its
option strings, `dest`, `nargs`, its action kind (`value`, `bool` with its negative forms,
`store_true`, `append`) and whether its value is JSON. Usage::

    PYTHONPATH=. python scripts/vllm_serve_flags.py 0.33.0
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Where each release defines `make_arg_parser` and `FlexibleArgumentParser` (read in its wheel:
#: the parser moved to `vllm/utils/argparse_utils.py` before 0.19.1, `make_arg_parser` to
#: `vllm/entrypoints/common/` after 0.26.0).
CLI_MODULE = {
    "0.11.0": "entrypoints.openai.cli_args",
    "0.19.1": "entrypoints.openai.cli_args",
    "0.20.0": "entrypoints.openai.cli_args",
    "0.25.1": "entrypoints.openai.cli_args",
    "0.26.0": "entrypoints.openai.cli_args",
    "0.33.0": "entrypoints.common.cli_args",
}
PARSER_MODULE = {
    "0.11.0": "utils",
    "0.19.1": "utils.argparse_utils",
    "0.20.0": "utils.argparse_utils",
    "0.25.1": "utils.argparse_utils",
    "0.26.0": "utils.argparse_utils",
    "0.33.0": "utils.argparse_utils",
}


#: Modules the 0.11.0 serve parser's imports need but `.vllm/0.11.0/_deps` lacks (tool-call
#: parsing only): empty stand-ins, which change no option.
STUBBED = ("partial_json_parser", "partial_json_parser.core", "partial_json_parser.core.options")


def _stub(name: str):
    import types

    module = types.ModuleType(name)
    module.Allow = type("Allow", (), {"ALL": 0, "STR": 1, "OBJ": 2, "ARR": 4})  # type: ignore[attr-defined]
    module.loads = lambda *a, **k: None  # type: ignore[attr-defined]
    module.__path__ = []  # type: ignore[attr-defined]
    return module


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "bool"
    if isinstance(action, argparse._StoreTrueAction):
        return "store_true"
    if isinstance(action, argparse._AppendAction):
        return "append"
    if action.nargs == 0:
        raise AssertionError(f"unknown zero-argument action {action}")
    return "value"


def flag_table(version: str) -> list[dict]:
    from sim.catalog import get_gpu
    from sim.vllm_real.defaults_lockstep import _RealV1
    from sim.vllm_real.loader import import_vllm, load_vllm

    install = load_vllm(vllm_version=version)
    real = _RealV1(install)
    type(real.platform).configure(get_gpu("h100-sxm"))
    for name in STUBBED:  # imported by the tool parsers, never by the parser itself
        sys.modules.setdefault(name, _stub(name))
    parser = import_vllm(PARSER_MODULE[version], install).FlexibleArgumentParser()
    import_vllm(CLI_MODULE[version], install).make_arg_parser(parser)
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        kind = _kind(action)
        row: dict = {"dest": action.dest, "options": list(action.option_strings), "kind": kind}
        if kind == "bool":
            negative = getattr(action, "negative_option_strings", None)
            if negative is None:
                negative = [o for o in action.option_strings if o.startswith("--no-")]
            row["negative"] = sorted(negative)
        if kind in ("value", "append"):
            row["nargs"] = action.nargs
        rows.append(row)
    return sorted(rows, key=lambda r: r["dest"])


def main() -> int:
    version = sys.argv[1]
    rows = flag_table(version)
    out = REPO / "sim" / "data" / "vllm_serve_flags" / f"{version}.json"
    out.write_text(json.dumps({"vllm_version": version, "flags": rows}, indent=1))
    print(f"{len(rows)} options -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
