"""The per-step token and sequence budget (vLLM `SchedulingBudget`, `scheduler.py:L41-99 @fc93e56`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class SchedulingBudget:
    """Tokens and sequences scheduled in one step.

    Adds and subtracts are idempotent per request id, as in vLLM: counting a request twice in one
    step counts it once. Example: budget 8 tokens; add(r1, 5); add(r1, 5) -> 5 used, 3 remaining.
    """

    token_budget: int
    max_num_seqs: int
    num_batched_tokens: int = 0
    num_curr_seqs: int = 0
    _token_ids: set[int] = field(default_factory=set)
    _seq_ids: set[int] = field(default_factory=set)

    def can_schedule(self, num_new_tokens: int, num_new_seqs: int) -> bool:
        return (
            self.num_batched_tokens + num_new_tokens <= self.token_budget
            and self.num_curr_seqs + num_new_seqs <= self.max_num_seqs
        )

    def remaining_token_budget(self) -> int:
        return self.token_budget - self.num_batched_tokens

    def add_num_batched_tokens(self, request_id: int, num_tokens: int) -> None:
        if request_id not in self._token_ids:
            self._token_ids.add(request_id)
            self.num_batched_tokens += num_tokens

    def subtract_num_batched_tokens(self, request_id: int, num_tokens: int) -> None:
        if request_id in self._token_ids:
            self._token_ids.remove(request_id)
            self.num_batched_tokens -= num_tokens

    def add_num_seqs(self, request_id: int, num_seqs: int) -> None:
        if request_id not in self._seq_ids:
            self._seq_ids.add(request_id)
            self.num_curr_seqs += num_seqs

    def subtract_num_seqs(self, request_id: int, num_seqs: int) -> None:
        if request_id in self._seq_ids:
            self._seq_ids.remove(request_id)
            self.num_curr_seqs -= num_seqs

    def add_single_seq_requests(self, request_ids: Iterable[int]) -> None:
        """`add_num_seqs(id, 1)` for many single-sequence requests at once (the per-step
        up-front count of `_schedule_default`, L770-773 @fc93e56, in one set operation)."""
        new = set(request_ids) - self._seq_ids
        self._seq_ids |= new
        self.num_curr_seqs += len(new)
