"""Run a disaggregated scenario: resolve each pool as its own scenario, run, build tables.

Each pool is the scenario with the pool's `gpu`, `tp` and `replicas` in place of `hardware:`
and `engine.num_replicas`, resolved by `sim.engine.run.resolve` exactly as a co-located run is, so
its KV pool is derived from its own GPU (`cache.num_gpu_blocks: derive`) and its step time
from its own GPU and TP. The link's KV bytes come from the model's geometry at the scenario's
block size and KV dtype (`sim.memory.block_bytes`, all heads: the ranks' shards summed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.catalog import get_model
from sim.cluster.config import ClusterMode, ClusterSection, PoolSection
from sim.cluster.links import get_link
from sim.engine.disagg import DisaggEngine, DisaggRecords
from sim.engine.run import resolve
from sim.kv.config import Design
from sim.memory.derive import block_bytes
from sim.output.results import RunResult, build_result
from sim.scenario.no_effect import PREFIX_ROUTER_KNOBS
from sim.scenario.release_defaults import applied
from sim.scenario.schema import Scenario, ScenarioError, load_scenario

#: The client's view of each request in a disaggregated run (`DisaggResult.requests`).
CLIENT_COLUMNS = [
    "request_id",
    "prefill_replica",
    "decode_replica",
    "arrival_s",
    "prompt_tokens",
    "max_tokens",
    "generated_tokens",
    "prefill_done_s",
    "transfer_start_s",
    "transfer_end_s",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "kv_bytes",
    "transfer_s",
    "state",
    "reason",
]


@dataclass
class DisaggResult:
    """A disaggregated run: each pool's own tables, the transfers and the client's view."""

    prefill: RunResult
    decode: RunResult
    transfers: pd.DataFrame
    requests: pd.DataFrame
    summary: dict
    inputs: dict


def pool_scenario(scenario: Scenario, pool: PoolSection) -> Scenario:
    """The scenario one pool runs: its GPU, TP and replica count, co-located inside."""
    hardware = scenario.hardware.model_copy(
        update={
            "gpu": pool.gpu if pool.gpu is not None else scenario.hardware.gpu,
            "tensor_parallel_size": pool.tp or scenario.hardware.tensor_parallel_size,
        }
    )
    engine_update: dict = {"num_replicas": pool.replicas}
    if pool.router is not None:
        engine_update["router"] = pool.router
    engine = scenario.engine.model_copy(update=engine_update)
    if engine.router != "prefix_cache_aware":
        # The prefix-cache router's knobs are for the pool that has it (`_check_disagg`):
        # their defaults here, so this pool's resolution does not refuse them as doing nothing.
        fields = type(engine).model_fields
        engine = engine.model_copy(
            update={name: fields[name].default for name in PREFIX_ROUTER_KNOBS}
        )
    scheduler = scenario.scheduler
    if scheduler.async_scheduling is None:
        # kvsim models the NIXL connector with synchronous scheduling only: a pool whose
        # release would schedule asynchronously by default (0.33.0) runs synchronously;
        # asking for async with P/D is refused (`make_v1_scheduler`).
        scheduler = scheduler.model_copy(update={"async_scheduling": False})
    return scenario.model_copy(
        update={
            "hardware": hardware,
            "engine": engine,
            "cluster": ClusterSection(),
            "scheduler": scheduler,
        }
    )


def num_gpus(scenario: Scenario) -> int:
    """GPUs the scenario uses: replicas x TP, summed over the pools when disaggregated."""
    cluster = scenario.cluster
    tp = scenario.hardware.tensor_parallel_size
    if cluster.mode is ClusterMode.CO_LOCATED:
        return scenario.engine.num_replicas * tp
    return sum(p.replicas * (p.tp or tp) for p in (cluster.prefill, cluster.decode))


def build_engine(scenario: Scenario, base_dir: str | Path = ".") -> tuple[DisaggEngine, dict]:
    """The engine of a disaggregated scenario, and the run's inputs (both pools' resolution,
    the link, the KV bytes per block, the parallel streams)."""
    cluster = scenario.cluster
    if cluster.mode is not ClusterMode.DISAGGREGATED:
        raise ScenarioError("cluster.mode: a disaggregated run needs mode 'disaggregated'")
    if scenario.scheduler.design is not Design.V1_ENGINE:
        raise ScenarioError(
            "cluster.mode: disaggregated serving models vLLM's V1 engine (NIXL connector); "
            "set scheduler.design: v1-engine"
        )
    if scenario.model is None:
        raise ScenarioError("cluster.mode: disaggregated needs a model (the KV bytes to send)")
    _check_disagg(scenario)
    if scenario.cache.cpu_offload_gib > 0:
        # One connector per replica: vLLM 0.11.0 would need a MultiConnector for both.
        raise ScenarioError(
            "cache.cpu_offload_gib: a CPU tier is not modelled with disaggregation (set 0)"
        )
    prefill = resolve(
        pool_scenario(scenario, cluster.prefill), base_dir, "cluster.prefill.replicas"
    )
    decode = resolve(pool_scenario(scenario, cluster.decode), base_dir, "cluster.decode.replicas")
    link = get_link(cluster.link)
    kv_dtype = None if scenario.cache.kv_cache_dtype == "auto" else scenario.cache.kv_cache_dtype
    one_block_bytes = block_bytes(
        get_model(scenario.model),
        block_size=applied(prefill.scenario.cache.block_size, "cache.block_size"),
        kv_dtype=kv_dtype,
    )
    tp = scenario.hardware.tensor_parallel_size
    num_streams = min(cluster.prefill.tp or tp, cluster.decode.tp or tp)
    engine = DisaggEngine(
        (prefill.engine, prefill.step_time),
        (decode.engine, decode.step_time),
        prefill.workload.requests,
        link,
        one_block_bytes,
        num_streams,
    )
    inputs = {
        "scenario": scenario.name,
        "cluster": cluster.model_dump(mode="json"),
        "link": link.model_dump(mode="json"),
        "kv_block_bytes": one_block_bytes,
        "num_streams": num_streams,
        "num_gpus": num_gpus(scenario),
        "prefill": prefill.inputs,
        "decode": decode.inputs,
    }
    return engine, inputs


def _check_disagg(scenario: Scenario) -> None:
    """Settings `kvsim disagg` would accept and do nothing with: bad input (`sim.scenario.no_effect`)."""
    if scenario.engine.kv_events:
        raise ScenarioError(
            "engine.kv_events: kvsim disagg writes no kv_events table; set it to false "
            "(kvsim run records them for a co-located V1 engine)"
        )
    if scenario.workload.kind == "sessions":
        raise ScenarioError(
            "workload.kind: sessions: kvsim disagg does not run closed-loop sessions (its "
            "turns would arrive open-loop, with no sessions table); use kvsim run"
        )
    cluster, engine = scenario.cluster, scenario.engine
    routers = {pool.router or engine.router for pool in (cluster.prefill, cluster.decode)}
    for name in PREFIX_ROUTER_KNOBS:
        default = type(engine).model_fields[name].default
        if getattr(engine, name) != default and "prefix_cache_aware" not in routers:
            raise ScenarioError(
                f"engine.{name}: only the prefix_cache_aware router reads it; neither pool "
                f"routes with it ({', '.join(sorted(routers))}), so it would do nothing"
            )


def run_disaggregated(
    scenario: Scenario | str | Path, base_dir: str | Path | None = None
) -> DisaggResult:
    """Run a scenario whose `cluster.mode` is disaggregated."""
    if not isinstance(scenario, Scenario):
        path = Path(scenario)
        scenario = load_scenario(path)
        base_dir = base_dir or path.parent
    engine, inputs = build_engine(scenario, base_dir or ".")
    return build_disagg_result(engine.run(), inputs)


def transfers_frame(records: DisaggRecords) -> pd.DataFrame:
    rows = [
        (
            t.request_id,
            t.prefill_replica,
            t.decode_replica,
            t.num_blocks,
            t.num_bytes,
            t.start_s,
            t.end_s,
            t.end_s - t.start_s,
        )
        for t in records.transfers
    ]
    columns = [
        "request_id",
        "prefill_replica",
        "decode_replica",
        "num_blocks",
        "num_bytes",
        "start_s",
        "end_s",
        "duration_s",
    ]
    frame = pd.DataFrame.from_records(rows, columns=columns)
    return frame.sort_values("request_id", kind="stable").reset_index(drop=True)


def client_frame(prefill: RunResult, decode: RunResult, transfers: pd.DataFrame) -> pd.DataFrame:
    """One row per workload request, as the client sees it: TTFT from its arrival to the
    decode side's first token; its end state is the decode side's if it got there, else the
    prefill side's (e.g. ignored, or aborted before its prefill finished)."""
    p = prefill.requests.rename(
        columns={"replica": "prefill_replica", "state": "p_state", "reason": "p_reason"}
    )
    p = p.assign(prefill_done_s=p["finish_s"].where(p["p_state"] == "finished"))
    p = p[["request_id", "prefill_replica", "arrival_s", "prompt_tokens", "prefill_done_s"]]
    p = p.join(prefill.requests[["state", "reason", "finish_s"]].add_prefix("p_"))
    d = decode.requests[
        [
            "request_id",
            "replica",
            "max_tokens",
            "generated_tokens",
            "first_token_s",
            "finish_s",
            "tpot_s",
            "state",
            "reason",
        ]
    ].rename(columns={"replica": "decode_replica"})
    t = transfers[["request_id", "start_s", "end_s", "num_bytes", "duration_s"]].rename(
        columns={
            "start_s": "transfer_start_s",
            "end_s": "transfer_end_s",
            "num_bytes": "kv_bytes",
            "duration_s": "transfer_s",
        }
    )
    frame = p.merge(d, on="request_id", how="left").merge(t, on="request_id", how="left")
    reached = frame["state"].notna()
    frame["decode_replica"] = frame["decode_replica"].fillna(-1).astype("int64")
    frame["generated_tokens"] = frame["generated_tokens"].fillna(0).astype("int64")
    frame["kv_bytes"] = frame["kv_bytes"].fillna(0).astype("int64")
    frame["finish_s"] = frame["finish_s"].where(reached, frame["p_finish_s"])
    frame["state"] = frame["state"].where(reached, frame["p_state"])
    frame["reason"] = frame["reason"].where(reached, frame["p_reason"])
    frame["ttft_s"] = frame["first_token_s"] - frame["arrival_s"]
    frame["e2e_s"] = (frame["finish_s"] - frame["arrival_s"]).where(frame["state"] == "finished")
    frame = frame.sort_values("request_id", kind="stable").reset_index(drop=True)
    return frame[CLIENT_COLUMNS]


def _pct(series: pd.Series, q: float) -> float:
    values = series.dropna().to_numpy()
    return float(np.percentile(values, q)) if len(values) else math.nan


def build_disagg_result(records: DisaggRecords, inputs: dict) -> DisaggResult:
    prefill = build_result(records.prefill)
    decode = build_result(records.decode)
    transfers = transfers_frame(records)
    requests = client_frame(prefill, decode, transfers)
    finished = requests[requests["state"] == "finished"]
    end_s = max(records.prefill.end_s, records.decode.end_s)
    counts = requests["state"].value_counts().to_dict()
    share = finished["transfer_s"] / finished["ttft_s"]
    summary = {
        "num_requests": int(len(requests)),
        "states": {k: int(counts.get(k, 0)) for k in ("finished", "ignored", "failed", "aborted")},
        "num_violations": int(len(prefill.violations) + len(decode.violations)),
        "stopped_early": records.prefill.stopped_early,
        "simulated_s": float(end_s),
        "throughput_req_per_s": float(len(finished) / end_s) if end_s > 0 else 0.0,
        "throughput_tok_per_s": float(finished["generated_tokens"].sum() / end_s)
        if end_s > 0
        else 0.0,
        "ttft_p50_s": _pct(finished["ttft_s"], 50),
        "ttft_p99_s": _pct(finished["ttft_s"], 99),
        "tpot_p50_s": _pct(finished["tpot_s"], 50),
        "tpot_p99_s": _pct(finished["tpot_s"], 99),
        "e2e_p50_s": _pct(finished["e2e_s"], 50),
        "e2e_p99_s": _pct(finished["e2e_s"], 99),
        "kv_bytes_mean": float(finished["kv_bytes"].mean()) if len(finished) else math.nan,
        "transfer_s_mean": float(finished["transfer_s"].mean()) if len(finished) else math.nan,
        "transfer_s_p99": _pct(finished["transfer_s"], 99),
        "transfer_share_of_ttft_mean": float(share.mean()) if len(share) else math.nan,
    }
    return DisaggResult(prefill, decode, transfers, requests, summary, inputs)


def combined_result(result: DisaggResult) -> RunResult:
    """One `RunResult` for tools that read a run's violations and summary (`kvsim check`):
    both pools' violations (prefill first), the client's requests, the decode pool's steps,
    and the pools' vLLM version."""
    violations = pd.concat([result.prefill.violations, result.decode.violations], ignore_index=True)
    summary = {**result.summary, "fatal_error": None}
    inputs = {**result.inputs, "vllm_version": result.inputs["prefill"].get("vllm_version")}
    return RunResult(result.requests, result.decode.steps, violations, summary, inputs)
