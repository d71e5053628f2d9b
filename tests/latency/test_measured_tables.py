"""Reading Vidur's profiles into the fit's tables (`sim.latency.measured_tables`), on a tiny
synthetic tree laid out like the Vidur repository (the real data is not committed)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.latency import measured_fit as mf
from sim.latency import measured_tables

ROOT = Path(__file__).resolve().parents[2]
#: A toy Llama layer: hidden 64 = 4 query heads of 16, 2 KV heads, gated MLP of 128.
GEOMETRY = dict(n_embd=64, n_head=4, n_kv_head=2, n_expanded_embd=128, use_gated_mlp=True)
MLP_OPS = (
    "attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "input_layernorm",
    "post_attention_layernorm", "attn_rope", "mlp_act", "add", "emb",
)  # fmt: skip
PHASES = (
    "schedule_median",
    "sampler_e2e_median",
    "prepare_inputs_e2e_median",
    "process_model_outputs_median",
)


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)


def _vidur_tree(root: Path) -> None:
    """One file per `SOURCES` entry; every median is 0.5 ms unless a test says otherwise."""
    for path, _ in measured_tables.SOURCES:
        name = Path(path).name
        if name == "mlp.csv":
            rows = [
                {"num_tensor_parallel_workers": tp, **GEOMETRY, "vocab_size": 1000}
                | {"num_tokens": 8}
                | {f"time_stats.{op}.median": 0.5 for op in MLP_OPS}
                for tp in (1, 2)
            ]
        elif name == "attention.csv":
            common = dict(num_tensor_parallel_workers=1, n_q_head=4, n_embd=64, n_kv_head=2)
            rows = [
                common | dict(is_prefill=False, batch_size=4, kv_cache_size=100)
                | {"prefill_chunk_size": 0, "time_stats.attn_decode.median": 0.5},
                common | dict(is_prefill=True, batch_size=1, kv_cache_size=96)
                | {"prefill_chunk_size": 32, "time_stats.attn_prefill.median": 0.25},
            ]  # fmt: skip
        elif name == "all_reduce.csv":
            keep = dict(rank=0, collective="all_reduce", devices_per_node=2, num_workers=2)
            rows = [
                keep | {"size": 1024},
                keep | {"rank": 1, "size": 1024},  # another rank's view of the same call
                keep | {"collective": "send_recv", "size": 1024},
                keep | {"devices_per_node": 1, "size": 1024},  # spans two nodes
                keep | {"size": 2**30},  # larger than a step's all-reduce
            ]
            rows = [r | {"time_stats.all_reduce.median": 0.5} for r in rows]
        else:  # cpu_overheads.csv
            rows = [
                dict(model_name="m", tensor_parallel_degree=1, batch_size=8)
                | {p: 0.1 * (i + 1) for i, p in enumerate(PHASES)}
            ]
        _write(root / path, rows)


def test_load_tables_turns_each_row_into_the_terms_features(tmp_path):
    _vidur_tree(tmp_path)
    tables = mf.load_tables(tmp_path)  # the import path scripts/ and benchmarks/ use

    pre = tables.gemm[(tables.gemm.op == "attn_pre_proj") & (tables.gemm.model == "Llama-2-7b-hf")]
    pre = pre[pre.gpu == "a100-80gb-sxm"].set_index("tp")
    # QKV at TP 2: K = 64, N = (2 query + 2 x 1 KV heads) x 16 = 64; 2 x 8 x 64 x 64 FLOPs;
    # bf16 bytes of weights and activations: 2 x (64 x 64 + 8 x 64 + 8 x 64) = 10,240.
    assert pre.loc[2, "flops"] == 65_536
    assert pre.loc[2, "bytes"] == 10_240
    assert pre.loc[1, "flops"] == 2 * 8 * 64 * 128  # TP 1: N = (4 + 2 x 2) x 16
    assert set(tables.gemm.time_s) == {0.0005}  # Vidur's milliseconds -> seconds
    assert set(tables.elementwise.kind) == {
        "norm", "rope", "activation", "residual_add", "embedding",
    }  # fmt: skip

    # Decode: 4 sequences x 100 tokens x (K and V: 2 x 2 KV heads x 16 x 2 B = 128 B) = 51,200 B.
    assert tables.decode[["batch", "context", "kv_bytes"]].values.tolist() == [[4, 100, 51_200]]
    # Prefill: the query of a 32-token chunk, 4 heads x 16 x 2 B, read and written: 8,192 B.
    assert tables.prefill[["chunk", "prior", "q_bytes"]].values.tolist() == [[32, 96, 8_192]]
    assert tables.prefill.time_s.tolist() == [0.00025]

    # All-reduce keeps rank 0's all_reduce within one node, at sizes a step can produce.
    assert tables.allreduce[["gpu", "tp", "bytes"]].values.tolist() == [
        ["a100-80gb-sxm", 2, 1024.0],
        ["h100-sxm", 2, 1024.0],
    ]
    # Overhead: the four v0 phases summed, 0.1 + 0.2 + 0.3 + 0.4 ms.
    assert tables.overhead.time_s.tolist() == [pytest.approx(0.001)]
    assert tables.raw_geometry["Meta-Llama-3-8B"] == {
        "n_embd": 64, "n_head": 4, "n_kv_head": 2, "n_expanded_embd": 128, "vocab_size": 1000,
    }  # fmt: skip


def test_load_tables_names_the_missing_file(tmp_path):
    _vidur_tree(tmp_path)
    (tmp_path / "data/profiling/a100/attention.csv").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing data/profiling/a100/attention\.csv"):
        measured_tables.load_tables(tmp_path)


@pytest.mark.parametrize(
    "module",
    [
        "calibrate/to_measured.py",
        "calibrate/profile_tables.py",
        "sim/latency/measured_fit.py",
        "sim/latency/measured_tables.py",
    ],
)
def test_measured_fit_modules_are_at_most_400_lines(module):
    assert len((ROOT / module).read_text().splitlines()) <= 400
