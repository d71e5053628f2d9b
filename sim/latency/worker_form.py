"""The form of V1's per-step worker CPU cost: a fixed term, or per-layer launches the GPU hides.

`sim.latency.measured_terms.V1_WORKER_STEP_S` adds a fixed CPU time to every synchronous V1
step. This module holds the alternatives compared with it and the arithmetic they share with
`MeasuredStepTime`; a `WorkerForm` passed to its constructor picks the one a model uses (the
default, `SHIPPED_WORKER_FORM`, is form A), and an optional `GpuFloors` passed beside it
records the GPU time of every step it prices (what benchmarks/worker_forms.py compares the
launches with).

What the code does. vLLM V1 compiles the model with the attention ops as splitting ops
(0.10.1.1 `vllm/config/compilation.py` `_attention_ops` L335, `set_splitting_ops_for_v1`
L533-547; 0.11.0 L354-364 and L567-596), so `split_graph` (0.10.1.1
`vllm/compilation/backends.py` L232, a `PiecewiseBackend` per piece at L343) cuts each layer
into CUDA-graph pieces with the layer's attention run eagerly between them; a piece's replay
is `CUDAGraphWrapper.__call__` (0.10.1.1 `vllm/compilation/cuda_graph.py` L106-193, the
`replay()` at L192). Under PIECEWISE the CPU therefore launches one piece and one attention
call per layer while the GPU runs the earlier ones: the launches overlap the GPU work and cost
time only where they outrun it. Which steps run that way depends on the release:

* through 0.10.x the V1 default `cudagraph_mode` is PIECEWISE (0.10.1.1
  `vllm/config/__init__.py` L3554-3560): every step, decode included, launches per layer;
* from 0.11.0 the default is FULL_AND_PIECEWISE (0.11.0 `vllm/config/__init__.py` L359-376;
  0.19.1 `vllm/config/vllm.py` L215 / L234; 0.33.0 L311 / L332): a uniform decode batch up to
  the largest capture size replays one FULL graph (`vllm/v1/cudagraph_dispatcher.py`
  `dispatch` L111-121, chosen in `gpu_model_runner.py` L2271-2278), so its per-layer launches
  vanish; steps with a prefill chunk stay PIECEWISE. FlashAttention 2 (A100) keeps that FULL
  decode graph (`vllm/v1/attention/backends/flash_attn.py` L171-175, UNIFORM_BATCH).

kvsim's serving points were mostly measured on 0.8-0.10 servers (PIECEWISE decode) but are
replayed under the 0.11.0 pin (FULL decode graphs), so the data and the pin disagree on the
decode step; the forms below say which side each one follows.

The forms (pre-registered 2026-12-05, before any fit of forms B or C was run; at most two
fitted parameters each):

A. FIXED (the shipped form): sync step = GPU + Vidur overhead + P. One parameter,
   P = `V1_WORKER_STEP_S`; fit-half score 6.52% at 2.25 ms on 22 points (`--fit-overhead`).
B. LAYER_LAUNCH (the 0.8-0.10 servers' PIECEWISE decode): sync step = Vidur overhead + P +
   graph launch + max(GPU, L x c) on every V1 step; P = `V1_WORKER_STEP_S` (input prep and
   output sync), c = `WorkerForm.layer_launch_s` (one layer's piece and attention launch, CPU).
C. LAYER_LAUNCH_MIXED (what the pinned code does): as B, but only a step with a prefill chunk
   launches per layer; a decode-only step is one FULL graph, as in A.

Under async scheduling P and the Vidur overhead overlap the GPU as before
(`sim.latency.overlap`); the exposed launch time does not (the forward pass's own thread
issues the launches). c = 0 makes B and C equal to A.

Grids (exact decimal values): B: P in 0, 0.25, ..., 2.5 ms x c in 50, 75, 100, 125, 150 us
(at small c the launches hide behind every step's kernels and B is A: the 0.6B's 1.99 ms
batch-1 decode kernels on an A100 hide up to 71 us a layer);
C: P in 1.75, 2.0, 2.25, 2.5 ms x c in 50, 100, 150 us (C differs from A only on steps with
a prefill chunk, so its P stays near A's).

Decision rule: the objective and points of `--fit-overhead` (median |TPOT/ITL error| over
the fit half's dense, non-eager points). A new form is adopted only if its best fit-half
score is at least 0.5 percentage points below A's; if both qualify, the lower score. The
held-out half is reported whatever it shows and decides nothing.

Worked example (form B, Qwen3-0.6B on an A100, batch 1 at 192 tokens, 28 layers): the
kernels take 1.99 ms (2.08 ms with the CUDA-graph launch); c = 100 us gives L x c = 2.8 ms
of launches, 0.81 ms more than the kernels, so the step is 0.63 ms (Vidur) + P + 0.09 ms
(graph launch) + 2.8 ms; Qwen3-14B (40 layers, ~21 ms of kernels) hides its 4.0 ms of
launches entirely and pays what form A charges.

Result (2026-12-05; `python benchmarks/serving_accuracy.py --fit-overhead --forms`): A 5.92%
at 2.25 ms; B best 5.92% at P = 2.25 ms, c = 50 us; C best 5.92% at the same (both: the
launches hide behind every fit point's steps and the replay is A's). No new form is 0.5
points better, so A stays the default; held out, B and C at their best give A's table.

Left out: eager steps (`--enforce-eager`, or a decode batch above the largest capture size),
whose launches are per kernel, not per layer (form B's arithmetic on every eager step, fitted
on one public figure, missed the held-out eager point by +48%: docs/accuracy.md, "Eager mode");
the launch cost's growth with the batch.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field


class WorkerCpuForm(enum.Enum):
    """How V1's model-runner CPU time enters a step (the module doc's forms A, B, C)."""

    FIXED = "fixed"
    LAYER_LAUNCH = "layer_launch"
    LAYER_LAUNCH_MIXED = "layer_launch_mixed"


#: The first release whose default `cudagraph_mode` is FULL_AND_PIECEWISE, under which a
#: decode-only step replays one FULL graph (form C's premise; every pin kvsim has is at or
#: above it; checked against each pin's own config code by
#: tests/vllm_real/test_cudagraph_mode_lockstep.py).
FULL_DECODE_GRAPH_RELEASE = (0, 11)


@dataclass(frozen=True, slots=True)
class WorkerForm:
    """The form of a V1 model's per-step worker CPU cost and its parameters.

    `layer_launch_s` is forms B and C's c, the CPU time to launch one layer's CUDA-graph piece
    and attention call (0.0 makes them form A); `worker_step_s`, when set, is P, the model
    runner's fixed per-step CPU time, in place of the coefficients' `worker_step_s` or
    `measured_terms.V1_WORKER_STEP_S` (None: theirs). Example: WorkerForm(LAYER_LAUNCH,
    100e-6) on a 28-layer model charges up to 28 x 100 us = 2.8 ms of launches a step.
    """

    form: WorkerCpuForm = WorkerCpuForm.FIXED
    layer_launch_s: float = 0.0
    worker_step_s: float | None = None


#: The form `MeasuredStepTime` uses unless told otherwise: A, the fixed term (module doc).
SHIPPED_WORKER_FORM = WorkerForm()


@dataclass(slots=True)
class GpuFloors:
    """Per layer count, the least GPU kernel time of the steps a model priced (seconds): over
    every step, and over the steps with a prefill chunk (what forms B and C compare L x c
    with). A `MeasuredStepTime` given one records every step it prices into it."""

    every_step: dict[int, float] = field(default_factory=dict)
    prefill_steps: dict[int, float] = field(default_factory=dict)

    def record(self, num_layers: int, gpu_s: float, has_prefill_chunk: bool) -> None:
        """Lower the floors of `num_layers` to `gpu_s` where it is below them."""
        if gpu_s < self.every_step.get(num_layers, math.inf):
            self.every_step[num_layers] = gpu_s
        if has_prefill_chunk and gpu_s < self.prefill_steps.get(num_layers, math.inf):
            self.prefill_steps[num_layers] = gpu_s


def launches_per_layer(form: WorkerCpuForm, has_prefill_chunk: bool) -> bool:
    """Whether a step of this form pays per-layer launches: B always, C with a prefill chunk
    (a PIECEWISE step under FULL_AND_PIECEWISE), A never."""
    if form is WorkerCpuForm.LAYER_LAUNCH:
        return True
    return form is WorkerCpuForm.LAYER_LAUNCH_MIXED and has_prefill_chunk


def exposed_launch_s(launch_total_s: float, gpu_s: float) -> float:
    """The per-layer launch time the GPU does not hide: max(0, L x c - GPU).

    Example: 28 layers x 100 us = 2.8 ms against 1.99 ms of GPU work -> 0.81 ms;
    against 21 ms -> 0.0.
    """
    return launch_total_s - gpu_s if launch_total_s > gpu_s else 0.0
