"""The per-step token and sequence budget (vLLM `SchedulingBudget`, `scheduler.py:L41-99 @fc93e56`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, init=False)
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
    #: `count_running_seqs` was called: ids not added explicitly are the running ones.
    _running_counted: bool = False
    _running_uncounted: set[int] = field(default_factory=set)

    def __init__(self, token_budget: int, max_num_seqs: int) -> None:
        # Written out (dataclass(init=False)): one budget per engine step.
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.num_batched_tokens = 0
        self.num_curr_seqs = 0
        self._token_ids = set()
        self._seq_ids = set()
        self._running_counted = False
        self._running_uncounted = set()

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
        elif self._running_counted and request_id not in self._running_uncounted:
            self._running_uncounted.add(request_id)
            self.num_curr_seqs -= num_seqs

    def count_running_seqs(self, num_running: int) -> None:
        """`add_num_seqs(id, 1)` for each of the `num_running` single-sequence running requests
        (the per-step up-front count of `_schedule_default`, L770-773 @fc93e56), without
        listing them: a later `subtract_num_seqs` of an id not added otherwise is taken to be
        one of them and uncounts it once. The default policy subtracts only running requests
        and adds only others (prefills, swap-ins), so this is the same count in O(1).

        Example: 3 running; count_running_seqs(3) -> 3 seqs; subtract(7, 1) twice -> 2 seqs.
        """
        self.num_curr_seqs += num_running
        self._running_counted = True
