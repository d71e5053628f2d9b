"""`kvsim import-vllm`: a `vllm serve` command line -> a scenario that says what the user passed.

Only the options on the line are written; every other setting is left for the pinned release's
defaults (`sim.scenario.vllm_defaults`) to decide when the scenario is resolved. Each option is
handled by its class (`sim.vllm_bench.flags`): a modelled one becomes its field (`FIELD_OF`),
one with no effect is dropped, speculative decoding is refused, and an unmodelled one is
refused naming it unless `allow_unmodelled` lists it (then the description records it).

Example (0.33.0 on an H100)::

    >>> text = import_serve_line(
    ...     "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 64 --port 8001 "
    ...     "--no-enable-prefix-caching", gpu="h100-sxm", version="0.33.0")
    >>> print(text.split("\\nworkload:")[0])  # doctest: +ELLIPSIS
    name: llama-3.1-8b-h100-sxm
    description: ...
    model: llama-3.1-8b
    hardware:
      gpu: h100-sxm
    cache:
      enable_prefix_caching: false
    scheduler:
      design: v1-engine
      vllm_version: 0.33.0
      max_num_seqs: 64
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sim.catalog import get_gpu
from sim.errors import InputError
from sim.scenario.schema import scenario_from_dict
from sim.vllm_bench.flags import FlagClass, flag_class, nearest_release
from sim.vllm_bench.models import scenario_model
from sim.vllm_bench.serve_line import ServeArgs, parse_serve_line
from sim.vllm_bench.server_log import read_serve_settings


class ImportError_(InputError):
    """A `vllm serve` line kvsim cannot turn into a scenario (one line, naming the option)."""


def human_readable_int(text: str) -> int:
    """vLLM's `human_readable_int` (0.33.0 `vllm/utils/argparse_utils.py` L30-74): decimal
    k/m/g/t, binary K/M/G/T. Example: '1k' -> 1000, '2K' -> 2048, '25.6k' -> 25600."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text.strip())
    if match is None:
        return int(text)
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
    return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10)


def _max_model_len(text: str) -> int | None:
    """'auto' / -1: the release decides (left unset); else a human-readable int."""
    return None if text.strip().lower() in ("auto", "-1") else human_readable_int(text)


_KV_DTYPES = {"auto": "auto", "float16": "fp16", "bfloat16": "bf16", "fp8": "fp8",
              "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}  # fmt: skip
_DTYPES = {"auto": None, "bfloat16": "bfloat16", "float16": "float16", "half": "float16"}
_QUANTIZATION = {"fp8": "fp8", "awq": "awq-int4", "gptq": "gptq-int4", "mxfp4": "mxfp4"}


def _choice(table: dict[str, Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        if text not in table:
            raise ValueError(f"kvsim models {', '.join(sorted(table))}")
        return table[text]

    return convert


def _bool(value: Any) -> bool:
    assert isinstance(value, bool), value  # the parser stores booleans for bool options
    return value


@dataclass(frozen=True, slots=True)
class FieldMap:
    """Where one modelled option goes in the scenario, and how its text is converted."""

    path: str
    convert: Callable[[Any], Any]


#: Modelled option dest -> scenario field. `model` and `tensor_parallel_size` are handled
#: with the GPU; `dtype` and `quantization` both set `model_dtype` (quantization wins).
FIELD_OF: dict[str, FieldMap] = {
    "tensor_parallel_size": FieldMap("hardware.tensor_parallel_size", int),
    "max_model_len": FieldMap("scheduler.max_model_len", _max_model_len),
    "max_num_seqs": FieldMap("scheduler.max_num_seqs", int),
    "max_num_batched_tokens": FieldMap("scheduler.max_num_batched_tokens", human_readable_int),
    "enable_chunked_prefill": FieldMap("scheduler.enable_chunked_prefill", _bool),
    "scheduling_policy": FieldMap(
        "scheduler.policy", _choice({"fcfs": "fcfs", "priority": "priority"})
    ),
    "long_prefill_token_threshold": FieldMap("scheduler.long_prefill_token_threshold", int),
    "async_scheduling": FieldMap("scheduler.async_scheduling", _bool),
    "enable_prefix_caching": FieldMap("cache.enable_prefix_caching", _bool),
    # "none" with caching on is derived as if not given (`vllm_defaults.mamba`).
    "mamba_cache_mode": FieldMap(
        "cache.mamba_cache_mode", _choice({"align": "align", "all": "all", "none": None})
    ),
    "gpu_memory_utilization": FieldMap("cache.gpu_memory_utilization", float),
    "block_size": FieldMap("cache.block_size", int),
    "kv_cache_dtype": FieldMap("cache.kv_cache_dtype", _choice(_KV_DTYPES)),
    "swap_space": FieldMap("cache.swap_space_gib", float),
    "num_gpu_blocks_override": FieldMap("cache.num_gpu_blocks", int),
    "api_server_count": FieldMap("engine.api_server_count", int),
    "stream_interval": FieldMap("engine.stream_interval", int),
    "dtype": FieldMap("model_dtype", _choice(_DTYPES)),
    "quantization": FieldMap("model_dtype", _choice(_QUANTIZATION)),
}


#: The workload an imported scenario carries until `kvsim bench serve` replaces it: the shape
#: of `vllm bench serve`'s default random dataset (1000 prompts, 1024 in, 128 out).
PLACEHOLDER_WORKLOAD: dict[str, Any] = {
    "kind": "synthetic",
    "num_requests": 1000,
    "arrival": {"process": "poisson", "rate_per_s": 10.0},
    "lengths": {
        "prompt": {"kind": "fixed", "value": 1024},
        "output": {"kind": "fixed", "value": 128},
    },
}


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, name = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[name] = value


def _classify(args: ServeArgs, allowed: set[str]) -> list[str]:
    """Refuse what kvsim cannot simulate; the allowed unmodelled options as typed."""
    noted: list[str] = []
    for dest in args.values:
        kind = flag_class(dest)
        typed = args.spelled.get(dest, dest)
        if kind is FlagClass.SPECULATIVE:
            raise ImportError_(
                f"{typed}: speculative decoding is not modelled by kvsim yet; remove it to "
                "simulate the server without it"
            )
        if kind is FlagClass.UNMODELLED or kind is None:
            names = {typed, typed.lstrip("-"), dest, dest.replace("_", "-")}
            if not names & allowed:
                raise ImportError_(
                    f"{typed}: changes scheduling, memory or speed in a way kvsim does not "
                    f"model; pass --allow-unmodelled {typed.lstrip('-')} to simulate without it"
                )
            noted.append(typed)
    return noted


def _modelled_fields(args: ServeArgs) -> dict[str, Any]:
    data: dict[str, Any] = {}
    order = sorted(args.values, key=lambda d: d == "quantization")  # quantization last: wins
    for dest in order:
        if flag_class(dest) is not FlagClass.MODELLED or dest == "model":
            continue
        fmap = FIELD_OF[dest]
        typed = args.spelled.get(dest, dest)
        try:
            value = fmap.convert(args.values[dest])
        except (ValueError, TypeError) as error:
            raise ImportError_(f"{typed} {args.values[dest]}: {error}") from None
        if value is None:
            continue
        _set(data, fmap.path, value)
    return data


def import_serve_line(
    line: str, *, gpu: str, version: str = "0.33.0", allow_unmodelled: Iterable[str] = ()
) -> str:
    """The scenario YAML for `line` on `gpu` under vLLM `version` (see the module docstring)."""
    _check_gpu(gpu)
    args = parse_serve_line(line, version)
    origin = f"`{' '.join(line.split())}` (vLLM {version})"
    return _scenario_yaml(args, gpu, version, allow_unmodelled, origin)


def import_server_log(
    path: Path, *, gpu: str, version: str | None = None, allow_unmodelled: Iterable[str] = ()
) -> str:
    """The scenario YAML for the server whose startup log is `path`: its "non-default args"
    line (`sim.vllm_bench.server_log.read_serve_settings`) read as the same options on a
    command line would be, under `version`, or else the kvsim pin nearest the release the log
    names (`nearest_release`: a 0.17.0 log runs under 0.11.0, said in the description).

    Example: a 0.19.0 log's "non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B',
    'max_num_seqs': 64, 'port': 8001}" gives the scenario of `vllm serve
    meta-llama/Llama-3.1-8B --max-num-seqs 64 --port 8001` under pin 0.19.1."""
    _check_gpu(gpu)
    settings = read_serve_settings(path)
    logged = settings.vllm_version
    release = version or nearest_release(logged or "")
    values = dict(settings.values)
    model = values.pop("model_tag", None) or values.pop("model", None)
    values.pop("model", None)
    if not isinstance(model, str):
        raise ImportError_(f"{path}:{settings.line}: non-default args: no model")
    args = ServeArgs(
        model=model,
        values={k: _as_parsed(v) for k, v in values.items()},
        spelled={k: "--" + k.replace("_", "-") for k in values},
    )
    origin = f"the startup log {path.name} (vLLM {logged or 'release not logged'}, pin {release})"
    try:
        return _scenario_yaml(args, gpu, release, allow_unmodelled, origin)
    except InputError as error:
        raise ImportError_(f"{path}:{settings.line}: non-default args: {error}") from None


def _as_parsed(value: Any) -> Any:
    """A logged value as the command-line parser hands it to the importer: booleans and
    lists as they are, numbers as the text the user would have typed."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _check_gpu(gpu: str) -> None:
    try:
        get_gpu(gpu)
    except InputError as error:
        raise ImportError_(f"--gpu: {error}") from None


def _scenario_yaml(
    args: ServeArgs, gpu: str, version: str, allow_unmodelled: Iterable[str], origin: str
) -> str:
    noted = _classify(args, {a.strip() for a in allow_unmodelled if a.strip()})
    model = scenario_model(args.model)
    fields = _modelled_fields(args)
    name = model if isinstance(model, str) else model["name"]
    notes = [f"imported by kvsim import-vllm from {origin}"]
    if noted:
        notes.append("unmodelled, simulated without: " + ", ".join(noted))
    notes.append("workload: a stand-in (vllm bench serve's default random shape); "
                 "kvsim bench serve replaces it")  # fmt: skip
    data: dict[str, Any] = {
        "name": re.sub(r"[^A-Za-z0-9._-]+", "-", f"{name}-{gpu}").strip("-."),
        "description": "; ".join(notes),
        "model": model,
    }
    if "model_dtype" in fields:
        data["model_dtype"] = fields.pop("model_dtype")
    data["hardware"] = {"gpu": gpu, **fields.pop("hardware", {})}
    if "cache" in fields:
        data["cache"] = fields.pop("cache")
    data["scheduler"] = {
        "design": "v1-engine",
        "vllm_version": version,
        **fields.pop("scheduler", {}),
    }
    if "engine" in fields:
        data["engine"] = fields.pop("engine")
    assert not fields, fields
    data["workload"] = PLACEHOLDER_WORKLOAD
    scenario_from_dict(data, f"the scenario imported from {args.model!r}")  # refused here if bad
    return yaml.safe_dump(data, sort_keys=False)
