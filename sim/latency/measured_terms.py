"""The terms of the measured-efficiency step-time model, as small pure formulas.

One module holds each formula so that the fit (`sim.latency.measured_fit`), the model
(`sim.latency.measured`) and the accuracy benchmark use the same arithmetic. Every term is a
time in seconds on one tensor-parallel rank; every coefficient is fitted from public GPU
measurements (see `sim/data/steptime_coefficients.json` for values and provenance).

GEMM (a linear layer of K inputs and N outputs on T tokens):

    flops = 2 * T * K * N
    bytes = 2 * (K * N + T * K + T * N)          (bf16 weights read, activations in and out)
    t_c = flops / (compute_efficiency * peak),  t_m = bytes / (memory_efficiency * bandwidth)
    t = launch_floor + (t_c^p + t_m^p)^(1/p)     (p = blend_exponent)

The p-norm blend tends to max(t_c, t_m) as p grows and to their sum at p = 1, so a fitted p
says how much real kernels lose near the ridge point, where the hard roofline max is most
optimistic. Worked example (A100 80GB SXM: 312 TFLOP/s, 2,039 GB/s), Llama-2-7B's MLP
gate+up projection (K=4096, N=22016) at T=256 tokens, with efficiencies 0.75 / 0.85, p = 3 and
a 6 us floor: t_c = 46.17 GFLOP / 234 TFLOP/s = 197.3 us; t_m = 193.7 MB / 1,733 GB/s =
111.8 us; (197.3^3 + 111.8^3)^(1/3) = 208.6 us; + 6 us = 214.6 us (the hard max: 197.3 us).

Elementwise ops (norms, RoPE, activation, residual add, embedding): memory-bound,
t = launch_floor + bytes / (bandwidth_efficiency * bandwidth).

Decode attention (one call per layer for all decodes of the step):
t = call_floor + per_seq_s * B + kv_bytes / (bandwidth_efficiency * bandwidth); the per-call
floor and per-sequence cost are why short contexts and small batches reach a low fraction of
the bandwidth.

Prefill attention (one call per layer per chunk): a per-call floor, the query/output traffic,
and the FLOPs of whole 64 x 64 query-key tiles at a fitted fraction of peak.

All-reduce (tensor parallel, two per layer): t = latency + bytes / algbw, by TP size (algbw:
message bytes per second, what NCCL's tests call the algorithm bandwidth).
Engine overhead (CPU, once per step): t = fixed + per_seq * num_seqs, by engine generation;
V1 adds its model runner's input preparation and output sync (`V1_WORKER_STEP_S`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: A float, or a numpy array of them: the model evaluates one step, the fit whole tables.
Num = Any
#: One term's fitted coefficients by name (`sim/data/steptime_coefficients.json`).
Coefficients = Mapping[str, float]

BF16_BYTES = 2


def gemm_flops_bytes(
    tokens: float, k: float, n: float, weight_bytes: float = BF16_BYTES
) -> tuple[float, float]:
    """FLOPs and bytes of a [tokens x k] @ [k x n] GEMM, bf16 activations and `weight_bytes`
    per weight (2 B: bf16; `sim.latency.quantized`): (2TKN, wb KN + 2(TK + TN))."""
    return 2.0 * tokens * k * n, weight_bytes * k * n + BF16_BYTES * (tokens * k + tokens * n)


def blend_s(t_compute_s: Num, t_memory_s: Num, p: float) -> Num:
    """(t_c^p + t_m^p)^(1/p): a smooth max, >= max(t_c, t_m), <= their sum (p >= 1).

    Works on floats and numpy arrays. Example: blend_s(3.0, 4.0, 2.0) = 5.0.
    """
    return (t_compute_s**p + t_memory_s**p) ** (1.0 / p)


def gemm_time_s(
    flops: Num, nbytes: Num, peak_flops: float, bandwidth_Bps: float, c: Coefficients
) -> Num:
    """One GEMM call: launch floor + blend of compute and memory time (see module doc)."""
    t_c = flops / (c["compute_efficiency"] * peak_flops)
    t_m = nbytes / (c["memory_efficiency"] * bandwidth_Bps)
    return c["launch_floor_s"] + blend_s(t_c, t_m, c["blend_exponent"])


def elementwise_time_s(nbytes: Num, bandwidth_Bps: float, c: Coefficients) -> Num:
    """One memory-bound elementwise call: floor + bytes / (efficiency * bandwidth)."""
    return c["launch_floor_s"] + nbytes / (c["bandwidth_efficiency"] * bandwidth_Bps)


def elementwise_bytes(
    kind: str, tokens: Num, hidden: int, q_heads: int, kv_heads: int, head_dim: int, inter: int
) -> Num:
    """Bytes an elementwise op moves per call on one rank (bf16 reads + writes).

    norm: read and write T*h; rope: rotate q and k in place, 2*T*(Hq+Hkv)*D; activation
    (SiLU-and-mul): read 2*T*I, write T*I; residual add: read 2*T*h, write T*h; embedding: a
    gathered row written per token, 2*T*h.
    """
    per_token = {
        "norm": 2 * hidden,
        "rope": 2 * (q_heads + kv_heads) * head_dim,
        "activation": 3 * inter,
        "residual_add": 3 * hidden,
        "embedding": 2 * hidden,
    }[kind]
    return BF16_BYTES * per_token * tokens


def decode_attention_time_s(
    num_seqs: Num, kv_bytes: Num, bandwidth_Bps: float, c: Coefficients
) -> Num:
    """One decode-attention call over `num_seqs` sequences reading `kv_bytes` of K and V."""
    return (
        c["call_floor_s"]
        + c["per_seq_s"] * num_seqs
        + kv_bytes / (c["bandwidth_efficiency"] * bandwidth_Bps)
    )


#: The query x key tile the prefill kernel works in (fitted: 64 beats 128 and 256).
ATTENTION_TILE = 64


def prefill_attention_work(
    q_heads: int, head_dim: int, chunk: Num, key_len: Num
) -> tuple[Num, Num]:
    """(tile FLOPs, query bytes) of one prefill chunk attending to `key_len` keys.

    The measured kernel costs whole 64 x 64 tiles of the full rectangle (queries x keys): a
    causal count of FLOPs fits the measurements twice as badly, so masked tiles are not free.
    Query bytes are Q read plus the output written, 2 * Hq * D * 2 bytes per token.
    Example: 32 heads of 128, chunk 100 after 28 cached tokens (key_len 128): tiles 2 x 2,
    FLOPs = 4 * 32 * 128 * 128 * 128 = 268 MFLOP; query bytes = 100 * 16,384 = 1.64 MB.
    """
    tile = ATTENTION_TILE
    q_tiles = -(-chunk // tile)
    k_tiles = -(-key_len // tile)
    flops = 4.0 * q_heads * head_dim * (q_tiles * tile) * (k_tiles * tile)
    return flops, 2.0 * q_heads * head_dim * BF16_BYTES * chunk


def prefill_attention_time_s(
    flops: Num, q_bytes: Num, peak_flops: float, bandwidth_Bps: float, c: Coefficients
) -> Num:
    """One prefill-attention call: per-call floor + query traffic + tile compute."""
    return (
        c["call_floor_s"]
        + q_bytes / (c["query_bandwidth_efficiency"] * bandwidth_Bps)
        + flops / (c["compute_efficiency"] * peak_flops)
    )


def allreduce_time_s(nbytes: Num, c: Coefficients) -> Num:
    """One NCCL all-reduce of `nbytes`: latency + bytes / algbw (fitted per TP size)."""
    return c["latency_s"] + nbytes / (c["algbw_GBps"] * 1e9)


def engine_overhead_s(num_seqs: Num, c: Coefficients) -> Num:
    """CPU time per step outside the GPU work: fixed + per sequence in the batch."""
    return c["fixed_s"] + c["per_seq_s"] * num_seqs


#: V1's model-runner CPU work per step that the Vidur-derived V1 overhead (v0's schedule and
#: sampler phases, `sim/data/steptime_coefficients.json` "engine" -> "v1") leaves out, in
#: seconds; `MeasuredStepTime` adds it to the V1 engine's fixed overhead. It is what a V1 step
#: does on the CPU between one step's sampled tokens and the next step's CUDA-graph launch
#: (vLLM 0.11.0 `vllm/v1/worker/gpu_model_runner.py`: `execute_model` L2231, its
#: `_update_states` L526 and `_prepare_inputs` L923, the block table, positions and slot
#: mapping built in numpy and copied to the GPU; `_bookkeeping_sync` L2094, which waits for
#: the sampled ids with `_to_list` L2143 and builds the `ModelRunnerOutput`; then
#: `vllm/v1/engine/core.py` `step` L272-291 hands it to `update_from_output`; the same
#: methods in 0.19.1, L1054 / L1784 / L3349, and 0.33.0, L1176 / L1924 / L3434). The GPU idles
#: through all of it when scheduling is synchronous (`scheduler.async_scheduling: false`, the
#: 0.11.0 default); with async scheduling (the default from 0.19.1 on) the batch queue runs
#: it while the previous step is on the GPU, and `sim.latency.overlap` overlaps it with the
#: GPU terms like the rest of the overhead.
#:
#: FITTED, not measured: 2.25 ms is the value on a 0.25 ms grid (0-2.5 ms) with the smallest
#: median |TPOT/ITL error| on the fit half of the dense serving points, 6.52% on the 22 fit
#: points since tt340's Qwen3-1.7B rows joined (14.66% without the term since the
#: 2026-12-06 audit's ISL - 1 prompts, 14.65% before, 7.34% at 1.75 ms,
#: 6.66% at 2.0 ms, 8.03% at 2.5 ms); 5.92% on the 18 before them (14.75%, 6.78%, 6.46%,
#: 6.34%; at the refit 14.62%, 6.73%, 6.40%, 6.25%; `python
#: benchmarks/serving_accuracy.py --fit-overhead`, 18 replayed points of 6 sources; the MoE
#: points are left out, their GPU terms being refitted separately, and so is the one
#: `--enforce-eager` point, whose kernels launch from Python one by one). It was 1.75 ms until
#: 2026-12-05, the same fit on 15 points of 5 sources (6.2%, 15.0% without the term, 2.0 ms
#: tying), before the warm servers (`server_history`) and tt143's three fit points were
#: replayed. The held-out half is its test (docs/accuracy.md). One value for every V1
#: release: the replayable batch-1 points all run synchronously (real vLLM 0.9-0.10, under the
#: 0.11.0 pin), so the data cannot tell one release's cost from another's; the releases differ
#: in whether it is hidden, which async scheduling decides.
#:
#: Worked example: Qwen3-0.6B on an A100 at batch 1 (192 tokens of context), synchronous V1:
#: GPU terms 2.08 ms + engine overhead (0.607 + 0.021 ms from Vidur, + 2.25 ms here) =
#: 4.96 ms a step, where tenstorrent/tt-inference-server#340 measured a 4.2 ms TPOT (without
#: this term: 2.71 ms; at the first fit's 1.75 ms: 4.46 ms). Its form was tested against
#: per-layer launches overlapped with the GPU (`sim.latency.worker_form`, forms B and C,
#: pre-registered with a 0.5-point rule): neither fits the fit half better (5.92% each, at
#: c = 50 us, where the launches hide and they replay as this term does), so it stays fixed.
#: What it leaves out: the cost's growth with the batch beyond Vidur's per-sequence phases,
#: and eager mode (`--enforce-eager`), where the launches themselves cost more than this.
V1_WORKER_STEP_S = 2.25e-3
