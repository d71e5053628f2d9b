"""The P/D decode deadlock behind `kvsim fuzz`'s `disagg:no_progress` is vLLM 0.11.0's own.

The shape (block size 4, 12 blocks of which 11 usable, no prefix caching): request 0 (16-token
prompt, 20 output tokens) has its KV read and decodes; requests 1 and 2 (12-token prompts)
are handed off meanwhile, and the decode side allocates their 3 + 3 blocks for the read
(WAITING_FOR_REMOTE_KVS), leaving 1. Request 0 takes it for tokens 17-20; at token 21 it needs
a sixth block, none is free, so it preempts itself (the only running request) and is put back
at the head of the waiting queue. Now it needs ceil(21 / 4) = 6 blocks to recompute, 11 - 6 =
5 are free, and the waiting loop stops at the head (`new_blocks is None: break`, 0.11.0
`v1/core/sched/scheduler.py` L481-483), so requests 1 and 2, whose KV has arrived, never run
and never free their 6 blocks: the decode engine steps forever with nothing scheduled.

`test_real_vllm_0_11_0_hangs` drives vLLM's own Scheduler with vLLM's own NixlConnector
(scheduler side; only the worker's `finished_recving` report is faked); `test_kvsim_...`
runs the same shape through `kvsim disagg` and finds the same state.
"""

from __future__ import annotations

import warnings

import pytest

from sim.cluster.run import run_disaggregated
from sim.scenario.schema import scenario_from_dict
from tests.harness.vllm_install import load_or_skip

warnings.filterwarnings("ignore", module="requests")

BLOCK_SIZE = 4
NUM_BLOCKS = 12  # including the null block
MAX_MODEL_LEN = 40
# (request id, prompt tokens, output tokens)
REQUEST_0 = (0, 16, 20)
LATE = [(1, 12, 4), (2, 12, 4)]


def _install():
    """The loaded vLLM 0.11.0, or a skip (a failure under KVSIM_REQUIRE_VLLM=1)."""
    return load_or_skip("0.11.0")


class _RealDecodeEngine:
    """vLLM 0.11.0's Scheduler with a NixlConnector (scheduler role) as a decode engine."""

    def __init__(self) -> None:
        from sim.vllm_real.loader import import_vllm
        from sim.vllm_real.v1_sched_adapter import RealV1Scheduler, SchedCase

        case = SchedCase(
            num_blocks=NUM_BLOCKS,
            block_size=BLOCK_SIZE,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=4,
            max_num_batched_tokens=64,
        )
        self.adapter = RealV1Scheduler(case, install=_install())
        install = self.adapter.install
        cfg = import_vllm("config", install)
        base = import_vllm("distributed.kv_transfer.kv_connector.v1.base", install)
        nixl = import_vllm("distributed.kv_transfer.kv_connector.v1.nixl_connector", install)
        self._outputs = import_vllm("v1.outputs", install)
        scheduler = self.adapter.real
        scheduler.vllm_config.kv_transfer_config = cfg.KVTransferConfig(
            kv_connector="NixlConnector", kv_role="kv_both", engine_id="decode-0"
        )
        scheduler.connector = nixl.NixlConnector(
            scheduler.vllm_config, base.KVConnectorRole.SCHEDULER
        )
        #: Reads the (fake) worker reports finished in the next step's output.
        self.reads_done: set[str] = set()
        runner_output = self.adapter._fake_runner_output

        def with_reads(output):
            out = runner_output(output)
            out.kv_connector_output = self._outputs.KVConnectorOutput(
                finished_recving=set(self.reads_done)
            )
            self.reads_done.clear()
            return out

        self.adapter._fake_runner_output = with_reads

    def hand_off(self, request_id: int, prompt_tokens: int, output_tokens: int) -> None:
        """A request whose prompt a prefill engine computed (the proxy's kv_transfer_params)."""
        from sim.vllm_real.v1_adapter import request_extra_kwargs
        from sim.vllm_real.v1_sched_adapter import RequestSpec

        adapter = self.adapter
        content = RequestSpec(
            request_id, ((request_id + 1, prompt_tokens),), output_tokens, 0, 0.0
        ).content()
        params = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(range(1, prompt_tokens // BLOCK_SIZE + 1)),
            "remote_engine_id": "prefill-0",
            "remote_host": "prefill-host",
            "remote_port": 5600,
        }
        request = adapter._req_mod.Request(
            request_id=str(request_id),
            prompt_token_ids=content.token_ids(),
            sampling_params=adapter._sp_mod.SamplingParams(
                max_tokens=output_tokens,
                ignore_eos=True,
                extra_args={"kv_transfer_params": params},
            ),
            pooling_params=None,
            arrival_time=0.0,
            priority=0,
            block_hasher=adapter._hasher,
            **request_extra_kwargs(adapter.install),
        )
        adapter._contents[request.request_id] = content
        adapter.real.add_request(request)


@pytest.mark.vllm
def test_real_vllm_0_11_0_hangs_on_the_pd_decode_head_of_line_block():
    engine = _RealDecodeEngine()
    scheduler = engine.adapter.real
    engine.hand_off(*REQUEST_0)
    engine.adapter.step()  # allocated, WAITING_FOR_REMOTE_KVS; the read starts
    engine.reads_done.add("0")
    for _ in range(2):
        engine.adapter.step()  # the read is reported; request 0 runs
    assert [r.request_id for r in scheduler.running] == ["0"]
    for late in LATE:
        engine.hand_off(*late)
    records = [engine.adapter.step() for _ in range(5)]
    assert records[-1].preempted == [0]  # request 0 preempted itself at its 21st token
    engine.reads_done.update({"1", "2"})  # both reads complete: nothing else is pending
    records = [engine.adapter.step() for _ in range(20)]
    assert all(not r.scheduled and not r.preempted and not r.finished for r in records)
    head = scheduler.waiting.peek_request()
    assert head.request_id == "0" and head.status.name == "PREEMPTED"
    assert head.num_tokens == 21  # needs ceil(21 / 4) = 6 blocks
    assert engine.adapter.num_free_blocks == 5
    assert not scheduler.running
    assert sorted(r.request_id for r in scheduler.waiting) == ["0", "1", "2"]
    assert scheduler.has_unfinished_requests()


def test_kvsim_finds_the_same_pd_decode_deadlock():
    """One prefill and one decode replica; a 100 ms link read keeps requests 1 and 2
    parked (handed off at ~0.11 s) while request 0 decodes into its sixth block."""
    requests = [
        {"arrival_s": arrival_s, "prompt_tokens": prompt, "output_tokens": output}
        for arrival_s, (_, prompt, output) in zip([0.0, 0.1, 0.1], [REQUEST_0, *LATE], strict=True)
    ]
    data = {
        "name": "pd-decode-head-of-line",
        "model": "llama-3.1-8b",
        "cache": {
            "block_size": BLOCK_SIZE,
            "num_gpu_blocks": NUM_BLOCKS,
            "num_cpu_blocks": 0,
            "enable_prefix_caching": False,
        },
        "scheduler": {
            "design": "v1-engine",
            "vllm_version": "0.11.0",
            "max_model_len": MAX_MODEL_LEN,
            "max_num_seqs": 4,
            "max_num_batched_tokens": 64,
            "enable_chunked_prefill": True,
        },
        "engine": {"audit_level": "full"},
        "cluster": {
            "mode": "disaggregated",
            "link": {"bandwidth_Gbps": 100, "efficiency": 0.5, "latency_us": 100_000},
        },
        "workload": {"kind": "inline", "requests": requests},
        "step_time": {"linear": {"fixed_s": 0.01}},
    }
    result = run_disaggregated(scenario_from_dict(data, "pd-decode-head-of-line"))
    assert result.prefill.violations.empty
    (row,) = result.decode.violations.itertuples()
    assert row.kind == "no_progress"
    assert (row.request_id, row.needed_blocks, row.free_blocks) == (0, 6, 5)
    assert "request 0 needs 6 blocks (21 tokens)" in row.message
    # Regression (stall message): the parked requests' blocks were "held by no request".
    assert "waiting for their KV: request 2 holds 3, request 1 holds 3" in row.message
    assert "1 block(s) held by no request" in row.message  # V1's null block, no more
    client = result.requests.set_index("request_id")
    assert client.loc[0, "generated_tokens"] == 5  # 16 + 5 = 21 tokens, as in vLLM
    assert set(client["state"]) == {"aborted"}
    # The reads of 1 and 2 had completed: nothing but the head kept them from running.
    transfers = result.transfers.set_index("request_id")
    assert (transfers.loc[[1, 2], "end_s"] <= row.time_s).all()
