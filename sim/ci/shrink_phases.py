"""The phases of `kvsim shrink` over one candidate (`Shrinker`), and the first cut.

Each phase tries smaller candidates through the `Oracle` and keeps one only where the
violation kind still occurs: `cut` (the requests alive at the first violation), `ddmin` (drop
requests), `lengths` (shorten prompts, prefixes, outputs), `arrivals` (simplify arrival times)
and `pool_size` (max_model_len, then GPU and CPU blocks). `sim.ci.shrink.shrink` runs them in
rounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sim.ci.ddmin import ddmin, minimize_int
from sim.ci.shrink_candidate import Oracle, Pool, Req


class Shrinker:
    """The candidate being shrunk (`requests`, `pool`); each public method is one phase and
    keeps a smaller candidate only where `oracle` says the violation kind still occurs."""

    def __init__(self, oracle: Oracle, requests: list[Req], pool: Pool, block_size: int) -> None:
        self.oracle = oracle
        self.requests = requests
        self.pool = pool
        self.block_size = block_size

    def holds(self, requests: Sequence[Req] | None = None, pool: Pool | None = None) -> bool:
        return self.oracle(
            self.requests if requests is None else requests, self.pool if pool is None else pool
        )

    def ddmin(self) -> None:
        self.requests = ddmin(self.requests, lambda subset: self.holds(subset))

    def lengths(self) -> None:
        for i in range(len(self.requests)):
            if self.requests[i].prefix_tokens and self.holds(self._with(i, prefix_tokens=0)):
                self.requests = self._with(i, prefix_tokens=0, prefix_id=None)
            for name in ("prompt_tokens", "output_tokens", "prefix_tokens"):
                current = getattr(self.requests[i], name)
                lowest = 1 if name != "prefix_tokens" else 0
                if current <= lowest:
                    continue
                best = minimize_int(
                    current,
                    lowest,
                    lambda v, i=i, name=name: self.holds(self._with(i, **{name: v})),  # type: ignore[misc]
                )
                self.requests = self._with(i, **{name: best})

    def _with(self, i: int, **changes) -> list[Req]:
        return [r.replace(**changes) if j == i else r for j, r in enumerate(self.requests)]

    def arrivals(self) -> None:
        zero = [r.replace(arrival_s=0.0) for r in self.requests]
        if self.holds(zero):
            self.requests = zero
            return
        first_s = self.requests[0].arrival_s
        shifted = [r.replace(arrival_s=round(r.arrival_s - first_s, 9)) for r in self.requests]
        if first_s > 0 and self.holds(shifted):
            self.requests = shifted
        for i in range(len(self.requests)):
            previous = self.requests[i - 1].arrival_s if i else 0.0
            for value in (previous, math.floor(self.requests[i].arrival_s * 1000) / 1000):
                value = max(previous, value)
                if value < self.requests[i].arrival_s and self.holds(
                    self._with(i, arrival_s=value)
                ):
                    self.requests = self._with(i, arrival_s=value)
                    break

    def pool_size(self) -> None:
        longest = max(r.prompt_tokens + r.output_tokens for r in self.requests)
        self.pool = Pool(
            self.pool.num_gpu_blocks,
            self.pool.num_cpu_blocks,
            minimize_int(
                self.pool.max_model_len,
                min(longest, self.pool.max_model_len),
                lambda v: self.holds(
                    pool=Pool(self.pool.num_gpu_blocks, self.pool.num_cpu_blocks, v)
                ),
            ),
        )
        self.pool = Pool(
            minimize_int(
                self.pool.num_gpu_blocks,
                1,
                lambda v: self.holds(
                    pool=Pool(v, self.pool.num_cpu_blocks, self.pool.max_model_len)
                ),
            ),
            self.pool.num_cpu_blocks,
            self.pool.max_model_len,
        )
        self.pool = Pool(
            self.pool.num_gpu_blocks,
            minimize_int(
                self.pool.num_cpu_blocks,
                0,
                lambda v: self.holds(
                    pool=Pool(self.pool.num_gpu_blocks, v, self.pool.max_model_len)
                ),
            ),
            self.pool.max_model_len,
        )


def _first_time_s(result, kind: str) -> float | None:
    frame = result.violations
    rows = frame[frame["kind"] == kind]
    if not len(rows):
        return None
    value = rows.iloc[0]["time_s"]
    return None if value is None or value != value else float(value)


def cut(shrinker: Shrinker, first, kind: str) -> None:
    """Drop the requests that arrived after the first K violation, then those already done."""
    time_s = _first_time_s(first, kind)
    if time_s is None:
        return
    arrived = [r for r in shrinker.requests if r.arrival_s <= time_s]
    if len(arrived) < len(shrinker.requests) and shrinker.holds(arrived):
        shrinker.requests = arrived
    # Alive at the violation: arrived by then and not finished before it. The request table is
    # ordered by request id, which is the sorted arrival order the inline workload keeps.
    frame = first.requests.sort_values("request_id")
    finish_s = frame["finish_s"].to_numpy()
    alive = [
        r
        for r, done_s in zip(shrinker.requests, finish_s[: len(shrinker.requests)], strict=True)
        if not done_s < time_s
    ]
    if len(alive) < len(shrinker.requests) and shrinker.holds(alive):
        shrinker.requests = alive
