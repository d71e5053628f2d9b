"""Run a calibration grid: check every kernel against float64, then time each case.

All shapes are one layer on one tensor-parallel rank: Hq/tp query heads, max(1, Hkv/tp) KV
heads, linear layers with their tp-sharded dimension divided (Megatron column/row split):

    qkv_proj      [T, h]      x [h, (Hq + 2 Hkv) D / tp]
    o_proj        [T, Hq D/tp] x [Hq D / tp, h]
    gate_up_proj  [T, h]      x [h, 2 I / tp]
    down_proj     [T, I/tp]   x [I / tp, h]
    lm_head       [T, h]      x [h, V / tp]       (once per step, at T = sampled tokens)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from calibrate import kernels as K
from calibrate.budget import Case, Deadline, run_within_budget
from calibrate.grid import CaseCosts, Ceilings, Grid
from calibrate.reference import decode_reference, gemm_reference, max_rel_error, prefill_reference
from calibrate.timing import time_runner
from sim.catalog import ModelSpec, kv_heads_per_rank
from sim.errors import one_line
from sim.latency.fit import attention_pairs
from sim.latency.profile import Point

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: Max relative error against the float64 reference, by compute dtype.
TOLERANCE = {"float32": 1e-5, "bfloat16": 3e-2, "float16": 5e-3}
#: Decode kernels in order of preference for the fitted curve (fastest production kernel first).
DECODE_PREFERENCE = ("flashinfer", "vllm-paged-v2", "flash-attn", "torch-gather-sdpa")


class KernelCheckError(ValueError):
    """A kernel disagrees with the float64 reference: it is not timed."""


@dataclass(slots=True)
class SweepResult:
    decode_kernel: str
    decode_points: list[Point]
    alternative_decode: dict[str, list[Point]]
    prefill_points: list[Point]
    gemm_points: dict[str, list[Point]]
    checks: dict[str, float]  # kernel -> max relative error on its check case
    skipped: dict[str, str]  # kernel -> why it was not timed
    notes: list[str] = field(default_factory=list)
    num_cases: int = 0
    num_skipped_cases: int = 0  # left out at the budget's deadline


@dataclass(frozen=True, slots=True)
class LayerShapes:
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    gemms: dict[str, tuple[int, int]]  # name -> (in_features, out_features)

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> LayerShapes:
        if model.is_moe:
            raise ValueError(f"{model.name}: calibrating MoE expert layers is not implemented")
        hq = max(1, model.num_attention_heads // tp)
        hkv = kv_heads_per_rank(model.num_kv_heads, tp)
        d, h, i = model.head_dim, model.hidden_size, model.intermediate_size
        gemms = {
            "qkv_proj": (h, (hq + 2 * hkv) * d),
            "o_proj": (hq * d, h),
            "gate_up_proj": (h, 2 * i // tp),
            "down_proj": (i // tp, h),
            "lm_head": (h, model.vocab_size // tp),
        }
        return cls(hq, hkv, d, gemms)


def _check(name: str, err: float, dtype: str) -> None:
    if not err < TOLERANCE[dtype]:
        raise KernelCheckError(
            f"kernel {name}: max relative error {err:.3g} against the float64 reference "
            f"exceeds {TOLERANCE[dtype]:g} for {dtype}"
        )


def check_decode_kernel(name: str, prepare, shapes: LayerShapes, *, block_size: int,
                        dtype: str, device: str) -> float:  # fmt: skip
    """Run `prepare` on a ragged batch (partial last blocks) and compare with float64."""
    lens = [1, block_size + 3, 3 * block_size, 5 * block_size - 1]
    batch = K.make_paged_batch(lens, block_size=block_size, num_q_heads=shapes.num_q_heads,
                               num_kv_heads=shapes.num_kv_heads, head_dim=shapes.head_dim,
                               dtype=TORCH_DTYPES[dtype], device=device, seed=1)  # fmt: skip
    ref = decode_reference(batch.q, batch.k_cache, batch.v_cache, batch.block_table, lens)
    err = max_rel_error(prepare(batch)(), ref)
    _check(name, err, dtype)
    return err


class _Bar:
    """The sweep's progress on stderr: a pulsing bar while kernels are checked, then one step
    per case, the case being timed, and the estimated time left (`calibrate.budget`), counted
    down between cases. Silent when disabled."""

    def __init__(self, enabled: bool) -> None:
        self._progress = None
        if enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                ProgressColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.text import Text

            class EtaColumn(ProgressColumn):
                def render(self, task) -> Text:
                    eta_s, at_s = task.fields.get("eta_s"), task.fields.get("eta_at_s")
                    if eta_s is None:
                        return Text("")
                    left_s = eta_s - (time.perf_counter() - at_s)
                    return Text(f"~{left_s:.0f} s left" if left_s >= 0.5 else "finishing")

            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), EtaColumn(), transient=True,
            )  # fmt: skip
            self._task = self._progress.add_task("calibrate", total=None)

    def __enter__(self) -> _Bar:
        if self._progress is not None:
            self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def phase(self, description: str, total: int | None = None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=description, total=total)

    def timing(self, description: str) -> None:
        """The case about to be timed."""
        if self._progress is not None:
            self._progress.update(self._task, description=f"timing {description}")

    def tick(self, eta_s: float) -> None:
        """One case done; `eta_s` left from now."""
        if self._progress is not None:
            self._progress.update(self._task, advance=1, eta_s=eta_s,
                                  eta_at_s=time.perf_counter())  # fmt: skip


def _essential(cases: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """The corners of a 2-D grid of cases that make the 3-feature fits well posed:
    (lo, lo), (hi, lo), (lo, hi) and (hi, hi), those of them that are in `cases`."""
    if not cases:
        return set()
    firsts, seconds = sorted({a for a, _ in cases}), sorted({b for _, b in cases})
    corners = {(a, b) for a in (firsts[0], firsts[-1]) for b in (seconds[0], seconds[-1])}
    return corners & set(cases)


def run_sweep(
    model: ModelSpec,
    grid: Grid,
    *,
    device: str,
    dtype: str,
    tp: int = 1,
    block_size: int = 16,
    decode_kernels: list[str] | None = None,
    max_alternative_cases: int = 4,
    progress: bool = False,
    ceilings: Ceilings | None = None,
    deadline: Deadline | None = None,
) -> SweepResult:
    """Check every kernel, then time the cases of `grid` within `deadline` (`calibrate.budget`).

    Shapes: see the module docstring. `ceilings` give each case's estimated time (the order and
    the budget decisions); without them every case counts as one second. Without a deadline
    every case runs.
    """
    with _Bar(progress) as bar:
        bar.phase("calibrate: checking kernels against float64, drawing weights")
        return _sweep(bar, model, grid, device, dtype, tp, block_size, decode_kernels,
                      max_alternative_cases, ceilings, deadline)  # fmt: skip


def _sweep(bar: _Bar, model: ModelSpec, grid: Grid, device: str, dtype: str, tp: int,
           block_size: int, decode_kernels: list[str] | None, max_alternative_cases: int,
           ceilings: Ceilings | None, deadline: Deadline | None) -> SweepResult:  # fmt: skip
    tdtype = TORCH_DTYPES[dtype]
    elt = torch.tensor([], dtype=tdtype).element_size()
    shapes = LayerShapes.of(model, tp)
    available = K.decode_kernels(device)
    wanted = decode_kernels or [n for n in DECODE_PREFERENCE if callable(available.get(n))][:1]
    skipped = {n: r for n, r in available.items() if isinstance(r, str)}
    checks: dict[str, float] = {}
    usable: list[str] = []
    for name in wanted:
        prepare = available.get(name)
        if not callable(prepare):
            raise ValueError(f"decode kernel {name!r} unavailable: {prepare or 'unknown name'}")
        try:
            checks[name] = check_decode_kernel(name, prepare, shapes, block_size=block_size,
                                               dtype=dtype, device=device)  # fmt: skip
            usable.append(name)
        except KernelCheckError as exc:
            if not usable and name == wanted[0]:
                raise
            skipped[name] = str(exc)
    primary, alternatives = usable[0], usable[1:]

    kv_tok = 2 * shapes.num_kv_heads * shapes.head_dim * elt
    decode_cases = grid.decode_cases(kv_tok)
    alt_cases = decode_cases[:: max(1, len(decode_cases) // max_alternative_cases)]
    prefill_cases = grid.prefill_cases()
    timing = {"device": device, "warmup": grid.warmup, "repeats": grid.repeats}
    hq, hkv, d = shapes.num_q_heads, shapes.num_kv_heads, shapes.head_dim
    weights = _check_prefill_and_gemms(prefill_cases[0], grid.gemm_tokens[0], shapes, tdtype,
                                       dtype, device, checks)  # fmt: skip

    costs = CaseCosts(model, tp, elt, ceilings, grid.warmup + grid.repeats) if ceilings else None
    cases = _cases(primary, alternatives, decode_cases, alt_cases, prefill_cases,
                   grid.gemm_tokens, costs)  # fmt: skip
    measured: dict[tuple[str, tuple[int, ...]], Any] = {}
    # An alternative decode kernel that raises at some shape is dropped, with the reason, and
    # the sweep goes on: torch 2.11's inductor found no FlexAttention decoding kernel for a
    # 32,768-token pool on an H200 (NoValidChoicesError, 2026-12-04) after the small-shape check
    # had passed. The primary kernel's failure is still an internal error (a traceback).
    failed: dict[str, str] = {}

    def measure(case: Case) -> None:
        bar.timing(f"{case.kind} {case.params}")
        if case.kind.startswith("decode:"):
            name = case.kind.removeprefix("decode:")
            if name in failed:
                return
            num_seqs, ctx = case.params
            batch = K.make_paged_batch([ctx] * num_seqs, block_size=block_size, num_q_heads=hq,
                                       num_kv_heads=hkv, head_dim=d, dtype=tdtype,
                                       device=device)  # fmt: skip
            try:
                t = time_runner(available[name](batch), **timing)
            except Exception as exc:  # noqa: BLE001 - see `failed`
                if name == primary:
                    raise
                failed[name] = f"failed at {num_seqs} x {ctx} tokens: {one_line(str(exc))}"
                return
            measured[case.kind, case.params] = Point(
                params={"num_seqs": num_seqs, "context_tokens": num_seqs * ctx},
                median_s=t.median_s, samples_s=t.samples_s,
                bytes=num_seqs * (ctx * kv_tok + 2 * hq * d * elt),
                flops=4.0 * hq * d * num_seqs * ctx, peak_memory_bytes=t.peak_memory_bytes,
                max_rel_error=checks[name])  # fmt: skip
            del batch
        elif case.kind == "prefill":
            prior, chunk = case.params
            run, _ = K.prepare_prefill(prior, chunk, num_q_heads=hq, num_kv_heads=hkv,
                                       head_dim=d, dtype=tdtype, device=device)  # fmt: skip
            t = time_runner(run, **timing)
            measured[case.kind, case.params] = Point(
                params={"prior_tokens": prior, "chunk_tokens": chunk},
                median_s=t.median_s, samples_s=t.samples_s,
                bytes=(2 * hq * chunk + 2 * hkv * (prior + chunk)) * d * elt,
                flops=4.0 * hq * d * attention_pairs(prior, chunk),
                peak_memory_bytes=t.peak_memory_bytes,
                max_rel_error=checks["prefill-sdpa"] if (prior, chunk) == prefill_cases[0]
                else None)  # fmt: skip
        else:  # every GEMM of the layer at one token count: the profile needs them aligned
            (tokens,) = case.params
            for name, (k_in, n_out) in shapes.gemms.items():
                run, _ = K.prepare_gemm(tokens, k_in, n_out, dtype=tdtype, device=device,
                                        weight=weights[name])  # fmt: skip
                t = time_runner(run, **timing)
                measured[f"gemm-{name}", case.params] = Point(
                    params={"tokens": tokens}, median_s=t.median_s, samples_s=t.samples_s,
                    bytes=(tokens * k_in + k_in * n_out + tokens * n_out) * elt,
                    flops=2.0 * tokens * k_in * n_out, peak_memory_bytes=t.peak_memory_bytes,
                    max_rel_error=checks[f"gemm-{name}"] if tokens == grid.gemm_tokens[0]
                    else None)  # fmt: skip

    deadline = deadline or Deadline(float("inf"))
    bar.phase("calibrate: timing", total=len(cases))
    done = run_within_budget(
        cases, measure, deadline,
        on_case=lambda _case, _run, eta_s: bar.tick(eta_s),
    )  # fmt: skip

    def points(kind: str, keys) -> list[Point]:
        return [measured[kind, k] for k in keys if (kind, k) in measured]

    notes = list(grid.notes)
    if done.skipped:
        notes.append(f"budget: {len(done.skipped)} of {len(cases)} cases skipped at the deadline "
                     f"(the fits use the {len(done.run)} measured)")  # fmt: skip
    alt = {}
    for name in alternatives:
        got = points(f"decode:{name}", alt_cases)
        if name in failed:
            skipped[name] = failed[name]
        elif len(got) >= 3:
            alt[name] = got
        else:
            skipped[name] = f"only {len(got)} cases timed within the budget (a fit needs 3)"
    gemm_keys = [(t,) for t in grid.gemm_tokens]
    return SweepResult(
        primary, points(f"decode:{primary}", decode_cases), alt,
        points("prefill", prefill_cases),
        {name: points(f"gemm-{name}", gemm_keys) for name in shapes.gemms},
        checks, skipped, notes, num_cases=len(cases), num_skipped_cases=len(done.skipped),
    )  # fmt: skip


def _check_prefill_and_gemms(prefill_case, gemm_tokens, shapes: LayerShapes, tdtype, dtype: str,
                             device: str, checks: dict[str, float],
                             max_check_rows: int = 1024) -> dict[str, torch.Tensor]:  # fmt: skip
    """Prefill attention and every GEMM against float64, on the smallest case, before timing.

    Returns each GEMM's weight (drawn once, timed at every token count). A GEMM is checked on
    its first `max_check_rows` output features: the kernel is the same for every row, and a
    float64 copy of a whole lm_head (4 GB) took longer than the check is worth.
    """
    prior, chunk = prefill_case
    run, (q, k, v) = K.prepare_prefill(prior, chunk, num_q_heads=shapes.num_q_heads,
                                       num_kv_heads=shapes.num_kv_heads,
                                       head_dim=shapes.head_dim, dtype=tdtype,
                                       device=device)  # fmt: skip
    err = max_rel_error(run(), prefill_reference(q, k, v))
    _check("prefill-sdpa", err, dtype)
    checks["prefill-sdpa"] = err
    weights = {}
    for name, (k_in, n_out) in shapes.gemms.items():
        weights[name] = K.make_weight(k_in, n_out, dtype=tdtype, device=device)
        run, (x, w) = K.prepare_gemm(gemm_tokens, k_in, n_out, dtype=tdtype, device=device,
                                     weight=weights[name])  # fmt: skip
        rows = min(n_out, max_check_rows)
        err = max_rel_error(run()[:, :rows], gemm_reference(x, w[:rows]))
        _check(f"gemm-{name}", err, dtype)
        checks[f"gemm-{name}"] = err
    return weights


def _cases(primary: str, alternatives: list[str], decode_cases, alt_cases, prefill_cases,
           gemm_tokens, costs: CaseCosts | None) -> list[Case]:  # fmt: skip
    """Every case to time, with its estimate and tier (`calibrate.budget`)."""

    def est(kind: str, params: tuple[int, ...]) -> float:
        if costs is None:
            return 1.0
        if kind.startswith("decode:"):
            return costs.decode_s(*params)
        return costs.prefill_s(*params) if kind == "prefill" else costs.gemms_s(*params)

    out = []
    key_decode = _essential(decode_cases)
    for params in decode_cases:
        kind = f"decode:{primary}"
        out.append(Case(kind, params, est(kind, params), params in key_decode))
    for name in alternatives:
        out += [Case(f"decode:{name}", p, est(f"decode:{name}", p)) for p in alt_cases]
    key_prefill = _essential(prefill_cases)
    out += [Case("prefill", p, est("prefill", p), p in key_prefill) for p in prefill_cases]
    ends = {gemm_tokens[0], gemm_tokens[-1]}
    out += [Case("gemm", (t,), est("gemm", (t,)), t in ends) for t in gemm_tokens]
    return out
