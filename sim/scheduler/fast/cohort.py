"""The decode cohort: running decodes that advance without being visited.

The decode fast path (`sim.scheduler.fast.layer`) already skips the manager for quiet decodes,
but a scheduler that walks its running queue still touches every request on every step. The
cohort removes that walk. A running decode *joins* the cohort after the step that made it one;
from then on its token count is implicit::

    num_tokens(request) = base_tokens + (clock - base_clock)

where `clock` counts the decode steps of the replica (`tick`). Each member is filed under the
clock of its next *event*, the first step at which it must be handled on its own: its decode
needs the manager (it reaches `touch_len`, e.g. a block boundary) or it will finish. At that
step the scheduler takes it out (`pop_due`), materializes its tokens, and treats it as before.
Running sums (members, total context, context capped at the attention window) give the step
time model what it needs without listing the members.

Example (bs=16, full attention, max_tokens=100): a request with a 20-token prompt joins after
its prefill with 21 tokens and touch_len 33 at clock 7; its event is at clock 7 + (33 - 21) =
19. Between clocks 7 and 19 no code looks at it; at clock 12 it implicitly has 26 tokens and a
decode context of 25. At clock 19 it leaves with its 12 tokens appended in one call.

Who may join is decided by the scheduler (the same tests as its per-request quiet path); the
scheduler also guarantees that a step it runs lazily would have found every member quiet
(enough free blocks, enough token budget), and otherwise releases the whole cohort and walks.
Results are identical either way (tests/scheduler/test_decode_cohort.py).
"""

from __future__ import annotations

from collections.abc import Callable

from sim.latency.batch import DecodeBulk
from sim.scheduler.request import Membership, Request

MEMBER = Membership.MEMBER


class DecodeCohort:
    """One replica's cohort (see the module docstring)."""

    def __init__(self, window: int | None) -> None:
        self.window = window
        #: Decode steps taken so far (only steps that ran the members advance it).
        self.clock = 0
        #: End time of the last tick: the time of every member's newest token.
        self.last_tick_s: float | None = None
        # A dict as an ordered set: iteration order never depends on object addresses.
        self._members: dict[Request, None] = {}
        self._context_sum = 0
        # Members whose context is still below the window, and the sum of their contexts.
        self._num_below = 0
        self._below_sum = 0
        #: clock -> members whose context reaches the window at that clock.
        self._crossings: dict[int, int] = {}
        #: clock -> members whose event falls at that clock (stale entries are skipped).
        self._events: dict[int, list[Request]] = {}

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, request: Request) -> bool:
        return request.membership is MEMBER

    # ------------------------------------------------------------------ membership
    def join(self, request: Request, event_len: int) -> bool:
        """Add a running decode whose next event is at `event_len` tokens; False if that is now.

        The caller guarantees the member's decodes below `event_len` are quiet.
        """
        num_tokens = request.seq.content.num_tokens
        if event_len <= num_tokens:
            return False
        clock = self.clock
        event = clock + event_len - num_tokens
        request.membership = MEMBER
        request.cohort_clock = clock
        request.cohort_tokens = num_tokens
        request.cohort_event = event
        request.needs_sync = True
        self._members[request] = None
        self._file(request, event)
        context = num_tokens - 1
        self._context_sum += context
        window = self.window
        if window is not None and context < window:
            self._num_below += 1
            self._below_sum += context
            cross = clock + window - context
            self._crossings[cross] = self._crossings.get(cross, 0) + 1
        return True

    def join_outsiders(
        self, outsiders: dict[Request, None], event_len_of: Callable[[Request], int | None]
    ) -> None:
        """After a step: join every outsider with a quiet stretch ahead, and drop it from
        `outsiders`. `event_len_of` gives a request's next event length, None if it cannot
        be a member (the scheduler's own quiet rules)."""
        joined = []
        for request in outsiders:
            event_len = event_len_of(request)
            if event_len is not None and self.join(request, event_len):
                joined.append(request)
        for request in joined:
            del outsiders[request]

    def leave(self, request: Request) -> None:
        """Take a member out: its skipped tokens are appended now (one call, same content)."""
        base_clock = request.cohort_clock
        delta = self.clock - base_clock
        del self._members[request]
        request.membership = Membership.OUTSIDE
        base_context = request.cohort_tokens - 1
        context = base_context + delta
        self._context_sum -= context
        window = self.window
        if window is not None and context < window:
            self._num_below -= 1
            self._below_sum -= context
            cross = base_clock + window - base_context
            self._crossings[cross] -= 1
        if delta:
            seq = request.seq
            seq.content.append_output(-(seq.seq_id + 1), delta)  # == delta x append_tokens(1)
            seq.num_computed_tokens += delta
            request.last_token_s = self.last_tick_s

    def pop_due(self) -> list[Request]:
        """The members whose event is at the current clock, with their tokens brought up to
        date. They stay members: the caller either `leave`s them or, after the call their
        decode needed, `refile`s them under their next event."""
        bucket = self._events.pop(self.clock, None)
        if not bucket:
            return []
        due = []
        clock = self.clock
        last_tick_s = self.last_tick_s
        for request in bucket:
            if request.membership is MEMBER and request.cohort_event == clock:
                # Append its skipped tokens and restart its count from now. Its context, so the
                # sums and the clock at which it reaches the window, do not change.
                delta = clock - request.cohort_clock
                if delta:
                    seq = request.seq
                    seq.content.append_output(-(seq.seq_id + 1), delta)
                    seq.num_computed_tokens += delta
                    request.last_token_s = last_tick_s
                    request.cohort_clock = clock
                    request.cohort_tokens += delta
                # A member that left and rejoined under the same clock is in the bucket twice:
                # the mark makes the second entry stale (`refile` sets a real event again).
                request.cohort_event = None
                due.append(request)
        return due

    def refile(self, request: Request, event_len: int) -> None:
        """File a due member (see `pop_due`) under its next event, during the step that runs
        its decode at its current length N: from the next step on it has N + k tokens at
        clock + k, so the event is at clock + max(1, event_len - N)."""
        num_tokens = request.cohort_tokens
        event = self.clock + max(1, event_len - num_tokens)
        request.cohort_event = event
        request.needs_sync = True
        self._file(request, event)

    def _file(self, request: Request, event: int) -> None:
        bucket = self._events.get(event)
        if bucket is None:
            self._events[event] = [request]
        else:
            bucket.append(request)

    def release_all(self) -> list[Request]:
        """Take every member out (before a step that must visit each request)."""
        members = list(self._members)
        for request in members:
            self.leave(request)
        self._events.clear()
        self._crossings.clear()
        return members

    def max_order_key(self) -> int:
        """The largest `order_key` among the members (the last member in its queue)."""
        return max(request.order_key for request in self._members)

    # ------------------------------------------------------------------ steps
    def bulk(self) -> DecodeBulk:
        """What this step's member decodes read: count, context sum, windowed context sum."""
        size = len(self._members)
        window = self.window
        windowed = self._context_sum
        if window is not None:
            windowed = self._below_sum + window * (size - self._num_below)
        return DecodeBulk(size, self._context_sum, window, windowed)

    def tick(self, now_s: float) -> None:
        """Every member decoded one token in the step that ended at `now_s`."""
        size = len(self._members)
        self.clock += 1
        self.last_tick_s = now_s
        self._context_sum += size
        if self.window is not None:
            self._below_sum += self._num_below
            crossed = self._crossings.pop(self.clock, 0)
            if crossed:
                self._num_below -= crossed
                self._below_sum -= crossed * self.window
