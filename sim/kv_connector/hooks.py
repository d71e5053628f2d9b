"""The V1 scheduler's side of a KV connector: the state upstream keeps in `Scheduler`.

`sim.scheduler.v1.scheduler` calls these hooks where vLLM 0.11.0's `vllm/v1/core/sched/scheduler.py`
calls its connector (line numbers in `sim.kv_connector.base`). They hold what the upstream
scheduler holds for it: the ids whose loads finished (`finished_recving_kv_req_ids`, L135), the
finished requests whose blocks wait for their stores (`_free_request` with
`delay_free_blocks`, L1147-1160), and the finished ids the worker has not yet been told of.

With `NoConnector` every hook returns at once (`enabled` False), so the scheduler's decisions
are those of a scheduler without the seam.

Polling: upstream's worker reports completed transfers after each forward pass
(`get_finished`) and the scheduler applies them in `update_from_output` (L1270-1296), so the
next `schedule()` sees them. kvsim polls at the start of each `schedule()` (the end of the
previous step) and when an idle replica wakes at a transfer's completion time. The idle wake
stands for upstream's steps that schedule nothing: the engine core still calls the executor
(`EngineCore.step`, `v1/engine/core.py` L283-288 @0.11.0) and the model runner reports the
finished transfers without a forward pass (`gpu_model_runner.py` L2241-2246,
`kv_connector_no_forward`, `kv_connector_model_runner_mixin.py` L69-84), so a store or a load
completes with no batch running.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.kv_connector.base import NO_MATCH, ExternalMatch, KVConnector, NoConnector

if TYPE_CHECKING:  # the scheduler imports this module
    from sim.scheduler.request import Request, StepPlan


class ConnectorHooks:
    """Scheduler-side connector state for one replica (see module docstring)."""

    def __init__(self, connector: KVConnector, kv_cache_manager: Any) -> None:
        self.connector = connector
        self.enabled = not isinstance(connector, NoConnector)
        self.kv_cache_manager = kv_cache_manager
        #: Read only with a connector (vLLM's real manager, in the lockstep tests, has none).
        self.block_size: int = kv_cache_manager.block_size if self.enabled else 0
        #: Loads completed, not yet seen by the waiting loop (upstream L135).
        self.finished_recving_ids: set[int] = set()
        #: Finished requests whose blocks are kept until `finished_sending` names them.
        self.delayed_free: dict[int, Request] = {}
        self._finished_since_poll: set[int] = set()

    # ------------------------------------------------------------------ worker report
    def poll(self, now_s: float) -> None:
        """`_update_from_kv_xfer_finished`: apply the transfers completed by `now_s`.

        Delayed blocks are freed in request-id order (upstream iterates a set; kvsim needs a
        deterministic free order, which decides the free queue's order)."""
        if not self.enabled:
            return
        report = self.connector.get_finished(self._finished_since_poll, now_s)
        self._finished_since_poll = set()
        self.finished_recving_ids |= report.finished_recving
        for request_id in sorted(report.finished_sending):
            request = self.delayed_free.pop(request_id, None)
            if request is not None:
                self.kv_cache_manager.free(request.seq)

    def next_completion_s(self) -> float | None:
        return self.connector.next_completion_s() if self.enabled else None

    # ------------------------------------------------------------------ waiting loop
    def get_num_new_matched_tokens(
        self, request: Request, num_local_computed_tokens: int
    ) -> ExternalMatch:
        if not self.enabled:
            return NO_MATCH
        return self.connector.get_num_new_matched_tokens(request, num_local_computed_tokens)

    def update_state_after_alloc(
        self,
        request: Request,
        num_local_computed_tokens: int,
        num_external_tokens: int,
        now_s: float,
    ) -> None:
        if not self.enabled:
            return
        block_ids = self.kv_cache_manager.get_block_ids(request.seq.seq_id)
        self.connector.update_state_after_alloc(
            request, block_ids, num_local_computed_tokens, num_external_tokens, now_s
        )

    def update_waiting_for_remote_kv(self, request: Request) -> bool:
        """`_update_waiting_for_remote_kv` (L1237-1268): False while the load runs; once done,
        the request's computed tokens become its blocks' tokens, less one when that is the
        whole request (its last token is recomputed for the logits).

        Example (bs 16): a 100-token prompt holding 6 loaded blocks resumes with 96 computed
        tokens; a 96-token prompt holding 6 resumes with 95.

        kvsim's manager caches the loading blocks when it allocates them (upstream delays
        that, `delay_cache_blocks=True`, until here): a request with the same prefix that
        arrives during the load hits them at once instead of loading them itself.
        """
        request_id = request.seq.seq_id
        if request_id not in self.finished_recving_ids:
            return False
        self.finished_recving_ids.discard(request_id)
        num_blocks = len(self.kv_cache_manager.get_block_ids(request_id))
        num_computed_tokens = min(num_blocks * self.block_size, request.seq.num_tokens)
        if num_computed_tokens == request.seq.num_tokens:
            num_computed_tokens -= 1
        request.seq.num_computed_tokens = num_computed_tokens
        return True

    # ------------------------------------------------------------------ step boundaries
    def build_connector_meta(self, plan: StepPlan, now_s: float) -> None:
        if self.enabled:
            self.connector.build_connector_meta(plan, now_s)

    def wait_for_save(self, end_s: float) -> None:
        if self.enabled:
            self.connector.wait_for_save(end_s)

    def free_finished(self, request: Request) -> None:
        """`_free_request` (L1147-1160): free the request's blocks, unless the connector keeps
        them until its stores finish."""
        if not self.enabled:
            self.kv_cache_manager.free(request.seq)
            return
        request_id = request.seq.seq_id
        self._finished_since_poll.add(request_id)
        block_ids = self.kv_cache_manager.get_block_ids(request_id)
        outcome = self.connector.request_finished(request, block_ids)
        if outcome.delay_free_blocks:
            self.delayed_free[request_id] = request
        else:
            self.kv_cache_manager.free(request.seq)
