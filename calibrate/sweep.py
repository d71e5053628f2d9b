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

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from calibrate import kernels as K
from calibrate.grid import Grid
from calibrate.reference import decode_reference, gemm_reference, max_rel_error, prefill_reference
from calibrate.timing import time_runner
from sim.catalog import ModelSpec, kv_heads_per_rank
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


def _progress(enabled: bool, total: int) -> Iterator[Callable[[str], None]]:
    if not enabled:
        yield lambda _desc: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                  "{task.total}"), TimeElapsedColumn(), transient=True) as bar:  # fmt: skip
        task = bar.add_task("calibrate", total=total)
        yield lambda desc: bar.update(task, advance=1, description=desc)


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
) -> SweepResult:
    """Check, then time, every case of `grid` (see module docstring for the shapes)."""
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
    total = (len(decode_cases) + len(alt_cases) * len(alternatives) + len(prefill_cases)
             + len(grid.gemm_tokens) * len(shapes.gemms))  # fmt: skip
    timing = {"device": device, "warmup": grid.warmup, "repeats": grid.repeats}
    hq, hkv, d = shapes.num_q_heads, shapes.num_kv_heads, shapes.head_dim

    def decode_points(name: str, cases: list[tuple[int, int]], tick) -> list[Point]:
        out = []
        for num_seqs, ctx in cases:
            batch = K.make_paged_batch([ctx] * num_seqs, block_size=block_size, num_q_heads=hq,
                                       num_kv_heads=hkv, head_dim=d, dtype=tdtype,
                                       device=device)  # fmt: skip
            t = time_runner(available[name](batch), **timing)
            out.append(Point(params={"num_seqs": num_seqs, "context_tokens": num_seqs * ctx},
                             median_s=t.median_s, samples_s=t.samples_s,
                             bytes=num_seqs * (ctx * kv_tok + 2 * hq * d * elt),
                             flops=4.0 * hq * d * num_seqs * ctx,
                             peak_memory_bytes=t.peak_memory_bytes,
                             max_rel_error=checks[name]))  # fmt: skip
            del batch
            tick(f"decode {name} B={num_seqs} ctx={ctx}")
        return out

    with contextlib.contextmanager(_progress)(progress, total) as tick:
        primary_points = decode_points(primary, decode_cases, tick)
        alt = {n: decode_points(n, alt_cases, tick) for n in alternatives}
        prefill = []
        for prior, chunk in prefill_cases:
            run, (q, k, v) = K.prepare_prefill(prior, chunk, num_q_heads=hq, num_kv_heads=hkv,
                                               head_dim=d, dtype=tdtype, device=device)  # fmt: skip
            err = None
            if (prior, chunk) == prefill_cases[0]:  # check once, on the smallest case
                err = max_rel_error(run(), prefill_reference(q, k, v))
                _check("prefill-sdpa", err, dtype)
                checks["prefill-sdpa"] = err
            t = time_runner(run, **timing)
            pairs = attention_pairs(prior, chunk)
            prefill.append(Point(params={"prior_tokens": prior, "chunk_tokens": chunk},
                                 median_s=t.median_s, samples_s=t.samples_s,
                                 bytes=(2 * hq * chunk + 2 * hkv * (prior + chunk)) * d * elt,
                                 flops=4.0 * hq * d * pairs, peak_memory_bytes=t.peak_memory_bytes,
                                 max_rel_error=err))  # fmt: skip
            tick(f"prefill prior={prior} chunk={chunk}")
        gemms: dict[str, list[Point]] = {}
        for name, (k_in, n_out) in shapes.gemms.items():
            gemms[name] = []
            for tokens in grid.gemm_tokens:
                run, (x, w) = K.prepare_gemm(tokens, k_in, n_out, dtype=tdtype, device=device)
                err = None
                if tokens == grid.gemm_tokens[0]:
                    err = max_rel_error(run(), gemm_reference(x, w))
                    _check(f"gemm-{name}", err, dtype)
                    checks[f"gemm-{name}"] = err
                t = time_runner(run, **timing)
                gemms[name].append(Point(params={"tokens": tokens}, median_s=t.median_s,
                                         samples_s=t.samples_s,
                                         bytes=(tokens * k_in + k_in * n_out + tokens * n_out)
                                         * elt, flops=2.0 * tokens * k_in * n_out,
                                         peak_memory_bytes=t.peak_memory_bytes,
                                         max_rel_error=err))  # fmt: skip
                tick(f"gemm {name} T={tokens}")
    return SweepResult(primary, primary_points, alt, prefill, gemms, checks, skipped,
                       list(grid.notes))  # fmt: skip
