"""Vidur's public GPU profiles -> the tidy tables the measured step-time model is fitted on.

Reads the raw CSVs (a directory laid out like the Vidur repository, `data/profiling/...`; see
`SOURCES` for the files and commits) and turns each row into the quantities the model's terms
take (`sim.latency.measured_terms`): FLOPs and bytes per GEMM, bytes per elementwise op, KV
bytes per decode-attention call, FLOPs and query bytes per prefill-attention call. The fit of
those tables is `sim.latency.measured_fit`.

Vidur's data (github.com/microsoft/vidur, MIT licence) was measured in 2024 with the
Sarathi-Serve kernels; times are medians in milliseconds, per layer on one TP rank (the tables
hold seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sim.latency import measured_terms as terms

#: (path in the Vidur repository, commit) of every file the fit reads.
SOURCES: tuple[tuple[str, str], ...] = (
    *(
        (f"data/profiling/compute/{gpu}/meta-llama/{m}/mlp.csv", "7d47513")
        for gpu, models in (
            ("a100", ("Llama-2-7b-hf", "Llama-2-70b-hf", "Meta-Llama-3-8B", "Meta-Llama-3-70B")),
            ("h100", ("Llama-2-7b-hf", "Llama-2-70b-hf")),
        )
        for m in models
    ),
    ("data/profiling/network/a100_dgx/all_reduce.csv", "7d47513"),
    ("data/profiling/network/h100_dgx/all_reduce.csv", "7d47513"),
    ("data/profiling/a100/attention.csv", "e2d00e9"),
    ("data/profiling/a100/cpu_overheads.csv", "6d98aa8"),
)

#: Vidur's device names -> kvsim catalog GPUs (Vidur's A100/H100 nodes are 80 GB DGX/SXM parts).
VIDUR_GPU = {"a100": "a100-80gb-sxm", "h100": "h100-sxm"}

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = {
    "input_layernorm": "norm",
    "post_attention_layernorm": "norm",
    "attn_rope": "rope",
    "mlp_act": "activation",
    "add": "residual_add",
    "emb": "embedding",
}


@dataclass
class Tables:
    """The measurements as tidy frames, one row per (configuration, op), times in seconds."""

    gemm: pd.DataFrame  # gpu, model, tp, op, tokens, flops, bytes, time_s
    elementwise: pd.DataFrame  # gpu, model, tp, op, kind, tokens, bytes, time_s
    decode: pd.DataFrame  # gpu, batch, context, kv_bytes, time_s
    prefill: pd.DataFrame  # gpu, chunk, prior, flops, q_bytes, time_s
    allreduce: pd.DataFrame  # gpu, tp, bytes, time_s
    overhead: pd.DataFrame  # model, tp, batch, time_s
    #: Per Vidur model: n_embd, n_head, n_kv_head, n_expanded_embd, vocab_size (from mlp.csv).
    raw_geometry: dict[str, dict[str, int]]


def _geometry(row: pd.Series, tp: int) -> dict[str, int]:
    hidden, heads = int(row.n_embd), int(row.n_head)
    head_dim = hidden // heads
    return {
        "hidden": hidden,
        "q_heads": heads // tp,
        "kv_heads": max(1, int(row.n_kv_head) // tp),
        "head_dim": head_dim,
        "inter": int(row.n_expanded_embd) // tp,
        "gated": bool(row.use_gated_mlp),
    }


def gemm_shapes(g: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(K, N) per rank of the four GEMMs of a Llama layer: QKV, O, gate+up, down."""
    h, d = g["hidden"], g["head_dim"]
    return {
        "attn_pre_proj": (h, (g["q_heads"] + 2 * g["kv_heads"]) * d),
        "attn_post_proj": (g["q_heads"] * d, h),
        "mlp_up_proj": (h, (2 if g["gated"] else 1) * g["inter"]),
        "mlp_down_proj": (g["inter"], h),
    }


_GEOMETRY_COLUMNS = ("n_embd", "n_head", "n_kv_head", "n_expanded_embd", "vocab_size")


def _load_mlp(path: Path, gpu: str, model: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    raw = pd.read_csv(path)
    gemm_rows, ew_rows = [], []
    for (tp,), part in raw.groupby(["num_tensor_parallel_workers"]):
        g = _geometry(part.iloc[0], int(tp))
        tokens = part.num_tokens.to_numpy(dtype=float)
        for op, (k, n) in gemm_shapes(g).items():
            flops, nbytes = terms.gemm_flops_bytes(tokens, k, n)
            time_s = part[f"time_stats.{op}.median"].to_numpy() * 1e-3
            gemm_rows.append(
                pd.DataFrame(
                    dict(gpu=gpu, model=model, tp=int(tp), op=op, tokens=tokens, flops=flops)
                    | dict(bytes=nbytes, time_s=time_s)
                )
            )
        for op, kind in ELEMENTWISE_OPS.items():
            args = (g["hidden"], g["q_heads"], g["kv_heads"], g["head_dim"], g["inter"])
            nbytes = terms.elementwise_bytes(kind, tokens, *args)
            time_s = part[f"time_stats.{op}.median"].to_numpy() * 1e-3
            ew_rows.append(
                pd.DataFrame(
                    dict(gpu=gpu, model=model, tp=int(tp), op=op, kind=kind, tokens=tokens)
                    | dict(bytes=nbytes, time_s=time_s)
                )
            )
    return pd.concat(gemm_rows), pd.concat(ew_rows)


def _load_attention(path: Path, gpu: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    raw = pd.read_csv(path)
    first = raw.iloc[0]
    tp = int(first.num_tensor_parallel_workers)
    heads, head_dim = int(first.n_q_head) // tp, int(first.n_embd) // int(first.n_q_head)
    kv_tok = 2 * max(1, int(first.n_kv_head) // tp) * head_dim * terms.BF16_BYTES
    dec = raw[~raw.is_prefill.astype(bool)]
    decode = pd.DataFrame(
        dict(gpu=gpu, batch=dec.batch_size.to_numpy(), context=dec.kv_cache_size.to_numpy())
        | dict(time_s=dec["time_stats.attn_decode.median"].to_numpy() * 1e-3)
    )
    decode["kv_bytes"] = decode.batch * decode.context * float(kv_tok)
    pre = raw[raw.is_prefill.astype(bool)]
    chunk, prior = pre.prefill_chunk_size.to_numpy(float), pre.kv_cache_size.to_numpy(float)
    flops, q_bytes = terms.prefill_attention_work(heads, head_dim, chunk, prior + chunk)
    prefill = pd.DataFrame(
        dict(gpu=gpu, chunk=chunk, prior=prior, flops=flops, q_bytes=q_bytes)
        | dict(time_s=pre["time_stats.attn_prefill.median"].to_numpy() * 1e-3)
    )
    return decode, prefill


def _load_allreduce(path: Path, gpu: str) -> pd.DataFrame:
    raw = pd.read_csv(path)
    # One NVLink/NVSwitch node: the GPUs of the all-reduce are all on one node.
    raw = raw[(raw["rank"] == 0) & (raw.collective == "all_reduce")]
    raw = raw[raw.devices_per_node == raw.num_workers]
    # `size` is bytes (Vidur writes 2 * fp16 elements); keep sizes a step can produce.
    raw = raw[raw["size"] <= 2**29]
    return pd.DataFrame(
        dict(gpu=gpu, tp=raw.num_workers.to_numpy(), bytes=raw["size"].to_numpy(float))
        | dict(time_s=raw["time_stats.all_reduce.median"].to_numpy() * 1e-3)
    )


#: The v0-era per-step CPU phases in cpu_overheads.csv (Ray's inter-worker time excluded).
OVERHEAD_PHASES = (
    "schedule_median",
    "sampler_e2e_median",
    "prepare_inputs_e2e_median",
    "process_model_outputs_median",
)


def _load_overheads(path: Path) -> pd.DataFrame:
    raw = pd.read_csv(path)
    return pd.DataFrame(
        dict(model=raw.model_name, tp=raw.tensor_parallel_degree, batch=raw.batch_size)
        | dict(time_s=raw[list(OVERHEAD_PHASES)].sum(axis=1) * 1e-3)
    )


def load_tables(root: str | Path) -> Tables:
    """Every source file under `root` (a Vidur checkout or an export of `SOURCES`)."""
    root = Path(root)
    missing = [p for p, _ in SOURCES if not (root / p).is_file()]
    if missing:
        raise FileNotFoundError(f"{root}: missing {missing[0]} (and {len(missing) - 1} more)")
    gemm, ew, geometry = [], [], {}
    for path, _ in SOURCES:
        parts = Path(path).parts
        if parts[-1] == "mlp.csv":
            g, e = _load_mlp(root / path, VIDUR_GPU[parts[3]], parts[-2])
            gemm.append(g)
            ew.append(e)
            first = pd.read_csv(root / path, nrows=1).iloc[0]
            geometry[parts[-2]] = {k: int(first[k]) for k in _GEOMETRY_COLUMNS}
    decode, prefill = _load_attention(root / "data/profiling/a100/attention.csv", "a100-80gb-sxm")
    allreduce = pd.concat(
        _load_allreduce(root / f"data/profiling/network/{g}_dgx/all_reduce.csv", VIDUR_GPU[g])
        for g in ("a100", "h100")
    )
    overhead = _load_overheads(root / "data/profiling/a100/cpu_overheads.csv")
    return Tables(
        pd.concat(gemm, ignore_index=True),
        pd.concat(ew, ignore_index=True),
        decode,
        prefill,
        allreduce.reset_index(drop=True),
        overhead,
        geometry,
    )
