"""The replica step loop under V1 async scheduling (`ReplicaStepLoop._run_async`): the batch
queue in time, the engine CPU overhead overlapped with the GPU (`sim.latency.overlap`)."""

from __future__ import annotations

import pytest

from sim.engine.run import run
from sim.latency import make_step_time
from sim.latency.batch import BatchShape
from sim.latency.measured_terms import V1_WORKER_STEP_S
from sim.latency.overlap import overlapped_cpu_s
from sim.latency.scaled import ScaledStepTime
from sim.scenario.schema import scenario_from_dict


def _result(async_scheduling: bool, version: str = "0.33.0", step_time=None, num: int = 3):
    requests = [{"arrival_s": 0.0, "prompt_tokens": 64, "output_tokens": 8 + i} for i in range(num)]
    data = {
        "name": "async-loop",
        "cache": {"block_size": 16, "num_gpu_blocks": 60},
        "scheduler": {
            "design": "v1-engine",
            "vllm_version": version,
            "max_model_len": 160,
            "async_scheduling": async_scheduling,
        },
        "workload": {"kind": "inline", "requests": requests},
    }
    if step_time is not None:
        data["step_time"] = step_time
    return run(scenario_from_dict(data))


@pytest.mark.parametrize("version", ["0.11.0", "0.33.0"])
def test_async_decodes_hide_the_engine_overhead(version):
    """Measured step time (the default): a steady decode step under async takes its GPU terms
    only, the synchronous one adds `engine_overhead_s`; the tokens are the same."""
    sync, asyn = _result(False, version), _result(True, version)
    assert (asyn.requests["state"] == "finished").all()
    assert list(asyn.requests["generated_tokens"]) == list(sync.requests["generated_tokens"])
    # A three-decode step on both: the difference is V1's overhead for three sequences.
    s_row = sync.steps[sync.steps["num_decode_seqs"] == 3].iloc[1]
    a_row = asyn.steps[asyn.steps["num_decode_seqs"] == 3].iloc[1]
    assert s_row["duration_s"] - a_row["duration_s"] == pytest.approx(
        0.000606597 + V1_WORKER_STEP_S + 3 * 2.1005e-05
    )
    assert asyn.requests["finish_s"].max() < sync.requests["finish_s"].max()


def test_rows_add_up_to_the_busy_time():
    asyn = _result(True)
    steps = asyn.steps
    ends = steps["start_s"] + steps["duration_s"]
    assert steps["start_s"].iloc[1:].to_numpy() == pytest.approx(ends.iloc[:-1].to_numpy())
    assert ends.iloc[-1] == pytest.approx(asyn.requests["finish_s"].max())


def test_0_11_runs_one_extra_step_per_finish_0_33_none():
    """0.11.0 schedules a request once more after its last token (the step is dropped when
    the finish is applied); 0.33.0 does not (`sim.scheduler.v1.async_scheduler`). One request
    of 8 output tokens: 8 steps synchronously, 9 at 0.11.0 async, 8 at 0.33.0."""
    assert len(_result(False, "0.11.0", num=1).steps) == 8
    assert len(_result(True, "0.11.0", num=1).steps) == 9
    assert len(_result(True, "0.33.0", num=1).steps) == 8


def test_without_a_named_cpu_term_nothing_overlaps():
    linear = {"linear": {"fixed_s": 0.005, "per_prefill_token_s": 0.0001}}
    sync, asyn = _result(False, step_time=linear), _result(True, step_time=linear)
    assert asyn.requests["finish_s"].max() == pytest.approx(sync.requests["finish_s"].max())


def test_overlap_of_a_scaled_measured_model_scales():
    model = make_step_time(None, "llama-3.1-8b", "h100-sxm")
    batch = BatchShape((4096,) * 64, ())
    assert overlapped_cpu_s(model)(batch) == pytest.approx(
        0.000606597 + V1_WORKER_STEP_S + 64 * 2.1005e-05
    )
    assert overlapped_cpu_s(ScaledStepTime(model, 2.0))(batch) == pytest.approx(
        2 * overlapped_cpu_s(model)(batch)
    )
