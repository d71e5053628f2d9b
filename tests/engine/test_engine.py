"""End-to-end runs: golden timings, accounting, determinism, policies, replicas."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engine.run import builtin_scenario_path, run
from sim.output.results import write_result
from sim.scenario.overrides import apply_overrides
from sim.scenario.schema import scenario_from_dict

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"


def _inline(design: str, requests: list[dict], **sections) -> dict:
    data = {
        "name": f"t-{design}",
        "model": None,
        "cache": {
            "block_size": 16,
            "num_gpu_blocks": 10,
            "num_cpu_blocks": 0,
            "sliding_window": 24,
        },
        "scheduler": {"design": design, "max_model_len": 160},
        "workload": {"kind": "inline", "requests": requests},
        "step_time": {
            "linear": {"fixed_s": 0.005, "per_prefill_token_s": 0.0001, "per_decode_seq_s": 0.0001}
        },
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return data


def test_4_vs_3_end_to_end_on_v0_v2_golden():
    result = run(SCENARIOS / "swa_4_vs_3_v0_v2.yaml")
    requests = result.requests.set_index("request_id")
    # A: prefill 112 tokens = 0.005 + 112 * 1e-4 = 0.0162 s; then 7 decodes of 0.0051 s.
    a = requests.loc[0]
    assert a["state"] == "finished"
    assert math.isclose(a["ttft_s"], 0.0162)
    assert math.isclose(a["tpot_s"], 0.0051)
    assert math.isclose(a["e2e_s"], 0.0162 + 7 * 0.0051)
    b = requests.loc[1]
    assert b["state"] == "failed"
    assert b["reason"] == (
        "can_allocate counted 3 blocks for request 1 (64 tokens, window 3 blocks) but allocate needed 4 with 3 free"
    )
    assert list(result.violations["kind"]) == [
        "admission_overtake",
        "admission_undercount",
        "leaked_blocks",
    ]
    assert result.summary["states"] == {"finished": 1, "ignored": 0, "failed": 1, "aborted": 0}


@pytest.mark.parametrize("design", ["v0-v1", "v0-fixed", "v1-engine"])
def test_4_vs_3_end_to_end_on_consistent_designs(design):
    result = run(SCENARIOS / f"swa_4_vs_3_{design.replace('-', '_')}.yaml")
    assert result.violation_kinds == set()
    assert result.summary["states"]["finished"] == 2


def test_4_vs_3_on_v1_engine_makes_b_wait_instead_of_crashing():
    result = run(SCENARIOS / "swa_4_vs_3_v1_engine.yaml")
    requests = result.requests.set_index("request_id")
    # 10 blocks, block 0 is the null block: A takes 7 (F=2), B's 4 blocks wait for A's window drop.
    assert requests.loc[1, "queueing_s"] > 0
    assert requests.loc[0, "queueing_s"] == 0


_THREE = [
    {"arrival_s": 0.0, "prompt_tokens": 112, "output_tokens": 8},
    {"arrival_s": 0.0, "prompt_tokens": 64, "output_tokens": 8},
    {"arrival_s": 5.0, "prompt_tokens": 16, "output_tokens": 8},
]


def test_stop_any_policy_ends_the_run_at_the_first_violation_and_accounts_for_everyone():
    scenario = scenario_from_dict(_inline("v0-v2", _THREE, engine={"violation_policy": "stop_any"}))
    result = run(scenario)
    assert result.summary["stopped_early"].startswith(
        "stopped at the first violation (admission_overtake)"
    )
    assert len(result.requests) == 3
    states = dict(zip(result.requests["request_id"], result.requests["state"], strict=True))
    assert states[2] == "aborted"
    assert "never arrived" in result.requests.set_index("request_id").loc[2, "reason"]


def test_stop_policy_ends_the_run_where_the_real_engine_raises():
    """A's admission_overtake is silent (its allocation fits); B's allocation runs dry, which
    is where vLLM 0.5.4 raises NoFreeBlocksError (#7470): the run ends there."""
    scenario = scenario_from_dict(_inline("v0-v2", _THREE, engine={"violation_policy": "stop"}))
    result = run(scenario)
    assert result.summary["stopped_early"].startswith(
        "stopped where the real engine raises (admission_undercount): can_allocate counted 3"
    )
    assert list(result.violations["kind"]) == [
        "admission_overtake",
        "admission_undercount",
        "leaked_blocks",
    ]
    assert result.violations["recovered_blocks"].tolist() == [0, 0, 0]  # lost, as upstream
    states = result.requests.set_index("request_id")["state"].to_dict()
    assert states == {0: "aborted", 1: "failed", 2: "aborted"}


def test_stop_at_admission_overtake():
    """Regression: `--stop` ended the run at any violation, including an admission_overtake
    whose allocation succeeded and on which the real engine runs on. Now it runs to the end."""
    alone = [{"arrival_s": 0.0, "prompt_tokens": 112, "output_tokens": 8}]
    scenario = scenario_from_dict(_inline("v0-v2", alone, engine={"violation_policy": "stop"}))
    result = run(scenario)
    assert list(result.violations["kind"]) == ["admission_overtake"]
    assert result.summary["stopped_early"] is None
    assert result.requests["state"].tolist() == ["finished"]


@pytest.mark.parametrize(
    ("flag", "stopped"),
    [
        ("--stop", "stopped where the real engine raises (admission_undercount)"),
        ("--stop-at-first-violation", "stopped at the first violation (admission_overtake)"),
    ],
)
def test_cli_stop_flags(flag, stopped, tmp_path):
    import json

    from typer.testing import CliRunner

    from sim.cli.main import app

    cli = CliRunner().invoke(
        app,
        [
            "run",
            str(SCENARIOS / "swa_4_vs_3_v0_v2.yaml"),
            flag,
            "--json",
            "--no-plots",
            "-o",
            str(tmp_path / "out"),
        ],
    )
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.output)["summary"]["stopped_early"].startswith(stopped)


def test_v0_v2_null_block_strands_a_full_pool_request_as_no_progress():
    """A vLLM 0.5.4 v0-V2 hang kvsim found: once any sliding-window sequence has decoded, the
    null block holds one of G blocks forever, so a prompt needing exactly G blocks (allowed by
    the startup check max_model_len <= bs * G) is LATER forever: G - 10 >= Wm, but F = G - 1.
    The request is aborted (accounted for) and the hang is a `no_progress` violation whose
    diagnosis names the waiting request, its need, the null block and the free count."""
    scenario = scenario_from_dict(
        _inline(
            "v0-v2",
            [
                {"arrival_s": 0.0, "prompt_tokens": 16, "output_tokens": 4},
                {"arrival_s": 1.0, "prompt_tokens": 160, "output_tokens": 4},
            ],
            cache={"sliding_window": 256},  # M = 18 > 10 blocks: the cap does not apply
        )
    )
    result = run(scenario)
    rows = result.requests.set_index("request_id")
    assert rows.loc[0, "state"] == "finished"
    assert rows.loc[1, "state"] == "aborted"
    assert rows.loc[1, "reason"] == (
        "stalled: nothing running and no waiting request can be admitted (9 free blocks)"
    )
    assert result.violation_kinds == {"no_progress"}
    (violation,) = result.violations.to_dict("records")
    assert violation["request_id"] == 1
    assert (violation["needed_blocks"], violation["free_blocks"]) == (10, 9)
    assert "request 1 needs 10 blocks (160 tokens)" in violation["message"]
    assert "1 block(s) held by no request (a null block, or leaked)" in violation["message"]
    assert "at most 9 can ever be free" in violation["message"]


def test_v1_engine_prompt_of_max_model_len_never_finishes_as_no_progress():
    """vLLM #29496: V1 caps a step at `max_model_len - 1 - num_computed_tokens` tokens, so a
    prompt of exactly max_model_len tokens (the frontend admits it) that is chunked computes
    max_model_len - 1 and then gets 0 tokens every step, holding its blocks forever (unchunked,
    the waiting loop schedules it whole and it finishes). Found by `kvsim fuzz`
    (case seed 673228719); every pinned release kvsim models has the cap."""
    for version in ("4ac7713", "0.11.0", "0.33.0"):
        scenario = scenario_from_dict(
            _inline(
                "v1-engine",
                [
                    {"arrival_s": 0.0, "prompt_tokens": 128, "output_tokens": 4},
                    {"arrival_s": 0.0, "prompt_tokens": 16, "output_tokens": 4},
                ],
                cache={"sliding_window": None, "num_gpu_blocks": 16},
                scheduler={
                    "max_model_len": 128,
                    "vllm_version": version,
                    # The cap is in the running loop: the prompt must spill into a 2nd chunk.
                    "enable_chunked_prefill": True,
                    "max_num_batched_tokens": 64,
                    "max_num_seqs": 16,  # at most the budget, or vLLM refuses to start
                },
            )
        )
        result = run(scenario)
        states = result.requests.set_index("request_id")["state"]
        assert states.to_dict() == {0: "aborted", 1: "finished"}, version
        assert result.violation_kinds == {"no_progress"}, version
        message = result.violations["message"].iloc[0]
        assert "request 0 holds 8 (127 of 128 tokens computed)" in message, message


def test_livelock_is_recorded_as_no_progress(monkeypatch):
    """The engine's livelock cut-off (steps that only preempt, never run a token) aborts the
    queue and records `no_progress`, its diagnosis leading with the number of empty steps.
    A scheduler that preempts on every call without scheduling anything stands in for a
    design that livelocks."""
    from sim.scheduler import StepPlan, V1Scheduler

    def preempt_forever(self, now_s):
        plan = StepPlan()
        plan.num_preempted = 1
        return plan

    monkeypatch.setattr(V1Scheduler, "schedule", preempt_forever)
    scenario = scenario_from_dict(
        _inline(
            "v1-engine",
            [{"arrival_s": 0.0, "prompt_tokens": 16, "output_tokens": 4}],
            cache={"sliding_window": None},
            scheduler={"max_model_len": 128},
        )
    )
    result = run(scenario)
    row = result.requests.iloc[0]
    assert (row["state"], row["reason"]) == (
        "aborted",
        "livelock: steps keep preempting without running anything",
    )
    (violation,) = result.violations.to_dict("records")
    assert violation["kind"] == "no_progress"
    # The cut-off: more than 2 * unfinished + 8 empty steps in a row (here 1 request: 11).
    assert violation["message"].startswith(
        "no progress (livelock): 11 steps preempted and readmitted without running anything."
    )
    assert "Waiting 1: request 0 needs 1 blocks (16 tokens)." in violation["message"]


def test_v1_engine_prompt_over_max_model_len_is_ignored_at_arrival():
    scenario = scenario_from_dict(
        _inline(
            "v1-engine",
            [{"arrival_s": 0.0, "prompt_tokens": 200, "output_tokens": 4}],
            cache={"sliding_window": None},
            scheduler={"max_model_len": 128},
        )
    )
    row = run(scenario).requests.iloc[0]
    assert row["state"] == "ignored"
    assert row["reason"] == "prompt (200 tokens) is longer than max_model_len (128)"


def test_a_pool_too_small_for_max_model_len_is_refused_like_vllm():
    from sim.scenario.schema import ScenarioError

    scenario = scenario_from_dict(
        _inline(
            "v0-v1",
            [{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 1}],
            scheduler={"max_model_len": 161},
        )
    )
    with pytest.raises(ScenarioError, match="161 tokens is larger than the KV cache holds"):
        run(scenario)


def test_round_robin_replicas_share_the_requests():
    requests = [{"arrival_s": i * 0.01, "prompt_tokens": 16, "output_tokens": 2} for i in range(6)]
    scenario = scenario_from_dict(
        _inline("v0-v1", requests, engine={"num_replicas": 2}, cache={"num_gpu_blocks": 50})
    )
    result = run(scenario)
    assert list(result.requests["replica"]) == [0, 1, 0, 1, 0, 1]
    assert set(result.steps["replica"]) == {0, 1}
    assert result.summary["states"]["finished"] == 6


def test_every_trace_request_has_exactly_one_row_even_under_pressure():
    scenario = apply_overrides(
        scenario_from_dict(
            {
                "name": "azure-pressure",
                "model": "mistral-7b-v0.1",
                "cache": {"num_gpu_blocks": 600, "sliding_window": "model"},
                "scheduler": {"design": "v0-v2", "max_model_len": 8192},
                "workload": {
                    "kind": "trace",
                    "path": str(
                        ROOT / "sim/data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
                    ),
                    "format": "azure",
                    "first_n": 300,
                },
            }
        ),
        {"workload.rate_scale": 4},
    )
    result = run(scenario)
    assert len(result.requests) == 300
    assert sorted(result.requests["request_id"]) == list(range(300))
    assert sum(result.summary["states"].values()) == 300
    assert result.requests["state"].isin(["finished", "ignored", "failed", "aborted"]).all()


def test_same_scenario_and_seed_give_byte_identical_outputs(tmp_path):
    path = builtin_scenario_path()
    overrides = {"workload.first_n": 200}
    first = write_result(run(path, overrides=overrides), tmp_path / "a")
    second = write_result(run(path, overrides=overrides), tmp_path / "b")
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert "requests.parquet" in names and "steps.csv" in names
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


@pytest.mark.parametrize(
    "design,extra",
    [
        ("v0-v1", {}),
        ("v0-v2", {}),
        ("v0-fixed", {"scheduler.preemption_mode": "swap"}),
        ("v1-engine", {"scheduler.enable_chunked_prefill": True}),  # unpinned: the latest
        (
            "v1-engine",
            {"scheduler.enable_chunked_prefill": True, "scheduler.vllm_version": "4ac7713"},
        ),
    ],
)
def test_decode_fast_path_changes_no_result(design, extra):
    """The quiet-decode fast path is an optimisation only: every table is identical without it."""
    overrides = {
        "workload.first_n": 400,
        "workload.rate_scale": 3,
        "scheduler.design": design,
        **extra,
    }
    fast = run(builtin_scenario_path(), overrides=overrides)
    slow = run(
        builtin_scenario_path(), overrides={**overrides, "scheduler.decode_fast_path": False}
    )
    assert fast.summary["num_preemptions"] > 0  # the pool is under pressure
    for name in ("requests", "steps", "violations"):
        pd.testing.assert_frame_equal(getattr(fast, name), getattr(slow, name), check_exact=True)


@pytest.mark.parametrize(
    "design,extra",
    [
        ("v0-v1", {}),
        ("v0-v2", {}),
        ("v0-fixed", {"scheduler.preemption_mode": "swap"}),
        ("v0-v2", {"cache.sliding_window": None, "cache.enable_prefix_caching": True}),
        ("v1-engine", {"scheduler.enable_chunked_prefill": True}),
        (
            "v1-engine",
            {"scheduler.enable_chunked_prefill": False, "scheduler.max_model_len": 8192},
        ),
        (
            "v1-engine",
            {"scheduler.enable_chunked_prefill": True, "scheduler.vllm_version": "4ac7713"},
        ),
    ],
)
def test_skipping_known_later_answers_changes_no_result(design, extra, monkeypatch):
    """The v0 scheduler skips a `can_allocate` whose LATER answer cannot have changed (same
    head, no block freed since), the V1 one an `allocate_slots` whose None cannot have (same
    head, no fewer tokens asked, no block freed, no prefix caching): every table is the same
    when they ask every time."""
    from sim.scheduler.fast.v0 import V0DecodeShortcuts
    from sim.scheduler.fast.v1 import V1DecodeShortcuts

    overrides = {"workload.first_n": 300, "workload.rate_scale": 3, "scheduler.design": design}
    overrides.update(extra)
    skipping = run(builtin_scenario_path(), overrides=overrides)
    monkeypatch.setattr(V0DecodeShortcuts, "skip_repeated_later", False)
    monkeypatch.setattr(V1DecodeShortcuts, "skip_repeated_later", False)
    asking = run(builtin_scenario_path(), overrides=overrides)
    assert skipping.summary["num_preemptions"] > 0  # the pool is full at times
    for name in ("requests", "steps", "violations"):
        pd.testing.assert_frame_equal(
            getattr(skipping, name), getattr(asking, name), check_exact=True
        )


def _thrashing(design: str, num_gpu_blocks: int, policy: str, chunked: bool, requests) -> dict:
    """A pool of a few 4-token blocks and prompts up to the whole pool: requests preempt each
    other (the priority policy also preempts for a better waiting head)."""
    max_model_len = 4 * (num_gpu_blocks - 1)
    items = []
    arrival_ms = 0
    for gap_ms, frac, output, priority in requests:
        arrival_ms += gap_ms
        prompt = max(1, round(frac * (max_model_len - 1)))
        items.append(
            {
                "arrival_s": arrival_ms / 1000,
                "prompt_tokens": prompt,
                "output_tokens": output,
                "priority": priority,
            }
        )
    return _inline(
        design,
        items,
        cache={"block_size": 4, "num_gpu_blocks": num_gpu_blocks, "sliding_window": None},
        scheduler={
            "max_model_len": max_model_len,
            "policy": policy,
            "enable_chunked_prefill": chunked,
            "preemption_mode": "recompute",
        },
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    design=st.sampled_from(["v1-engine", "v0-v2", "v0-v1", "v0-fixed"]),
    num_gpu_blocks=st.integers(4, 16),
    policy=st.sampled_from(["fcfs", "priority"]),
    chunked=st.booleans(),
    requests=st.lists(
        st.tuples(
            st.sampled_from([0, 1, 5]),
            st.floats(0.3, 1.0),
            st.integers(1, 24),
            st.integers(0, 3),
        ),
        min_size=2,
        max_size=10,
    ),
)
def test_steps_table_counts_every_preemption(design, num_gpu_blocks, policy, chunked, requests):
    """Every scheduler call that preempts is in the steps table: its `num_preempted` sums to
    the requests table's `num_preemptions`, on workloads that thrash."""
    scenario = _thrashing(design, num_gpu_blocks, policy, chunked, requests)
    result = run(scenario_from_dict(scenario))
    steps, table = result.steps, result.requests
    assert steps["num_preempted"].sum() == table["num_preemptions"].sum()
    assert result.summary["num_preemptions"] == table["num_preemptions"].sum()
    quiet = steps[steps["num_tokens"] == 0]
    assert (quiet["duration_s"] == 0).all()


def test_empty_schedule_preemptions_missing_from_steps():
    """Regression: a `schedule()` that preempted but ran nothing wrote no steps row, so its
    preemption was in the requests table only. Here (v0, priority policy, 3 usable blocks of
    4 tokens) request 1 (priority 0) arrives while request 0 (priority 1, 11 tokens) runs:
    the call that preempts request 0 for it runs nothing; it is now step 1, a row with zero
    duration and no tokens (found by test_steps_table_counts_every_preemption)."""
    scenario = _thrashing("v0-v2", 4, "priority", False, [(0, 1.0, 2, 1), (1, 1.0, 1, 0)])
    result = run(scenario_from_dict(scenario))
    steps = result.steps
    assert result.requests["num_preemptions"].tolist() == [1, 0]
    assert steps["num_preempted"].tolist() == [0, 1, 0, 0]
    assert steps.loc[1, ["duration_s", "num_tokens", "num_waiting"]].tolist() == [0.0, 0, 2]
    assert steps.loc[1, "start_s"] == steps.loc[2, "start_s"]
