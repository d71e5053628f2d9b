"""The P/D connector: vLLM 0.11.0's NIXL connector flow on kvsim's KV-connector seam.

vLLM 0.11.0 (`distributed/kv_transfer/kv_connector/v1/nixl_connector.py`), with the P/D proxy
sending each request to a prefill engine with `max_tokens=1`, then to a decode engine with the
prefill's `kv_transfer_params`:

* Prefill side (`PrefillSide`): when the request finishes (`FINISHED_LENGTH_CAPPED`: its one
  token), `request_finished` answers `delay_free_blocks = True` with the block ids to read
  (L406-451): the blocks stay held until the decode side has read them and the worker reports
  `finished_sending` (the scheduler frees them then: `sim.kv_connector.hooks`).
* Decode side (`DecodeSide`): `get_num_new_matched_tokens` answers the prompt beyond the local
  prefix hit as external tokens, loaded asynchronously (L284-315: `count =
  len(prompt_token_ids) - num_computed_tokens`, True); the scheduler allocates their blocks and
  parks the request in WAITING_FOR_REMOTE_KVS; `update_state_after_alloc` queues the read of
  the blocks not hit locally (`get_unhashed_block_ids`, L346-366) and sets
  `do_remote_prefill` False, so a request preempted later recomputes locally. The worker reads
  the blocks (`_read_blocks`, L1240-1312) and notifies the prefill side, whose blocks are then
  freed: one transfer ends both the receive and the send.

`TransferLedger` is the link between the two: it knows which prefill replica holds each
handed-off request's KV, computes each read's time when the decode side starts it
(`sim.cluster.links.transfer_time_s`), and tells the prefill replica when its send completes.
Not modelled: the NIXL abort timeout (`VLLM_NIXL_ABORT_REQUEST_TIMEOUT`: kvsim frees a prefill
replica's blocks only when the read completes, or when the decode side gives the request up).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sim.cluster.links import LinkSpec, transfer_time_s
from sim.kv_connector.base import (
    FREE_NOW,
    NO_MATCH,
    ExternalMatch,
    FinishOutcome,
    PassiveConnector,
    TransferReport,
)
from sim.scheduler.request import Request


@dataclass(frozen=True, slots=True)
class Transfer:
    """One request's KV read from a prefill replica into a decode replica (simulated s)."""

    request_id: int
    prefill_replica: int
    decode_replica: int
    num_blocks: int
    num_bytes: int
    start_s: float
    end_s: float


@dataclass
class TransferLedger:
    """The transfers between the pools, shared by every replica's P/D connector.

    Example (bs 16, 2 MiB blocks, rdma-400g): a 40-token prompt handed off from prefill
    replica 0 is allocated on decode replica 1 at t = 1.0 s with no local hit: 3 blocks,
    6,291,456 B, 6,291,456 / 45e9 + 20 us = 0.16 ms, so both its receive (decode 1) and its
    send (prefill 0) complete at t = 1.00016 s.
    """

    link: LinkSpec
    block_size: int
    block_bytes: int
    num_streams: int = 1
    #: Called with a prefill replica's index when its send's completion time becomes known
    #: (the replica may be asleep, waiting for exactly that).
    on_send_scheduled: Callable[[int], None] = lambda index: None
    #: request id -> the prefill replica holding its KV, until the decode side reads it.
    remote: dict[int, int] = field(default_factory=dict)
    #: prefill replica -> {request id: time its send completes}.
    sends: dict[int, dict[int, float]] = field(default_factory=dict)
    transfers: list[Transfer] = field(default_factory=list)

    def hand_off(self, request_id: int, prefill_index: int) -> None:
        self.remote[request_id] = prefill_index

    def start_read(
        self, request_id: int, decode_index: int, num_blocks: int, now_s: float
    ) -> float:
        """The decode side reads `num_blocks` blocks from now on; returns when it is done."""
        prefill_index = self.remote.pop(request_id)
        num_bytes = num_blocks * self.block_bytes
        end_s = now_s + transfer_time_s(num_bytes, self.link, self.num_streams)
        self.transfers.append(
            Transfer(request_id, prefill_index, decode_index, num_blocks, num_bytes, now_s, end_s)
        )
        self.sends.setdefault(prefill_index, {})[request_id] = end_s
        self.on_send_scheduled(prefill_index)
        return end_s

    def give_up(self, request_id: int, now_s: float) -> None:
        """The decode side dropped a request before reading it: the prefill side frees its
        blocks at once (the notification NIXL sends with no blocks, L424-433)."""
        prefill_index = self.remote.pop(request_id, None)
        if prefill_index is not None:
            self.sends.setdefault(prefill_index, {})[request_id] = now_s
            self.on_send_scheduled(prefill_index)


def _due(pending: dict[int, float], now_s: float) -> frozenset[int]:
    done = frozenset(rid for rid, end_s in pending.items() if end_s <= now_s)
    for rid in done:
        del pending[rid]
    return done


class PrefillSide(PassiveConnector):
    """A prefill replica's connector: keeps a finished prompt's blocks until they are read."""

    def __init__(self, ledger: TransferLedger, replica_index: int) -> None:
        self.ledger = ledger
        self.index = replica_index
        self._sends = ledger.sends.setdefault(replica_index, {})

    def request_finished(self, request: Request, block_ids: list[int]) -> FinishOutcome:
        """Delay the free while the decode side has the blocks to read (L435-451)."""
        if not block_ids:
            return FREE_NOW
        return FinishOutcome(
            delay_free_blocks=True,
            kv_transfer_params={
                "do_remote_prefill": True,
                "remote_block_ids": list(block_ids),
                "remote_engine_id": self.index,
            },
        )

    def get_finished(self, finished_request_ids: set[int], now_s: float) -> TransferReport:
        return TransferReport(finished_sending=_due(self._sends, now_s))

    def next_completion_s(self) -> float | None:
        return min(self._sends.values(), default=None)


class DecodeSide(PassiveConnector):
    """A decode replica's connector: the prompt's KV is remote; read it, then decode."""

    def __init__(self, ledger: TransferLedger, replica_index: int) -> None:
        self.ledger = ledger
        self.index = replica_index
        self._recvs: dict[int, float] = {}

    def get_num_new_matched_tokens(
        self, request: Request, num_local_computed_tokens: int
    ) -> ExternalMatch:
        if request.request_id not in self.ledger.remote:
            return NO_MATCH  # not handed off, or already read once (do_remote_prefill False)
        count = request.prompt_tokens - num_local_computed_tokens
        return ExternalMatch(count, load_async=True) if count > 0 else NO_MATCH

    def update_state_after_alloc(
        self,
        request: Request,
        block_ids: list[int],
        num_local_computed_tokens: int,
        num_external_tokens: int,
        now_s: float,
    ) -> None:
        """Start the read of the blocks not hit locally (whole blocks move).

        Example (bs 16): a 100-token prompt with a 32-token local hit holds 7 blocks; the
        first 2 are local, so 5 are read."""
        if num_external_tokens == 0 or request.request_id not in self.ledger.remote:
            return
        num_blocks = len(block_ids) - num_local_computed_tokens // self.ledger.block_size
        self._recvs[request.request_id] = self.ledger.start_read(
            request.request_id, self.index, num_blocks, now_s
        )

    def get_finished(self, finished_request_ids: set[int], now_s: float) -> TransferReport:
        return TransferReport(finished_recving=_due(self._recvs, now_s))

    def next_completion_s(self) -> float | None:
        return min(self._recvs.values(), default=None)


@dataclass(frozen=True)
class PrefillSideConfig:
    """`EngineConfig.kv_connector` of the prefill pool (`KVConnectorConfig`)."""

    ledger: TransferLedger

    def build(self, replica_index: int, block_size: int) -> PrefillSide:
        return PrefillSide(self.ledger, replica_index)


@dataclass(frozen=True)
class DecodeSideConfig:
    """`EngineConfig.kv_connector` of the decode pool (`KVConnectorConfig`)."""

    ledger: TransferLedger

    def build(self, replica_index: int, block_size: int) -> DecodeSide:
        return DecodeSide(self.ledger, replica_index)
