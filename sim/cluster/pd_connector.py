"""The P/D connector's two halves, modelled on vLLM 0.11.0's NIXL connector, as kvsim parts.

vLLM 0.11.0 (`distributed/kv_transfer/kv_connector/v1/nixl_connector.py`, `v1/core/sched/
scheduler.py`), with the P/D proxy sending each request to a prefill engine with
`max_tokens=1` and then to a decode engine:

* Prefill side: when the request finishes (`FINISHED_LENGTH_CAPPED`, its one token), the
  connector's `request_finished` returns `delay_free_blocks = True` (L435-451): the blocks stay
  held until the decode side has read them and the worker reports `finished_sending`
  (scheduler.py:L1290-1296 frees them then). `HeldUntilSent` below is that delayed free.
* Decode side: `get_num_new_matched_tokens` answers the whole prompt as external tokens,
  loaded asynchronously (L308-312: `count = len(prompt) - num_computed_tokens`, True);
  the scheduler allocates the prompt's blocks (`allocate_slots(request, num_external, ...,
  delay_cache_blocks=True)`, scheduler.py:L470-478) and parks the request in
  WAITING_FOR_REMOTE_KVS (L499-503); the worker reads the blocks. Once `finished_recving`
  is seen, `_update_waiting_for_remote_kv` (L1237-1268) sets `num_computed_tokens` to the
  blocks' tokens, capped at the prompt and minus one when it covers the whole prompt, so
  the first decode step recomputes the last prompt token and samples the first output token.
  `DecodeAdmission` below is that path.

kvsim runs these halves beside an unchanged `V1Scheduler`: the decode side allocates before
the scheduler's own step (FIFO, stopping at the first refusal, as the waiting loop breaks on a
None allocation) and hands the request to the scheduler's waiting queue once the KV is in,
with `num_computed_tokens = prompt - 1`; the scheduler then allocates its one new token on the
blocks it already holds, exactly its path for a WAITING request with computed tokens
(scheduler.py:L406-411). Not modelled: prefix-cache hits on the decode side (the whole prompt
is transferred) and the NIXL abort timeout (`VLLM_NIXL_ABORT_REQUEST_TIMEOUT`: no transfer
here is ever abandoned).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from sim.audit import AuditError
from sim.kv.types import Sequence
from sim.scheduler import Request


class HeldUntilSent:
    """The prefill replica's manager as its scheduler sees it: `free` of a finished request
    is delayed until `release` (the transfer's `finished_sending`), as NIXL's
    `request_finished` returns `delay_free_blocks`. Every other call goes to the audited
    manager unchanged, so the audit sees the held blocks as what they are: held.

    Example: a 40-token prompt (bs 16) finishes its prefill holding 3 blocks; `free` keeps
    them (`num_held_blocks` 3); `release(request_id)` after the transfer frees all 3.
    """

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._held: dict[int, Sequence] = {}

    def free(self, seq: Sequence) -> None:
        # Only a finished prefill (its one token sampled) waits for the transfer; a request
        # preempted or failed before its token frees at once, as without a connector
        # (`request_finished` is called for finished requests only).
        if seq.output_len == 0:
            self.manager.free(seq)
            return
        self._held[seq.seq_id] = seq

    def release(self, request_id: int) -> None:
        self.manager.free(self._held.pop(request_id))

    @property
    def num_held_requests(self) -> int:
        return len(self._held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.manager, name)


class DecodeAdmission:
    """The decode replica's requests whose prompt KV is still remote, in arrival order.

    `admit` allocates the whole prompt's blocks for the queue head while the pool allows
    (stopping at the first refusal: the waiting loop's head-of-line `break`); each admitted
    request then waits for its transfer. `kv_received` readies it for the scheduler.

    Example (bs 16): a 40-token prompt takes cdiv(40, 16) = 3 blocks at admission; when its
    KV is in, `num_computed_tokens` = min(3 x 16, 40) - 1 = 39, so the scheduler's next step
    computes 1 token (the last prompt token) and samples the first output token.
    """

    def __init__(self, manager: Any, block_size: int) -> None:
        self.manager = manager
        self.block_size = block_size
        self.pending: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self.pending.append(request)

    def admit(self) -> tuple[list[Request], list[tuple[Request, AuditError]]]:
        """(admitted, failed): requests whose blocks are now allocated, in order, and those
        whose allocation the auditor refused (the real engine would have raised)."""
        admitted: list[Request] = []
        failed: list[tuple[Request, AuditError]] = []
        while self.pending:
            request = self.pending[0]
            try:
                blocks = self.manager.allocate_slots(request.seq, request.prompt_tokens)
            except AuditError as error:
                self.pending.popleft()
                failed.append((request, error))
                continue
            if blocks is None:
                break
            self.pending.popleft()
            admitted.append(request)
        return admitted, failed

    def kv_received(self, request: Request) -> None:
        """`_update_waiting_for_remote_kv`: the computed tokens the received blocks cover."""
        seq = request.seq
        num_blocks = -(-seq.prompt_len // self.block_size)
        computed = min(num_blocks * self.block_size, seq.num_tokens)
        if computed == seq.num_tokens:
            computed -= 1
        seq.num_computed_tokens = computed
