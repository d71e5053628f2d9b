"""`kvsim step`: the predicted time of one engine step, its breakdown by term, and its band.

The question users ask most ("how long does a step of 64 decodes at 4k context take on an
H100?") without writing a scenario:

    kvsim step --model llama-3.1-8b --gpu h100-sxm --decode 64x4096
    step time 17.64 ms (band x1-x1.67: 17.64-29.46 ms, extrapolated)

`--decode NxC` is N decodes at context C (repeatable); `--prefill NxP[@C]` is N prefill chunks
of P tokens after C already-computed tokens (default 0; repeatable). The breakdown is the
model's own (`breakdown(batch)`: a dataclass or a dict whose `*_s` entries are seconds per
term); a model without one reports its total as a single term.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from collections.abc import Callable

    from sim.catalog import GpuSpec, ModelSpec
    from sim.latency import StepTimeModel
    from sim.latency.batch import BatchShape

_DECODE = re.compile(r"\s*(\d+)\s*x\s*(\d+)\s*")
_PREFILL = re.compile(r"\s*(\d+)\s*x\s*(\d+)\s*(?:@\s*(\d+)\s*)?")
#: Digits a count or token number may have (10**18 is far past any bound below).
_MAX_DIGITS = 18
_DECODE_USAGE = "COUNTxCONTEXT, e.g. 64x4096 (64 decodes at 4096)"
_PREFILL_USAGE = "COUNTxTOKENS[@PRIOR], e.g. 1x2048 or 2x512@1024 (TOKENS >= 1)"


def _named(option: str, name: str, lookup: Callable[[str], Any]) -> Any:
    """`lookup(name)`; a catalog miss names the option: "--gpu 'bogus': unknown GPU ..."."""
    from sim.catalog import CatalogError

    try:
        return lookup(name)
    except CatalogError as error:
        raise _bad_input(f"{option} {name!r}: {error}") from None


def _bad_input(message: str) -> Exception:
    """A `ScenarioError`, imported on first use: `sim.scenario.schema` loads pandas (through the
    workload loaders), which `kvsim --help` must not wait for."""
    from sim.scenario.schema import ScenarioError

    return ScenarioError(message)


#: The most sequences (decodes + prefill chunks) one `kvsim step` batch may hold. A step is
#: bounded by the scheduler's `max_num_seqs` (vLLM's default 256; 1024 for the OpenAI server
#: on a large GPU, vllm/engine/arg_utils.py @v0.11.0); 65,536 is 64x the largest default and
#: keeps the per-sequence lists the step-time models read at a few MB, where 1e9 decodes
#: would take 15 GB before any answer.
MAX_STEP_SEQS = 1 << 16


def _counted(
    items: list[str], option: str, pattern: re.Pattern[str], usage: str
) -> list[tuple[int, int, int]]:
    """(count, tokens, prior) per item; one line naming `option` for a malformed item."""
    parsed = []
    for item in items:
        match = pattern.fullmatch(item)
        if match is None:
            raise _bad_input(f"{option} {item!r}: expected {usage}")
        if any(len(number) > _MAX_DIGITS for number in match.groups() if number):
            # int() of a 5,000-digit string raises (Python's digit limit), and none is sane.
            raise _bad_input(f"{option} {item!r}: a number of more than {_MAX_DIGITS} digits")
        prior = int(match.group(3)) if match.re.groups >= 3 and match.group(3) else 0
        parsed.append((int(match.group(1)), int(match.group(2)), prior))
    return parsed


def _check_bounds(
    option: str, item: str, count: int, total: int, context: int, max_context: int | None
) -> None:
    """Refuse a batch past `MAX_STEP_SEQS` or a context past the model's (before any list of
    `count` entries is made)."""
    if total > MAX_STEP_SEQS:
        raise _bad_input(
            f"{option} {item!r}: {total} sequences in one step, more than the "
            f"{MAX_STEP_SEQS} a step may hold (vLLM's max_num_seqs is 256 to 1024 by default)"
        )
    if max_context is not None and context > max_context:
        raise _bad_input(
            f"{option} {item!r}: a context of {context} tokens, more than the model's "
            f"{max_context} (max_position_embeddings)"
        )


def parse_decodes(
    items: list[str], *, max_context: int | None = None, already: int = 0
) -> tuple[int, ...]:
    """['64x4096', '2x100'] -> 64 contexts of 4096 then 2 of 100 (the decodes' contexts).

    At most `MAX_STEP_SEQS` decodes (with `already` other sequences), each context at most
    `max_context`: checked before the list is built.
    """
    contexts: list[int] = []
    total = already
    for item, (count, context, _) in zip(
        items, _counted(items, "--decode", _DECODE, _DECODE_USAGE), strict=True
    ):
        total += count
        _check_bounds("--decode", item, count, total, context, max_context)
        contexts += [context] * count
    return tuple(contexts)


def parse_prefills(
    items: list[str], *, max_context: int | None = None, already: int = 0
) -> tuple[tuple[int, int], ...]:
    """['1x2048', '2x512@1024'] -> ((0, 2048), (1024, 512), (1024, 512)): (prior, chunk) pairs.

    Bounded as `parse_decodes` is; a chunk's context is PRIOR + TOKENS.
    """
    chunks: list[tuple[int, int]] = []
    total = already
    for item, (count, tokens, prior) in zip(
        items, _counted(items, "--prefill", _PREFILL, _PREFILL_USAGE), strict=True
    ):
        if tokens == 0:
            raise _bad_input(f"--prefill {item!r}: expected {_PREFILL_USAGE}")
        total += count
        _check_bounds("--prefill", item, count, total, prior + tokens, max_context)
        chunks += [(prior, tokens)] * count
    return tuple(chunks)


def breakdown_terms(model: Any, batch: BatchShape) -> tuple[dict[str, float], dict[str, float]]:
    """(seconds per term, other numbers) from the model's `breakdown(batch)`, if it has one.

    Fields named `*_s` are terms (the suffix dropped: `linear_s` -> `linear`); other numeric
    fields (FLOPs, bytes) are details. Properties such as `total_s` are not fields, so they are
    not counted twice. Without a breakdown the whole step is one term, `total`.
    """
    breakdown = getattr(model, "breakdown", None)
    if breakdown is None:
        return {"total": model.predict_s(batch)}, {}
    parts = breakdown(batch)
    if dataclasses.is_dataclass(parts):
        items = {f.name: getattr(parts, f.name) for f in dataclasses.fields(parts)}
    else:
        items = dict(parts)
    terms, details = {}, {}
    for name, value in items.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if name.endswith("_s") and name != "total_s":
            terms[name.removesuffix("_s")] = float(value)
        elif name != "total_s":
            details[name] = float(value)
    return terms, details


def step_report(
    model_name: str,
    gpu_name: str,
    tp: int,
    decodes: list[str],
    prefills: list[str],
    step_time: str | None = None,
    vllm_version: str | None = None,
) -> dict[str, Any]:
    """Everything `kvsim step` prints, as plain data (the `--json` output).

    `vllm_version` (a V1-engine pin, default the scenarios' default) picks the all-reduce
    backends the measured model charges at tp > 1 (`sim.latency.allreduce`), as `kvsim run`
    does for a scenario pinning it.
    """
    from sim.catalog import get_gpu, get_model
    from sim.latency import band_of

    if tp < 1:
        raise _bad_input(f"--tp {tp}: must be at least 1")
    # each lookup names the option it came from
    model = _named("--model", model_name, get_model)
    gpu = _named("--gpu", gpu_name, get_gpu)
    batch = _step_batch(model, decodes, prefills)
    release, predictor = _step_predictor(model, gpu, tp, step_time, vllm_version)
    step_s = predictor.predict_s(batch)
    band = band_of(predictor)
    terms, details = breakdown_terms(predictor, batch)
    return {
        "model": model.name,
        "gpu": gpu_name,
        "tp": tp,
        "vllm_version": release,
        "step_time_model": type(predictor).__name__,
        "batch": {
            "num_decode_seqs": batch.num_decode_seqs,
            "decode_context_tokens": batch.decode_context_sum,
            "num_prefill_chunks": len(batch.prefill_chunks),
            "num_prefill_tokens": batch.num_prefill_tokens,
            "num_tokens": batch.num_tokens,
        },
        "step_time_s": step_s,
        "band": {
            **band.as_dict(),
            "low_s": step_s * band.low_factor,
            "high_s": step_s * band.high_factor,
        },
        "breakdown_s": terms,
        "details": details,
    }


def _step_batch(model: ModelSpec, decodes: list[str], prefills: list[str]) -> BatchShape:
    """The step `--decode` and `--prefill` describe, every context within the model's
    positions; an empty step is refused."""
    from sim.latency.batch import BatchShape

    limit = model.max_position_embeddings
    decode_contexts = parse_decodes(decodes, max_context=limit)
    chunks = parse_prefills(prefills, max_context=limit, already=len(decode_contexts))
    batch = BatchShape(decode_contexts, chunks)
    if batch.num_tokens == 0:
        raise _bad_input("give at least one --decode or --prefill, e.g. --decode 64x4096")
    return batch


def _step_predictor(
    model: ModelSpec, gpu: GpuSpec, tp: int, step_time: str | None, vllm_version: str | None
) -> tuple[str, StepTimeModel]:
    """(the V1-engine pin `--vllm-version` resolves to, the step-time model `--step-time`
    names for it); a `tp` the model's heads cannot split is refused, as vLLM starts no such
    engine."""
    from sim.kv.pins import resolve_pin
    from sim.latency import make_step_time

    try:
        release = resolve_pin("v1-engine", vllm_version).value
    except ValueError as error:
        raise _bad_input(f"--vllm-version: {error}") from None
    try:
        config = _step_time_config(step_time)
        predictor = make_step_time(config, model, gpu, tp=tp, release=release)
    except (ValueError, OSError) as error:
        raise _bad_input(str(error).splitlines()[0]) from None
    from sim.scenario.startup import check_tensor_parallel

    # vLLM starts no engine whose heads `tp` cannot split: no step of one to predict.
    check_tensor_parallel(model, tp, None, where="--tp")
    return release, predictor


def _step_time_config(name: str | None) -> Any:
    """None -> the default model; a name (roofline, measured, ...) -> that model's defaults;
    a path ending in .json -> that calibration profile."""
    from sim.latency import StepTimeConfig

    if name is None:
        return None
    if name.endswith(".json"):
        return {"calibrated": name}
    kinds = [k for k in StepTimeConfig.model_fields if k not in ("calibrated", "linear")]
    if name not in kinds:
        raise _bad_input(
            f"--step-time {name!r}: expected one of {', '.join(kinds)} or a PROFILE.json"
        )
    return name


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def step(
    model: Annotated[str, typer.Option("--model", help="Catalog model, e.g. llama-3.1-8b.")],
    gpu: Annotated[str, typer.Option("--gpu", help="Catalog GPU, e.g. h100-sxm.")],
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size.")] = 1,
    decode: Annotated[
        list[str] | None,
        typer.Option("--decode", help="COUNTxCONTEXT decodes, e.g. 64x4096 (repeatable)."),
    ] = None,
    prefill: Annotated[
        list[str] | None,
        typer.Option(
            "--prefill",
            help="COUNTxTOKENS[@PRIOR] prefill chunks, e.g. 1x2048 or 1x512@4096 (repeatable).",
        ),
    ] = None,
    step_time: Annotated[
        str | None,
        typer.Option(
            "--step-time",
            help="Step-time model: roofline, measured, or a calibration PROFILE.json "
            "(default: the default model).",
        ),
    ] = None,
    vllm_version: Annotated[
        str | None,
        typer.Option(
            "--vllm-version",
            help="V1-engine release whose all-reduce backends are charged at --tp > 1 "
            "(default: the scenarios' default, 0.33.0).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Predicted time of one engine step, its breakdown by term, and the model's error band."""
    from rich.table import Table

    from sim.cli.main import INPUT_ERRORS, console, fail

    try:
        report = step_report(model, gpu, tp, decode or [], prefill or [], step_time, vllm_version)
    except INPUT_ERRORS as error:
        raise fail(str(error).splitlines()[0]) from None
    if as_json:
        typer.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    b, band = report["batch"], report["band"]
    console.print(
        f"{report['model']} on {report['gpu']}, tp={report['tp']} ({report['step_time_model']}): "
        f"{_count(b['num_decode_seqs'], 'decode')} ({b['decode_context_tokens']} context tokens), "
        f"{_count(b['num_prefill_chunks'], 'prefill chunk')} ({b['num_prefill_tokens']} tokens)",
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        f"step time {_ms(report['step_time_s'])} (band x{band['low_factor']:g}-"
        f"x{band['high_factor']:g}: {_ms(band['low_s'])}-{_ms(band['high_s'])}"
        f"{', extrapolated' if band['extrapolated'] else ''}; {band['source']})",
        highlight=False,
        soft_wrap=True,
    )
    table = Table("term", "time", "share")
    total = report["step_time_s"]
    for name, seconds in report["breakdown_s"].items():
        share = f"{seconds / total:.0%}" if total > 0 else "-"
        table.add_row(name, _ms(seconds), share)
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add `kvsim step` to the main CLI."""
    app.command()(step)
