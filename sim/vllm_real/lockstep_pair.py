"""The comparer of the block-manager lockstep: one operation applied to both managers.

`Pair.call` applies an operation to kvsim's model and to vLLM's real manager and compares the
answer (after `_normalise`; only its `_shape` when block ids are not compared), the exception
class and the free GPU / CPU block counts; `Pair.check_tables` compares the live block tables
(length, sharing pattern and, when `compare_ids`, the ids). The first disagreement raises
`Diverged` carrying a `Divergence`; `VerifyResult` counts what was compared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sim.kv.config import KVCacheConfig
from sim.kv.types import ManagerError


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first operation on which model and real code disagreed."""

    op_index: int
    op: str
    request_id: int | None
    what: str
    model_answer: object
    real_answer: object
    model_free: tuple[int, int]
    real_free: tuple[int, int]
    config: KVCacheConfig
    history: tuple[str, ...]

    def describe(self) -> str:
        lines = [
            f"divergence at op {self.op_index}: {self.op} (request {self.request_id}): {self.what}",
            f"  model: {self.model_answer!r}   free gpu/cpu {self.model_free}",
            f"  real:  {self.real_answer!r}   free gpu/cpu {self.real_free}",
            f"  config: {self.config}",
            "  last operations of the workload:",
        ]
        lines += [f"    {h}" for h in self.history[-12:]]
        return "\n".join(lines)


@dataclass(slots=True)
class VerifyResult:
    design: str
    vllm_version: str
    num_ops: int = 0
    num_workloads: int = 0
    num_crashes: int = 0
    op_counts: dict[str, int] = field(default_factory=dict)
    #: Operations per KV-cache layout of the drawn configs ("full + chunked-local", ...).
    ops_by_layout: dict[str, int] = field(default_factory=dict)
    divergence: Divergence | None = None

    @property
    def identical(self) -> bool:
        return self.divergence is None

    def summary(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(self.op_counts.items()))
        head = (
            f"{self.design} vs vLLM {self.vllm_version}: "
            + (
                f"identical over {self.num_ops} operations"
                if self.identical
                else f"DIVERGED after {self.num_ops} operations"
            )
            + f" ({self.num_workloads} workloads, {self.num_crashes} crashes seen on both sides; {counts})"
        )
        if len(self.ops_by_layout) > 1:
            head += "; by layout: " + ", ".join(
                f"{k} {v}" for k, v in sorted(self.ops_by_layout.items())
            )
        return head if self.identical else head + "\n" + self.divergence.describe()  # type: ignore[union-attr]


class Diverged(Exception):
    """Raised by `Pair` at the first disagreement; `verify` records its `divergence`."""

    def __init__(self, divergence: Divergence) -> None:
        self.divergence = divergence


def outcome(fn: Callable[[], object]) -> tuple[str, object]:
    """("ok", value) or ("raise", exception class name; vLLM's own for a `RaisedByVllm`)."""
    try:
        return "ok", fn()
    except (
        ManagerError,
        ValueError,
        AssertionError,
        IndexError,
        KeyError,
        NotImplementedError,
        RecursionError,
    ) as exc:
        return "raise", getattr(exc, "upstream_type", type(exc).__name__)


class Pair:
    """Both managers of one episode and the comparison helpers."""

    def __init__(self, model, real, config: KVCacheConfig, compare_ids: bool, v1: bool) -> None:
        self.model, self.real, self.config = model, real, config
        self.compare_ids, self.v1 = compare_ids, v1
        self.history: list[str] = []
        self.op_index = 0
        self.result: VerifyResult | None = None
        #: The real side's outcome of the last `call` (ids may differ when not compared).
        self.last_real: tuple[str, Any] = ("ok", None)
        self.skip_swa_fork = False

    def free_counts(self, mgr) -> tuple[int, int]:
        if self.v1:
            return mgr.num_free_blocks, 0
        return mgr.get_num_free_gpu_blocks(), mgr.get_num_free_cpu_blocks()

    def fail(self, op: str, rid: int | None, what: str, a: object, b: object) -> None:
        raise Diverged(
            Divergence(
                self.op_index,
                op,
                rid,
                what,
                a,
                b,
                self.free_counts(self.model),
                self.free_counts(self.real),
                self.config,
                tuple(self.history),
            )
        )

    def call(self, op: str, rid: int | None, fn: Callable[..., Any], ids: bool = True) -> Any:
        """Apply `fn` to both managers, compare outcome and free counts; return the outcome."""
        self.op_index += 1
        self.history.append(op)
        assert self.result is not None
        kind = op.split("(", 1)[0]
        self.result.op_counts[kind] = self.result.op_counts.get(kind, 0) + 1
        self.result.num_ops += 1
        got_model = outcome(lambda: fn(self.model))
        got_real = outcome(lambda: fn(self.real))
        if got_model[0] != got_real[0]:
            self.fail(op, rid, "one side raised", got_model, got_real)
        if got_model[0] == "raise" and got_model[1] != got_real[1]:
            self.fail(op, rid, "different exceptions", got_model[1], got_real[1])
        if got_model[0] == "ok":
            a, b = _normalise(got_model[1]), _normalise(got_real[1])
            if a != b and (ids or self.compare_ids):
                if _shape(a) != _shape(b):
                    self.fail(op, rid, "different answers", a, b)
                if self.compare_ids:
                    self.fail(op, rid, "different block ids", a, b)
        if self.free_counts(self.model) != self.free_counts(self.real):
            self.fail(
                op,
                rid,
                "different free counts",
                self.free_counts(self.model),
                self.free_counts(self.real),
            )
        self.last_real = got_real
        return got_model

    def check_tables(self, seq_ids: list[int]) -> None:
        for sid in seq_ids:
            a, b = self.model.seq_block_ids(sid), self.real.seq_block_ids(sid)
            if len(a) != len(b):
                self.fail(f"table({sid})", sid, "different table lengths", a, b)
            if self.compare_ids and a != b:
                self.fail(f"table({sid})", sid, "different table ids", a, b)
            if _pattern(a) != _pattern(b):
                self.fail(f"table({sid})", sid, "different table sharing pattern", a, b)


def _normalise(value: object) -> object:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], list):
        return (list(value[0]), value[1])
    if isinstance(value, list):
        return [tuple(v) if isinstance(v, (tuple, list)) else v for v in value]
    if hasattr(value, "name") and hasattr(value, "value"):
        return value.name
    return value


def _pattern(ids: list[int]) -> list[int]:
    """Block ids relabelled by first occurrence: [7, 6, 7, 6] -> [0, 1, 0, 1] (ring reuse)."""
    first: dict[int, int] = {}
    return [first.setdefault(b, len(first)) for b in ids]


def _shape(value: object) -> object:
    """What is compared when ids are not: None-ness, lengths, enum names, bools."""
    if isinstance(value, list):
        return ("list", len(value))
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], list):
        return ("hit", len(value[0]), value[1])
    return value
