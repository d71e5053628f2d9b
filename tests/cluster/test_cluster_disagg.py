"""Prefill/decode disaggregation (`sim.cluster`): link arithmetic, the NIXL-style hand-off,
accounting on both sides, the audit, invariants over random workloads and fuzz cases."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.catalog import get_model
from sim.ci.fuzz_cases import generate_disagg_case
from sim.cluster.capacity import gpus_needed
from sim.cluster.compare import Slo
from sim.cluster.links import get_link, kv_transfer_bytes, link_names, transfer_time_s
from sim.cluster.pd_connector import DecodeSide, PrefillSide, TransferLedger
from sim.cluster.run import build_disagg_result, build_engine, run_disaggregated
from sim.engine.run import run
from sim.errors import InputError
from sim.kv.types import TokenContent
from sim.memory.derive import block_bytes
from sim.scenario.overrides import apply_overrides
from sim.scenario.schema import Scenario, ScenarioError, load_scenario, scenario_from_dict
from sim.scheduler import Request, RequestState

ROOT = Path(__file__).resolve().parents[2]
LINEAR = {"linear": {"fixed_s": 0.01}}
TERMINAL = {"finished", "ignored", "failed", "aborted"}
ONE = [{"arrival_s": 0.0, "prompt_tokens": 8, "output_tokens": 2}]


def _scenario(requests: list[dict], **cluster) -> dict:
    return {
        "name": "pd-test",
        "model": "llama-3.1-8b",
        "cache": {"block_size": 16, "num_gpu_blocks": 40, "num_cpu_blocks": 0},
        "scheduler": {"design": "v1-engine", "vllm_version": "0.11.0", "max_model_len": 512},
        "engine": {"audit_level": "full"},
        "cluster": {"mode": "disaggregated", **cluster},
        "workload": {"kind": "inline", "requests": requests},
        "step_time": LINEAR,
    }


# ---------------------------------------------------------------- link arithmetic
def test_transfer_time_worked_example():
    """Llama-3.1-8B bf16, bs 16, a 2,000-token prompt over rdma-400g (the links.py example)."""
    one_block = block_bytes(get_model("llama-3.1-8b"), block_size=16)
    assert one_block == 2 * 32 * 8 * 128 * 2 * 16 == 2_097_152
    num_bytes = kv_transfer_bytes(2000, 16, one_block)
    assert num_bytes == 125 * 2_097_152 == 262_144_000
    link = get_link("rdma-400g")
    assert link.effective_Bps == pytest.approx(400e9 / 8 * 0.9)
    assert transfer_time_s(num_bytes, link) == pytest.approx(262_144_000 / 45e9 + 20e-6)
    assert transfer_time_s(num_bytes, link) == pytest.approx(5.845e-3, abs=1e-6)
    assert transfer_time_s(num_bytes, link, 2) == pytest.approx(2.933e-3, abs=1e-6)


def test_partial_last_block_moves_whole():
    assert kv_transfer_bytes(17, 16, 100) == 200
    assert kv_transfer_bytes(16, 16, 100) == 100


def test_every_catalog_link_names_a_source_listed_in_the_file():
    text = (ROOT / "sim" / "data" / "links.yaml").read_text()
    for name in link_names():
        assert f"[{get_link(name).source}]" in text


def test_unknown_link_is_one_line_input_error():
    with pytest.raises(ScenarioError, match=r"cluster\.link: .*unknown link 'ib-9000'"):
        scenario_from_dict(_scenario(ONE, link="ib-9000"), "s.yaml")
    with pytest.raises(InputError, match="link.efficiency"):
        get_link({"bandwidth_Gbps": 100, "efficiency": 2, "latency_us": 0})


def test_disaggregated_scenario_is_refused_by_the_co_located_runner():
    scenario = scenario_from_dict(
        _scenario([{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 2}])
    )
    with pytest.raises(ScenarioError, match="kvsim disagg"):
        run(scenario)


def test_co_located_tables_unchanged_by_an_explicit_default_cluster():
    base = {
        "name": "co",
        "model": None,
        "cache": {"block_size": 16, "num_gpu_blocks": 30, "num_cpu_blocks": 0},
        "scheduler": {"design": "v1-engine", "max_model_len": 256},
        "engine": {"num_replicas": 2},
        "workload": {
            "kind": "inline",
            "requests": [
                {"arrival_s": 0.001 * i, "prompt_tokens": 20 + 7 * i, "output_tokens": 5 + i}
                for i in range(12)
            ],
        },
        "step_time": {"linear": {"fixed_s": 0.01, "per_prefill_token_s": 1e-4}},
    }
    plain = run(scenario_from_dict(base))
    explicit = run(scenario_from_dict({**base, "cluster": {"mode": "co-located"}}))
    assert plain.requests.equals(explicit.requests)
    assert plain.steps.equals(explicit.steps)


# ---------------------------------------------------------------- the hand-off
def test_decode_admission_waits_for_the_transfer():
    """One 40-token request, 4 output tokens, 10 ms steps, a link of 0.1 s latency at 1 GB/s.

    prefill step 0 -> 0.01 s (its one token); decode allocates 3 blocks at 0.01 s; transfer
    3 x 2,097,152 B / 1e9 B/s + 0.1 s = 0.106291456 s, done at 0.116291456 s; the decode
    step that computes the last prompt token starts then and samples the first token at
    0.126291456 s; three more decode steps finish at 0.156291456 s.
    """
    link = {"bandwidth_Gbps": 8, "efficiency": 1.0, "latency_us": 100_000}
    scenario = scenario_from_dict(
        _scenario([{"arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 4}], link=link)
    )
    result = run_disaggregated(scenario)
    transfer = result.transfers.iloc[0]
    assert transfer["num_blocks"] == 3 and transfer["num_bytes"] == 3 * 2_097_152
    assert transfer["start_s"] == pytest.approx(0.01)
    assert transfer["end_s"] == pytest.approx(0.116291456)
    steps = result.decode.steps
    assert steps["start_s"].iloc[0] == pytest.approx(transfer["end_s"])
    # The first decode step computes only the last prompt token (39 already received).
    assert steps["num_prefill_tokens"].iloc[0] == 1
    assert steps["num_context_tokens"].iloc[0] == 39
    row = result.requests.iloc[0]
    assert row["ttft_s"] == pytest.approx(0.126291456)
    assert row["finish_s"] == pytest.approx(0.156291456)
    assert row["tpot_s"] == pytest.approx(0.01)
    assert row["generated_tokens"] == 4 and row["state"] == "finished"
    assert result.summary["transfer_share_of_ttft_mean"] == pytest.approx(0.106291456 / 0.126291456)


def test_prefill_blocks_are_held_until_the_kv_is_sent_and_decode_waits_for_them():
    """At 0.05 s (prefill done at 0.01 s, read until 0.116 s) the prefill replica keeps the
    request's 3 blocks (+ the null block) and the decode replica holds 3 blocks for it in
    WAITING_FOR_REMOTE_KVS; after the read the prefill blocks are free."""
    link = {"bandwidth_Gbps": 8, "efficiency": 1.0, "latency_us": 100_000}
    scenario = scenario_from_dict(
        _scenario([{"arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 4}], link=link)
    )
    engine, _ = build_engine(scenario)
    engine.start()
    engine.env.run(until=0.05)
    prefill, decode = engine.prefill.replicas[0], engine.decode.replicas[0]
    assert list(engine.hooks(prefill).delayed_free) == [0]
    assert _used(prefill) == 1 + 3
    (waiting,) = decode.scheduler.waiting
    assert waiting.state is RequestState.WAITING_FOR_REMOTE_KVS
    assert waiting.seq.num_computed_tokens == 0 and _used(decode) == 1 + 3
    engine.env.run(until=0.12)  # the read is done; the decode step is running
    assert not engine.hooks(prefill).delayed_free and _used(prefill) == 1
    assert waiting.state is RequestState.RUNNING
    engine.env.run()


def _used(replica) -> int:
    stats = replica.pool_stats()
    return stats.num_total - stats.num_free


def _ledger(block_size: int = 16) -> TransferLedger:
    return TransferLedger(get_link("rdma-400g"), block_size, 2_097_152)


def test_decode_side_matches_the_remote_prompt_once():
    """`get_num_new_matched_tokens`: prompt - local hit, async, for a handed-off request;
    nothing once its read has started (NIXL sets do_remote_prefill False)."""
    ledger = _ledger()
    side = DecodeSide(ledger, 0)
    request = Request.new(7, 0.0, TokenContent.unique(7, 100), 4)
    assert side.get_num_new_matched_tokens(request, 0).num_external_tokens == 0
    ledger.hand_off(7, prefill_index=1)
    match = side.get_num_new_matched_tokens(request, 32)
    assert (match.num_external_tokens, match.load_async) == (68, True)
    # 7 blocks for 100 tokens, the first 2 a local hit: 5 are read.
    side.update_state_after_alloc(request, list(range(1, 8)), 32, 68, now_s=1.0)
    (transfer,) = ledger.transfers
    assert (transfer.prefill_replica, transfer.decode_replica, transfer.num_blocks) == (1, 0, 5)
    assert transfer.end_s == pytest.approx(1.0 + 20e-6 + 5 * 2_097_152 / 45e9)
    assert side.next_completion_s() == transfer.end_s
    assert side.get_num_new_matched_tokens(request, 0).num_external_tokens == 0
    assert side.get_finished(set(), 1.0).finished_recving == frozenset()
    assert side.get_finished(set(), transfer.end_s).finished_recving == {7}


def test_prefill_side_keeps_blocks_until_the_read_is_done():
    ledger = _ledger()
    side = PrefillSide(ledger, 1)
    request = Request.new(7, 0.0, TokenContent.unique(7, 40), 1)
    outcome = side.request_finished(request, [4, 5, 6])
    assert outcome.delay_free_blocks
    assert outcome.kv_transfer_params["remote_block_ids"] == [4, 5, 6]
    assert side.next_completion_s() is None  # not read yet: no time known
    ledger.hand_off(7, prefill_index=1)
    end_s = ledger.start_read(7, decode_index=0, num_blocks=3, now_s=2.0)
    assert side.next_completion_s() == end_s
    assert side.get_finished({7}, end_s - 1e-9).finished_sending == frozenset()
    assert side.get_finished(set(), end_s).finished_sending == {7}
    assert not side.request_finished(request, []).delay_free_blocks


# ---------------------------------------------------------------- accounting and audit
def _check_invariants(engine, result) -> None:
    """Both sides account for every request; times are ordered; the audit finds at most a
    P/D deadlock, and only with aborted requests; a run with no abort frees every block."""
    specs = {s.request_id: s for s in engine.specs}
    block_size = engine.decode.config.kv.block_size
    client = result.requests
    assert sorted(client["request_id"]) == sorted(specs)
    assert set(client["state"]) <= TERMINAL
    assert set(result.prefill.requests["state"]) <= TERMINAL
    assert set(result.decode.requests["state"]) <= TERMINAL
    handed_off = set(result.prefill.requests.query("state == 'finished'")["request_id"])
    assert set(result.decode.requests["request_id"]) == handed_off
    assert (result.prefill.requests["generated_tokens"] <= 1).all()
    _check_pool_tables(result)
    kinds = set(result.prefill.violations["kind"]) | set(result.decode.violations["kind"])
    aborted = (client["state"] == "aborted").any()
    assert kinds <= {"no_progress"}
    # Aborted: a P/D deadlock or stall (recorded), or the simulated-time limit (not).
    stopped = result.summary["stopped_early"] is not None
    assert bool(kinds) == (aborted and not stopped)
    done = client[client["state"] == "finished"]
    for row in done.itertuples():
        assert row.generated_tokens == specs[row.request_id].output_tokens or (
            row.prompt_tokens + row.generated_tokens >= engine.decode.config.scheduler.max_model_len
        )
        assert row.arrival_s <= row.prefill_done_s <= row.transfer_start_s
        assert row.transfer_start_s < row.transfer_end_s <= row.first_token_s <= row.finish_s
        # The whole prompt moves, less the blocks the decode side already held (a prefix hit).
        whole = kv_transfer_bytes(row.prompt_tokens, block_size, engine.block_bytes)
        if engine.decode.config.kv.enable_prefix_caching:
            assert 0 < row.kv_bytes <= whole
        else:
            assert row.kv_bytes == whole
    if not aborted:
        for pool in (engine.prefill, engine.decode):
            for replica in pool.replicas:
                assert _used(replica) <= 1  # the null block
        assert not any(engine.hooks(r).delayed_free for r in engine.prefill.replicas)


def _check_pool_tables(result) -> None:
    """Each pool's `requests` table is in `request_id` order (rows are written as requests
    end, `sim.output.records.RequestRows`), and its summary, gathered from the table's chunks as they
    were written, counts the same rows and states as the table."""
    for pool in (result.prefill, result.decode):
        ids = pool.requests["request_id"]
        assert ids.is_monotonic_increasing and ids.is_unique
        assert pool.summary["num_requests"] == len(pool.requests)
        counts = pool.requests["state"].value_counts().to_dict()
        assert {k: v for k, v in pool.summary["states"].items() if v} == counts
        assert pool.summary["num_steps"] == len(pool.steps)


def test_disagg_on_columnar_records():
    """Regression (`ColumnarTable has no attribute sort`): the pools write their tables
    through the columnar records. Two prefill replicas (round robin): request 0's prompt of
    400 tokens takes 7 chunks of 64, request 1's of 8 tokens one step, so request 1 reaches
    the decode pool first; the decode pool's table is still in id order, and each pool's
    summary counts its table's rows."""
    data = _scenario(
        [
            {"arrival_s": 0.0, "prompt_tokens": 400, "output_tokens": 3},
            {"arrival_s": 0.0, "prompt_tokens": 8, "output_tokens": 3},
        ],
        prefill={"replicas": 2},
    )
    # max_num_seqs at most the budget, or vLLM (and kvsim) refuse to start.
    data["scheduler"] |= {
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 64,
        "max_num_seqs": 16,
    }
    engine, inputs = build_engine(scenario_from_dict(data))
    records = engine.run()
    assert records.handoff_s[1] < records.handoff_s[0]
    result = build_disagg_result(records, inputs)
    assert list(result.decode.requests["request_id"]) == [0, 1]
    assert list(result.requests["state"]) == ["finished", "finished"]
    assert result.prefill.summary["num_steps"] == 7 + 1
    _check_pool_tables(result)


def test_every_request_accounted_for_and_audit_clean_on_a_normal_workload():
    scenario = scenario_from_dict(
        {
            "name": "pd-normal",
            "model": "llama-3.1-8b",
            "hardware": {"gpu": "h100-sxm"},
            "scheduler": {
                "design": "v1-engine",
                "vllm_version": "0.11.0",
                "enable_chunked_prefill": True,
            },
            "engine": {"audit_level": "full"},
            "cluster": {
                "mode": "disaggregated",
                "prefill": {"replicas": 1},
                "decode": {"replicas": 2},
                "link": "rdma-400g",
            },
            "workload": {
                "kind": "synthetic",
                "num_requests": 150,
                "seed": 3,
                "arrival": {"process": "poisson", "rate_per_s": 10},
                "lengths": {
                    "prompt": {"kind": "lognormal", "mean": 1500, "cv": 0.8, "max_tokens": 8000},
                    "output": {"kind": "lognormal", "mean": 150, "cv": 0.8, "max_tokens": 800},
                },
            },
        }
    )
    engine, inputs = build_engine(scenario)
    result = build_disagg_result(engine.run(), inputs)
    assert result.summary["states"]["finished"] == 150
    assert result.summary["num_violations"] == 0
    assert len(result.transfers) == 150
    assert set(result.decode.requests["replica"]) == {0, 1}
    _check_invariants(engine, result)


def test_decode_pool_too_small_for_a_prompt_aborts_it_and_frees_the_prefill_blocks():
    """A decode pool (40 blocks) smaller than one prompt (700 tokens, 44 blocks) that the
    prefill pool (80 blocks) ran: it is aborted with `no_progress`, and the prefill replica's
    held blocks are released. (vLLM refuses to start such a decode engine, as `resolve`
    does; the engine is built by hand here to reach the stall path.)"""
    data = _scenario(
        [
            {"arrival_s": 0.0, "prompt_tokens": 30, "output_tokens": 4},
            {"arrival_s": 0.0, "prompt_tokens": 700, "output_tokens": 4},
        ]
    )
    data["scheduler"]["max_model_len"] = 1024
    data["cache"]["num_gpu_blocks"] = 80
    engine, inputs = build_engine(scenario_from_dict(data))
    # Shrink the decode pool alone: its own (audited) manager over 40 blocks.
    from dataclasses import replace

    from sim.engine.disagg import DisaggEngine

    decode_config = replace(
        engine.decode.config, kv=replace(engine.decode.config.kv, num_gpu_blocks=40)
    )
    engine = DisaggEngine(
        (engine.prefill.config, engine.prefill.step_time),
        (decode_config, engine.decode.step_time),
        engine.specs,
        engine.link,
        engine.block_bytes,
    )
    result = build_disagg_result(engine.run(), inputs)
    states = dict(zip(result.requests["request_id"], result.requests["state"], strict=True))
    assert states == {0: "finished", 1: "aborted"}
    assert set(result.decode.violations["kind"]) == {"no_progress"}
    assert not engine.hooks(engine.prefill.replicas[0]).delayed_free
    _check_invariants(engine, result)


_request = st.fixed_dictionaries(
    {
        "gap_s": st.sampled_from([0.0, 0.001, 0.02, 0.1]),
        "prompt_tokens": st.integers(1, 200),
        "output_tokens": st.integers(1, 40),
    }
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(_request, min_size=1, max_size=16),
    num_prefill=st.integers(1, 2),
    num_decode=st.integers(1, 2),
    num_gpu_blocks=st.integers(16, 60),
    latency_us=st.sampled_from([0, 500, 30_000]),
    chunked=st.booleans(),
)
def test_invariants_over_random_workloads(
    requests, num_prefill, num_decode, num_gpu_blocks, latency_us, chunked
):
    arrival_s = 0.0
    inline = []
    for r in requests:
        arrival_s += r["gap_s"]
        inline.append(
            {
                "arrival_s": round(arrival_s, 6),
                "prompt_tokens": r["prompt_tokens"],
                "output_tokens": r["output_tokens"],
            }
        )
    data = _scenario(
        inline,
        prefill={"replicas": num_prefill},
        decode={"replicas": num_decode},
        link={"bandwidth_Gbps": 100, "efficiency": 0.8, "latency_us": latency_us},
    )
    data["cache"]["num_gpu_blocks"] = num_gpu_blocks
    data["scheduler"]["max_model_len"] = 16 * (num_gpu_blocks - 2)
    data["scheduler"]["enable_chunked_prefill"] = chunked
    engine, inputs = build_engine(scenario_from_dict(data))
    _check_invariants(engine, build_disagg_result(engine.run(), inputs))


@pytest.mark.parametrize("seed", range(25))
def test_fuzz_disaggregated_cases_keep_the_invariants(seed):
    scenario = generate_disagg_case(seed)
    assert scenario.cluster.mode.value == "disaggregated"
    engine, inputs = build_engine(scenario)
    _check_invariants(engine, build_disagg_result(engine.run(), inputs))


def test_fuzz_disaggregated_case_is_a_pure_function_of_its_seed():
    assert generate_disagg_case(11) == generate_disagg_case(11)
    assert not math.isnan(generate_disagg_case(11).cache.block_size)


def test_hold_of_a_preempted_prefill_frees_at_once():
    """Regression: kvsim's first P/D hold (before the connector seam) kept the blocks of a
    prefill preempted before its token, deadlocking its replica (fuzz case seed 2). Two
    150-token prompts prefill in 32-token chunks on 12 blocks: the second is preempted,
    frees at once, and both finish; only finished prefills were kept for their reads."""
    requests = [{"arrival_s": 0.0, "prompt_tokens": 150, "output_tokens": 3}] * 2
    data = _scenario(requests)
    data["cache"]["num_gpu_blocks"] = 12
    data["scheduler"].update(
        {
            "max_model_len": 160,
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 16,
            "long_prefill_token_threshold": 32,
        }
    )
    engine, inputs = build_engine(scenario_from_dict(data))
    result = build_disagg_result(engine.run(), inputs)
    assert result.prefill.steps["num_preempted"].sum() >= 1
    assert list(result.requests["state"]) == ["finished", "finished"]
    _check_invariants(engine, result)


# ---------------------------------------------------------------- cluster capacity
def _capacity_scenario() -> Scenario:
    """A synthetic load that one replica cannot serve within the SLO but two can."""
    return scenario_from_dict(
        {
            "name": "pd-capacity",
            "model": "llama-3.1-8b",
            "cache": {"block_size": 16, "num_gpu_blocks": 200, "num_cpu_blocks": 0},
            "scheduler": {
                "design": "v1-engine",
                "vllm_version": "0.11.0",
                "max_model_len": 2048,
                "enable_chunked_prefill": True,
            },
            "workload": {
                "kind": "synthetic",
                "num_requests": 60,
                "seed": 1,
                "arrival": {"process": "poisson", "rate_per_s": 1.0},
                "lengths": {
                    "prompt": {"kind": "uniform", "min_tokens": 100, "max_tokens": 400},
                    "output": {"kind": "uniform", "min_tokens": 10, "max_tokens": 40},
                },
            },
            "step_time": {
                "linear": {"fixed_s": 0.01, "per_prefill_token_s": 5e-5, "per_decode_seq_s": 1e-4}
            },
        }
    )


def test_cluster_capacity_answers_the_smallest_passing_shape_per_mode():
    slo = Slo(ttft_p99_s=0.5, tpot_p99_s=0.03)
    table, answers = gpus_needed(_capacity_scenario(), 40.0, slo, max_gpus=4)
    assert list(table["num_gpus"]) == sorted(table["num_gpus"])
    for answer in answers:
        rows = table[table["mode"] == answer.mode]
        passing = rows[rows["meets_slo"]]
        if answer.num_gpus is None:
            assert passing.empty
            continue
        assert answer.num_gpus == passing["num_gpus"].min()
        assert answer.shape in set(passing["shape"])
        # Every smaller cluster of that mode was tried and missed the SLO.
        smaller = rows[rows["num_gpus"] < answer.num_gpus]
        assert not smaller["meets_slo"].any()
        fewest = 1 if answer.mode == "co-located" else 2  # a P+D split needs 2 replicas
        assert set(range(fewest, answer.num_gpus)) <= set(smaller["num_gpus"])
    # The load is more than one replica serves within the SLO.
    assert answers[0].num_gpus is None or answers[0].num_gpus >= 2


def test_cluster_capacity_needs_a_synthetic_workload():
    scenario = scenario_from_dict(_scenario(ONE))
    with pytest.raises(InputError, match="synthetic"):
        gpus_needed(scenario, 10.0, Slo(1.0, 0.05), max_gpus=2)


def test_bundled_disaggregated_scenario_runs_clean():
    scenario = apply_overrides(
        load_scenario(ROOT / "scenarios" / "pd_disagg_llama8b_h100.yaml"),
        {"workload.num_requests": 80},
    )
    result = run_disaggregated(scenario)
    assert result.summary["states"]["finished"] == 80
    assert result.summary["num_violations"] == 0
    assert result.inputs["num_gpus"] == 4


def test_tensor_parallel_pools_read_over_min_tp_streams():
    """Each rank reads its shard over its own link: prefill tp 4 and decode tp 2 move the
    same bytes over min(4, 2) = 2 streams, so the read (less latency) takes half as long."""
    link = {"bandwidth_Gbps": 8, "efficiency": 1.0, "latency_us": 1000}
    one = [{"arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 4}]
    single = run_disaggregated(scenario_from_dict(_scenario(one, link=link)))
    split = run_disaggregated(
        scenario_from_dict(
            _scenario(one, link=link, prefill={"tp": 4}, decode={"tp": 2, "replicas": 2})
        )
    )
    assert split.inputs["num_streams"] == 2 and split.inputs["num_gpus"] == 4 + 2 * 2
    (a,), (b,) = single.transfers.itertuples(), split.transfers.itertuples()
    assert a.num_bytes == b.num_bytes == 3 * 2_097_152
    assert a.duration_s - 1e-3 == pytest.approx(3 * 2_097_152 / 1e9)
    assert b.duration_s - 1e-3 == pytest.approx((a.duration_s - 1e-3) / 2)


def test_cpu_offload_with_disaggregation_is_refused_as_input():
    data = _scenario(ONE)
    data["cache"]["cpu_offload_gib"] = 8
    with pytest.raises(ScenarioError, match="cache.cpu_offload_gib"):
        build_engine(scenario_from_dict(data))


# ---------------------------------------------------------------- command line
def test_kvsim_disagg_writes_the_tables_and_refuses_a_co_located_scenario(tmp_path):
    from typer.testing import CliRunner

    from sim.cli.main import app
    from sim.scenario.schema import scenario_to_yaml

    cli = CliRunner()
    link = {"bandwidth_Gbps": 8, "efficiency": 1.0, "latency_us": 100_000}
    path = tmp_path / "pd.yaml"
    path.write_text(
        scenario_to_yaml(
            scenario_from_dict(
                _scenario([{"arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 4}], link=link)
            )
        )
    )
    out = tmp_path / "out"
    result = cli.invoke(app, ["disagg", str(path), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "decode_requests.csv",
            "decode_steps.csv",
            "prefill_requests.csv",
            "prefill_steps.csv",
            "requests.csv",
            "summary.json",
            "transfers.csv",
            "violations.csv",
        ]
    )
    assert '"ttft_p50_s": 0.126291456' in result.output
    co_located = tmp_path / "co.yaml"
    co_located.write_text(scenario_to_yaml(scenario_from_dict({**_scenario(ONE), "cluster": {}})))
    refused = cli.invoke(app, ["disagg", str(co_located)])
    assert refused.exit_code == 2
    assert "mode 'disaggregated'" in refused.output
    bad_rate = cli.invoke(
        app,
        ["cluster-capacity", str(path), "--rate", "5", "--ttft-p99-s", "0", "--tpot-p99-s", "1"],
    )
    assert bad_rate.exit_code == 2
