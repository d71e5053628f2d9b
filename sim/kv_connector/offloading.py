"""CPU KV offloading for the V1 engine: vLLM 0.11.0's `OffloadingConnector`, scheduler side,
with the worker's copies timed over the host link.

Models `OffloadingConnectorScheduler` and `OffloadingConnectorWorker`
(`vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py @0.11.0`) with the CPU
spec (`vllm/v1/kv_offload/cpu.py:L20-46`, an `LRUOffloadingManager` over `num_cpu_blocks`
slots; `sim.kv_connector.cpu_tier`).

- **What is stored**: full blocks of `offloaded_block_size` tokens (a multiple of the GPU
  block size, `spec.py:L32-36`; the default is the GPU block size), keyed by the hash of their
  last GPU block (`_get_block_hashes`, L144-154): prompt and generated tokens alike.
- **When**: every step, for each scheduled request, the blocks its computed tokens fill for
  the first time (`_get_reqs_to_store`, L249-316) are given CPU slots at the end of
  `schedule()`; the worker copies them after the step's forward pass (`wait_for_save`,
  L74-78). A store that cannot evict enough stops the step's stores (`break`, L279-282).
- **When stored blocks count**: only when the worker reports the request's stores done, which
  it does once the request has finished (`get_finished`, L428-468); until then the blocks are
  not ready, neither hit nor evictable, and the request's GPU blocks are kept
  (`request_finished` -> delay_free_blocks, L344-365).
- **Loads**: a waiting request whose GPU prefix hit stops short is looked up block by block
  beyond it (`get_num_new_matched_tokens`, L156-205, after touching all its blocks); a hit of
  at least one offloaded block is loaded asynchronously into freshly allocated GPU blocks
  (`update_state_after_alloc`, L207-247) and the request waits in WAITING_FOR_REMOTE_KVS.

Times: a load starts when it is allocated (the step's `start_load_kv`); stores start when the
step ends; each direction is one ordered queue (`sim.kv_connector.link`). Transfer bytes are
the GPU blocks copied times the model's KV bytes per GPU block per GPU (`sim.memory.block_bytes`).

Worked example (bs 16 = offloaded block size, 2 MiB per block, PCIe 5.0 x16 at 80%): a
200-token prompt whose first 96 tokens were offloaded by an earlier finished request and whose
GPU blocks were evicted: the GPU hit is 0 blocks, the CPU lookup hits 6 blocks (96 tokens),
the load of 6 x 2,097,152 B takes 10 us + 12,582,912 / 50.4e9 s = 259.7 us, then the request
prefills 104 tokens instead of 200.

Deviations: the worker reports a finished request's stores at the first poll after they
complete (upstream: one step later at the earliest, when the finished id reaches the worker);
stores are issued in schedule order (upstream: new requests first, then running ones).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.kv.types import NONE_HASH, BlockHash, chain_hash
from sim.kv_connector.base import NO_MATCH, ExternalMatch, FinishOutcome, TransferReport
from sim.kv_connector.cpu_tier import LRUCpuTier
from sim.kv_connector.link import Link, TransferQueue
from sim.scheduler.request import Request, StepPlan


@dataclass(frozen=True, slots=True)
class OffloadingConfig:
    """A CPU tier per replica: `num_cpu_blocks` slots of `offloaded_block_size` tokens."""

    num_cpu_blocks: int
    #: KV bytes of one GPU block on one GPU (per tensor-parallel rank).
    gpu_block_bytes: int
    link: Link
    #: Tokens per offloaded block; None: the GPU block size.
    offloaded_block_size: int | None = None

    def __post_init__(self) -> None:
        if self.num_cpu_blocks <= 0:
            raise ValueError(f"num_cpu_blocks must be positive, got {self.num_cpu_blocks}")
        if self.gpu_block_bytes <= 0:
            raise ValueError(f"gpu_block_bytes must be positive, got {self.gpu_block_bytes}")

    def build(self, replica_index: int, block_size: int) -> OffloadingConnector:
        return OffloadingConnector(self, block_size)


@dataclass(slots=True)
class OffloadStats:
    """Per replica: lookups that hit the CPU tier and what moved over the link."""

    num_lookups: int = 0
    num_hit_lookups: int = 0
    num_loaded_tokens: int = 0
    num_stored_gpu_blocks: int = 0
    #: Loaded tokens per request id (a request may load again after a preemption).
    loaded_tokens_by_request: dict[int, int] = field(default_factory=dict)


class OffloadingConnector:
    """One replica's CPU offloading connector (see module docstring)."""

    #: Stores (and retries of refused ones) follow every scheduled decode (see `KVConnector`).
    needs_every_step = True

    def __init__(self, config: OffloadingConfig, gpu_block_size: int) -> None:
        offloaded = config.offloaded_block_size or gpu_block_size
        if offloaded % gpu_block_size:
            raise ValueError(
                f"offloaded_block_size {offloaded} is not a multiple of the GPU block size "
                f"{gpu_block_size}"
            )
        self.config = config
        self.gpu_block_size = gpu_block_size
        self.offloaded_block_size = offloaded
        self.block_size_factor = offloaded // gpu_block_size
        self.tier = LRUCpuTier(config.num_cpu_blocks, offloaded)
        self.h2d = TransferQueue(config.link)  # loads
        self.d2h = TransferQueue(config.link)  # stores
        self.stats = OffloadStats()
        #: Chained GPU-block hashes per request, extended as blocks fill.
        self._gpu_hashes: dict[int, list[BlockHash]] = {}
        self._next_stored_block_idx: dict[int, int] = {}
        self._reqs_being_stored: dict[int, set[BlockHash]] = {}
        self._reqs_being_loaded: dict[int, list[BlockHash]] = {}
        #: Load completion time per request; last store completion per request.
        self._load_end_s: dict[int, float] = {}
        self._store_end_s: dict[int, float] = {}
        #: Stores chosen by `build_connector_meta`, started by `wait_for_save`: (id, bytes).
        self._stores_to_start: list[tuple[int, int]] = []
        #: Finished requests whose stores the worker has not reported yet.
        self._finished_waiting_for_store: set[int] = set()

    # ------------------------------------------------------------------ hashes
    def _offloaded_hashes(self, request: Request, start: int, end: int) -> list[BlockHash]:
        """Hashes of offloaded blocks [start, end): each the hash of its last GPU block.

        Example (GPU bs 16, offloaded 32, factor 2): offloaded block 1 is keyed by GPU block 3.
        """
        factor = self.block_size_factor
        seq = request.seq
        hashes = self._gpu_hashes.setdefault(seq.seq_id, [])
        num_gpu = end * factor
        parent = hashes[-1] if hashes else NONE_HASH
        content = seq.content
        for index in range(len(hashes), num_gpu):
            parent = chain_hash(parent, content.block_key(index, self.gpu_block_size))
            hashes.append(BlockHash(parent))
        return hashes[start * factor + factor - 1 : num_gpu : factor]

    # ------------------------------------------------------------------ scheduler side
    def get_num_new_matched_tokens(
        self, request: Request, num_local_computed_tokens: int
    ) -> ExternalMatch:
        obs = self.offloaded_block_size
        num_blocks = request.seq.num_tokens // obs
        self.stats.num_lookups += 1
        self.tier.touch(self._offloaded_hashes(request, 0, num_blocks))
        if num_blocks * obs - num_local_computed_tokens < obs:
            return NO_MATCH  # less than one block to gain
        start = num_local_computed_tokens // obs
        hits = self.tier.lookup(self._offloaded_hashes(request, start, num_blocks))
        num_hit_tokens = obs * (start + hits) - num_local_computed_tokens
        if hits == 0 or num_hit_tokens < obs:
            return NO_MATCH
        self.stats.num_hit_lookups += 1
        return ExternalMatch(num_hit_tokens, load_async=True)

    def update_state_after_alloc(
        self,
        request: Request,
        block_ids: list[int],
        num_local_computed_tokens: int,
        num_external_tokens: int,
        now_s: float,
    ) -> None:
        if num_external_tokens == 0:
            return
        request_id = request.seq.seq_id
        obs = self.offloaded_block_size
        full_block_tokens = num_local_computed_tokens + num_external_tokens
        assert full_block_tokens % obs == 0, "a load ends on an offloaded-block boundary"
        start, num_blocks = num_local_computed_tokens // obs, full_block_tokens // obs
        block_hashes = self._offloaded_hashes(request, start, num_blocks)
        self.tier.prepare_load(block_hashes)
        num_gpu_blocks = num_external_tokens // self.gpu_block_size
        self._load_end_s[request_id] = self.h2d.submit(
            now_s, num_gpu_blocks * self.config.gpu_block_bytes
        )
        self._reqs_being_loaded[request_id] = block_hashes
        self._next_stored_block_idx[request_id] = num_blocks
        self.stats.num_loaded_tokens += num_external_tokens
        loaded = self.stats.loaded_tokens_by_request
        loaded[request_id] = loaded.get(request_id, 0) + num_external_tokens

    def build_connector_meta(self, plan: StepPlan, now_s: float) -> None:
        """`_get_reqs_to_store`: give CPU slots to the blocks each scheduled request filled."""
        obs = self.offloaded_block_size
        for work in plan.scheduled:
            request = work.request
            request_id = request.seq.seq_id
            num_blocks = request.seq.num_computed_tokens // obs  # computed after this step
            start = self._next_stored_block_idx.get(request_id, 0)
            if num_blocks <= start:
                continue
            store = self.tier.prepare_store(self._offloaded_hashes(request, start, num_blocks))
            if store is None:
                break  # upstream stops the step's stores here
            self._next_stored_block_idx[request_id] = num_blocks
            if not store.block_hashes_to_store:
                continue
            self.tier.touch(self._offloaded_hashes(request, 0, num_blocks))
            num_gpu_blocks = len(store.block_hashes_to_store) * self.block_size_factor
            self._stores_to_start.append((request_id, num_gpu_blocks * self.config.gpu_block_bytes))
            self._reqs_being_stored.setdefault(request_id, set()).update(
                store.block_hashes_to_store
            )
            self.stats.num_stored_gpu_blocks += num_gpu_blocks

    def wait_for_save(self, end_s: float) -> None:
        for request_id, num_bytes in self._stores_to_start:
            self._store_end_s[request_id] = self.d2h.submit(end_s, num_bytes)
        self._stores_to_start.clear()

    def request_finished(self, request: Request, block_ids: list[int]) -> FinishOutcome:
        request_id = request.seq.seq_id
        self._gpu_hashes.pop(request_id, None)
        self._next_stored_block_idx.pop(request_id, None)
        if request_id not in self._reqs_being_stored:
            return FinishOutcome()
        self._finished_waiting_for_store.add(request_id)
        return FinishOutcome(delay_free_blocks=True)

    # ------------------------------------------------------------------ worker side
    def get_finished(self, finished_request_ids: set[int], now_s: float) -> TransferReport:
        recving = sorted(r for r, end_s in self._load_end_s.items() if end_s <= now_s)
        for request_id in recving:
            del self._load_end_s[request_id]
            self.tier.complete_load(self._reqs_being_loaded.pop(request_id))
        sending = sorted(
            r for r in self._finished_waiting_for_store if self._store_end_s.get(r, 0.0) <= now_s
        )
        for request_id in sending:
            self._finished_waiting_for_store.discard(request_id)
            self._store_end_s.pop(request_id, None)
            self.tier.complete_store(self._reqs_being_stored.pop(request_id))
        return TransferReport(frozenset(sending), frozenset(recving))

    def next_completion_s(self) -> float | None:
        times = list(self._load_end_s.values())
        times += [self._store_end_s.get(r, 0.0) for r in self._finished_waiting_for_store]
        return min(times) if times else None
