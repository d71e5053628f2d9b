"""The calibration grid: which cases to time, derived from a model geometry, sized by a budget.

Levels follow what a scheduler produces: decode batches of 1..max_num_seqs sequences at
contexts of a few blocks up to the model's context; prefill chunks up to the token budget after
0..long prior contexts; GEMMs at every power-of-two token count up to the token budget. A case
whose KV (plus the naive kernel's gathered copy) exceeds `max_case_bytes` is left out.

Sizing: each case's time is estimated from measured ceilings (copy bandwidth, matmul FLOP/s)
as `max(bytes / bw, flops / peak) + per-call overhead`, times (warm-up + repeats), plus setup.
While the estimate exceeds the budget, repeats drop (to `min_repeats`), then the longest level
list loses every second interior level (ends are kept so the fits never extrapolate far).

Example: budget 5 s on a 2-core CPU with a 2-layer toy model keeps ~3 x 3 decode cases.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sim.catalog import ModelSpec, kv_heads_per_rank
from sim.errors import InputError


@dataclass(frozen=True, slots=True)
class Grid:
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    prefill_chunks: tuple[int, ...]
    prefill_priors: tuple[int, ...]
    gemm_tokens: tuple[int, ...]
    warmup: int = 3
    repeats: int = 20
    max_case_bytes: int = 8 << 30
    estimated_s: float = 0.0
    notes: tuple[str, ...] = field(default=())

    def decode_cases(self, kv_bytes_per_token: int) -> list[tuple[int, int]]:
        """(num_seqs, context per seq) pairs that fit `max_case_bytes` (x2 for the copy)."""
        return [
            (b, c)
            for b in self.decode_batches
            for c in self.decode_contexts
            if 2 * b * c * kv_bytes_per_token <= self.max_case_bytes
        ]

    def prefill_cases(self) -> list[tuple[int, int]]:
        return [(p, c) for p in self.prefill_priors for c in self.prefill_chunks]


def _powers(lo: int, hi: int) -> tuple[int, ...]:
    out, x = [], lo
    while x <= hi:
        out.append(x)
        x *= 2
    return tuple(out)


def _thin(levels: tuple[int, ...]) -> tuple[int, ...]:
    """Drop every second interior level: (1, 2, 4, 8, 16) -> (1, 4, 16)."""
    if len(levels) <= 2:
        return levels
    kept = levels[::2]
    return kept if kept[-1] == levels[-1] else (*kept, levels[-1])


@dataclass(frozen=True, slots=True)
class Ceilings:
    bandwidth_Bps: float
    flops: float
    call_overhead_s: float  # per kernel launch / Python call


@dataclass(frozen=True, slots=True)
class CaseCosts:
    """Estimated wall time of one timed case (warm-up + repeats + setup), by kind of case."""

    model: ModelSpec
    tp: int
    dtype_bytes: int
    ceilings: Ceilings
    calls: int  # warm-up + repeats

    def decode_s(self, num_seqs: int, context: int) -> float:
        hkv = kv_heads_per_rank(self.model.num_kv_heads, self.tp)
        hq = max(1, self.model.num_attention_heads // self.tp)
        d = self.model.head_dim
        kv_tok = 2 * hkv * d * self.dtype_bytes
        bw, fl, oh = self.ceilings.bandwidth_Bps, self.ceilings.flops, self.ceilings.call_overhead_s
        b, c = num_seqs, context
        one = max(3 * b * c * kv_tok / bw, 4 * hq * d * b * c / fl) + oh
        setup = 4 * b * c * kv_tok / bw + 20 * oh
        return self.calls * one + setup

    def prefill_s(self, prior: int, chunk: int) -> float:
        hkv = kv_heads_per_rank(self.model.num_kv_heads, self.tp)
        hq = max(1, self.model.num_attention_heads // self.tp)
        d = self.model.head_dim
        kv_tok = 2 * hkv * d * self.dtype_bytes
        bw, fl, oh = self.ceilings.bandwidth_Bps, self.ceilings.flops, self.ceilings.call_overhead_s
        pairs = chunk * (prior + chunk / 2)
        # Attention kernels reach a fraction of matmul peak; 0.25 keeps the estimate safe.
        one = 4 * hq * d * pairs / (0.25 * fl) + (prior + chunk) * kv_tok / bw + oh
        return self.calls * one + 20 * oh

    def gemms_s(self, tokens: int) -> float:
        """All five GEMMs of a layer (and lm_head) at `tokens` tokens: they are timed together."""
        m, tp = self.model, self.tp
        hkv = kv_heads_per_rank(m.num_kv_heads, tp)
        hq = max(1, m.num_attention_heads // tp)
        d, h, i, v = m.head_dim, m.hidden_size, m.intermediate_size, m.vocab_size
        shapes = [
            (h, (hq + 2 * hkv) * d),
            (hq * d, h),
            (h, 2 * i // tp),
            (i // tp, h),
            (h, v // tp),
        ]
        bw, fl, oh = self.ceilings.bandwidth_Bps, self.ceilings.flops, self.ceilings.call_overhead_s
        total = 0.0
        for k, n in shapes:
            one = max(
                2 * tokens * k * n / fl, (tokens * k + k * n + tokens * n) * self.dtype_bytes / bw
            )
            total += self.calls * (one + oh) + 20 * oh
        return total


def estimate_s(grid: Grid, model: ModelSpec, *, tp: int, dtype_bytes: int, ceilings: Ceilings,
               num_decode_kernels: int = 1) -> float:  # fmt: skip
    """Estimated wall time of the whole sweep (see module docstring)."""
    costs = CaseCosts(model, tp, dtype_bytes, ceilings, grid.warmup + grid.repeats)
    kv_tok = 2 * kv_heads_per_rank(model.num_kv_heads, tp) * model.head_dim * dtype_bytes
    total = num_decode_kernels * sum(costs.decode_s(b, c) for b, c in grid.decode_cases(kv_tok))
    total += sum(costs.prefill_s(p, c) for p, c in grid.prefill_cases())
    return total + sum(costs.gemms_s(t) for t in grid.gemm_tokens)


def build_grid(
    model: ModelSpec,
    *,
    budget_s: float,
    ceilings: Ceilings,
    tp: int = 1,
    block_size: int = 16,
    dtype_bytes: int = 2,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    max_context_tokens: int = 32768,
    max_case_bytes: int = 8 << 30,
    min_repeats: int = 5,
    num_decode_kernels: int = 1,
) -> Grid:
    """The largest grid whose estimated time fits `budget_s` (see module docstring)."""
    if budget_s <= 0:
        raise InputError(f"--budget {budget_s}: must be positive (seconds)")
    max_ctx = min(model.max_position_embeddings, max_context_tokens)
    budget_tokens = min(max_num_batched_tokens, max_ctx)
    grid = Grid(
        decode_batches=_powers(1, max_num_seqs),
        decode_contexts=_powers(4 * block_size, max_ctx),
        prefill_chunks=_powers(max(16, block_size), budget_tokens),
        prefill_priors=tuple(p for p in (0, 1024, 4096, 16384) if p + 16 <= max_ctx),
        gemm_tokens=_powers(1, budget_tokens),
        max_case_bytes=max_case_bytes,
    )

    def cost(g: Grid) -> float:
        return estimate_s(g, model, tp=tp, dtype_bytes=dtype_bytes, ceilings=ceilings,
                          num_decode_kernels=num_decode_kernels)  # fmt: skip

    notes: list[str] = []
    while cost(grid) > budget_s and grid.repeats > min_repeats:
        grid = replace(grid, repeats=max(min_repeats, grid.repeats // 2))
    fields = ("decode_contexts", "decode_batches", "prefill_chunks", "gemm_tokens",
              "prefill_priors")  # fmt: skip
    while cost(grid) > budget_s:
        longest = max(fields, key=lambda f: len(getattr(grid, f)))
        levels = getattr(grid, longest)
        if len(levels) > 3:
            grid = replace(grid, **{longest: _thin(levels)})
            continue
        # Every list is short: drop the top decode context, then the top chunk (largest cost).
        if len(grid.decode_contexts) > 2:
            grid = replace(grid, decode_contexts=grid.decode_contexts[:-1])
        elif len(grid.prefill_chunks) > 2:
            grid = replace(grid, prefill_chunks=grid.prefill_chunks[:-1])
        elif len(grid.decode_batches) > 2:
            grid = replace(grid, decode_batches=grid.decode_batches[:-1])
        else:
            smaller = _lower_top_level(grid, cost)
            if smaller is None and (grid.warmup, grid.repeats) != (1, 3):
                # Last resort (a large model on a CPU): fewer calls per case.
                smaller = replace(grid, warmup=1, repeats=3)
                notes.append("budget: 1 warm-up and 3 repeats per case")
            if smaller is None:
                notes.append("budget too small for the minimal grid; running it anyway")
                break
            grid = smaller
    if grid.gemm_tokens[-1] < budget_tokens or grid.decode_contexts[-1] < max_ctx:
        notes.append(
            f"levels capped to fit the budget: contexts <= {grid.decode_contexts[-1]}, "
            f"GEMM tokens <= {grid.gemm_tokens[-1]}, chunks <= {grid.prefill_chunks[-1]} "
            f"(larger cases are extrapolated)"
        )
    return replace(grid, estimated_s=cost(grid), notes=tuple(notes))


#: The level lists `_lower_top_level` may shrink, with the smallest top level each keeps.
_LOWEST_TOP = {
    "decode_contexts": 128,
    "decode_batches": 2,
    "prefill_chunks": 32,
    "prefill_priors": 64,  # two priors at least: the prefill fit has three features
    "gemm_tokens": 2,
}


def _lower_top_level(grid: Grid, cost) -> Grid | None:
    """The grid with the top level of one list halved (or dropped), whichever saves the most.

    Used once every list is down to two or three levels and the grid still does not fit: the
    ends were kept so the fits interpolate, but on a slow device (a CPU) the largest cases alone
    can take minutes. Example: GEMM tokens (1, 256, 8192) -> (1, 256, 4096) -> ... -> (1, 256,
    512) -> (1, 256) -> (1, 128). Every list keeps two levels (the fits need them); None when
    nothing can shrink.
    """
    best: tuple[float, Grid] | None = None
    for name, lowest in _LOWEST_TOP.items():
        levels = getattr(grid, name)
        top = levels[-1] // 2
        if len(levels) < 2 or top < lowest:
            continue
        if top > levels[-2]:
            candidate = (*levels[:-1], top)
        elif len(levels) > 2:
            candidate = levels[:-1]
        else:
            continue  # two levels: the top one cannot halve past the bottom one
        smaller = replace(grid, **{name: candidate})
        saved = cost(smaller)
        if best is None or saved < best[0]:
            best = (saved, smaller)
    return best[1] if best is not None else None
