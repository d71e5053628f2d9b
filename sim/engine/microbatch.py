"""vLLM's micro-batching tokenizer (0.11.0 to 0.20.0): one batcher task per API server that
tokenizes the prompts in batches on a one-thread executor, on the server's event loop.

`AsyncMicrobatchTokenizer` (0.19.1 `vllm/utils/async_utils.py` L24-141, 0.20.0 the same lines,
0.11.0 `vllm/utils/__init__.py` L465-580; the completions renderer awaits it, 0.19.1
`renderers/base.py` L141-147 and L379-390) puts each prompt on an `asyncio.Queue` and awaits a
future. Its batcher task (`_batch_encode_loop`) takes the first prompt, then more with
`asyncio.wait_for(queue.get(), timeout)` until 32 (`max_batch_size`) or until 2 ms
(`batch_wait_timeout_s`) have passed since the first, tokenizes them in one call on its
one-thread executor (`run_in_executor`, off the loop), and sets each prompt's future. The
tokenizer is serial: one batch at a time, the next collected only when the last is done.

What a batch collects depends on the server's Python (`WaitFor`). Up to 3.11, `wait_for` wraps
`queue.get()` in a Task (`asyncio/tasks.py` `wait_for`, 3.11: `ensure_future`, a done callback
`_release_waiter`, then `await waiter`), so each further prompt costs the batcher three turns on
the loop (the Task's step, its done callback, the batcher's wake-up), each behind whatever else
is ready. From 3.12 `wait_for` awaits `queue.get()` inline (`async with timeouts.timeout`):
a queued prompt is taken at once. On an idle loop a turn takes no time and both collect every
queued prompt; on a busy one, a turn waits its place in the FIFO ready queue, and under 3.11 the
2 ms window closes after one or two prompts: the whole server's intake then runs at a couple
of prompts per batch cycle (~5 turns and one executor call), however many are waiting.

Turns here are zero-cost turns on the API server's FIFO loop (`sim.engine.frontend`): a turn
waits for the work queued before it, as a callback scheduled with `call_soon` waits for the
ready queue. Worked example (Python 3.11, window 2 ms, 1 us a token): the loop is busy with
1 ms jobs back to back and two 1,000-token prompts are queued. The batcher takes the first at
0, its `wait_for` needs three turns (1, 2, 3 ms: past the window, but the Task already took
the second prompt, so it joins), so the batch is 2 and tokenizes 3-5 ms (2,000 us, off the
loop); two more turns (the executor's `call_soon_threadsafe` callback, the batcher) hand
the results back at 7 ms. Under 3.12 both are taken at 0 but the batch waits out its window
for more (2 ms), two turns for the timeout (3, 4 ms), tokenizes 4-6 ms and hands back at 8 ms.
On an idle loop, under either, the window and the tokenization: 4 ms.

Left out: the executor thread's competition for the GIL with the loop, the batch's own Python
overhead, and the other hops of a request's handler (each `asyncio.gather` is a few turns more).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from enum import Enum

import simpy

_Process = Generator[simpy.Event, object, None]

#: The kvsim pins whose API server tokenizes through `AsyncMicrobatchTokenizer` (added in the
#: 0.11 line; 0.25.1 onward tokenizes each prompt on the renderer's executor instead,
#: `renderers/base.py` `make_async(self._tokenize_prompt)`, which this module does not model).
MICROBATCH_RELEASES = ("0.11.0", "0.19.1", "0.20.0")

#: The server's Python where the measurement does not say: vLLM's container image's
#: (vllm-project/vllm `docker/Dockerfile`, `ARG PYTHON_VERSION=3.12`).
DEFAULT_SERVER_PYTHON = "3.12"


class WaitFor(Enum):
    """How `asyncio.wait_for(queue.get(), timeout)` waits (see the module docstring)."""

    TASK = "task"  # Python <= 3.11: a Task, three turns a prompt
    INLINE = "inline"  # Python >= 3.12: a queued prompt at once

    @classmethod
    def of_python(cls, version: str) -> WaitFor:
        """`"3.11"` -> TASK, `"3.12"` -> INLINE."""
        try:
            major, minor = (int(part) for part in version.split(".")[:2])
        except ValueError:
            raise ValueError(f"server Python {version!r}: give major.minor, like 3.12") from None
        return cls.TASK if (major, minor) < (3, 12) else cls.INLINE


# Turns on the loop (see `TokenizerBatcher._next_task` / `_next_inline`):
_TASK_ITEM_TURNS = 2  # after the Task's step: its done callback, the batcher's wake-up
_TASK_TIMEOUT_TURNS = 5  # timer, batcher, the Task cancelled, its done callback, batcher
_INLINE_TIMEOUT_TURNS = 2  # the timeout's handle cancels the batcher, which wakes
_EXECUTOR_TURNS = 2  # `call_soon_threadsafe(_call_set_state)`, then the batcher's wake-up


@dataclass(frozen=True, slots=True)
class MicrobatchTokenizer:
    """`AsyncMicrobatchTokenizer`'s defaults (0.19.1 `async_utils.py` L32-37) and the wait."""

    max_batch_size: int = 32
    window_s: float = 0.002
    wait_for: WaitFor = WaitFor.INLINE

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not self.window_s >= 0.0:
            raise ValueError(f"window_s must be >= 0, got {self.window_s}")


def microbatch_tokenizer_for(release: str, python: str) -> MicrobatchTokenizer | None:
    """The tokenizer batcher of kvsim pin `release` on a server running Python `python`, or
    None where that release has none."""
    if release not in MICROBATCH_RELEASES:
        return None
    return MicrobatchTokenizer(wait_for=WaitFor.of_python(python))


@dataclass(slots=True)
class _Prompt:
    tokens: int
    done: simpy.Event


@dataclass(slots=True)
class TokenizerBatcher:
    """The batcher task of one API server, on its loop `loop` (a FIFO `simpy.Resource`),
    tokenizing at `token_s` a token on its executor. `submit(tokens)` returns the event of the
    prompt's result; the caller still needs a turn to resume (its wake-up)."""

    env: simpy.Environment
    loop: simpy.Resource
    config: MicrobatchTokenizer
    token_s: float
    #: Every batch's size, in order (what the tests and diagnostics read).
    batch_sizes: list[int] = field(default_factory=list)
    _queue: simpy.Store = field(init=False)

    def __post_init__(self) -> None:
        self._queue = simpy.Store(self.env)
        self.env.process(self._run())

    def submit(self, tokens: int) -> simpy.Event:
        done = self.env.event()
        self._queue.put(_Prompt(tokens, done))
        return done

    def _turn(self) -> _Process:
        with self.loop.request() as turn:
            yield turn

    def _turns(self, count: int) -> _Process:
        for _ in range(count):
            yield from self._turn()

    def _run(self) -> _Process:
        """`_batch_encode_loop`: the first prompt (at once if one is queued, else a turn after
        it arrives), the rest of the batch, then the executor."""
        while True:
            queued = bool(self._queue.items)
            first = yield self._queue.get()
            if not queued:
                yield from self._turn()
            assert isinstance(first, _Prompt)
            batch = [first]
            yield from self._collect(batch)
            self.batch_sizes.append(len(batch))
            yield from self._tokenize(batch)

    def _collect(self, batch: list[_Prompt]) -> _Process:
        """Up to `max_batch_size` prompts while the window is open at the top of the loop
        (`timeout = deadline - loop.time(); if timeout <= 0: break`)."""
        deadline = self.env.now + self.config.window_s
        task = self.config.wait_for is WaitFor.TASK
        while len(batch) < self.config.max_batch_size and self.env.now < deadline:
            out: list[_Prompt] = []
            yield from (self._next_task if task else self._next_inline)(deadline, out)
            if not out:
                return  # `TimeoutError`: the batch is closed
            batch.append(out[0])

    def _next_task(self, deadline: float, out: list[_Prompt]) -> _Process:
        """Python <= 3.11: the Task's first step is a turn; it takes a queued prompt or waits
        for one (a turn when a put wakes it) or for the timer; then its done callback and the
        batcher's wake-up are a turn each, even when the window has closed by then."""
        yield from self._turn()
        prompt = yield from self._get_before(deadline)
        if prompt is None:
            yield from self._turns(_TASK_TIMEOUT_TURNS)
            return
        yield from self._turns(_TASK_ITEM_TURNS)
        out.append(prompt)

    def _next_inline(self, deadline: float, out: list[_Prompt]) -> _Process:
        """Python >= 3.12: a queued prompt at once; else the batcher waits for one (a turn
        after the put wakes it) or for the timeout (which cancels it: two turns)."""
        prompt = yield from self._get_before(deadline)
        if prompt is None:
            yield from self._turns(_INLINE_TIMEOUT_TURNS)
            return
        out.append(prompt)

    def _get_before(self, deadline: float) -> Generator[simpy.Event, object, _Prompt | None]:
        """A queued prompt at once; else the first put before `deadline` (a turn after it, the
        waiter's wake-up), or None at `deadline`."""
        if self._queue.items:
            prompt = yield self._queue.get()
            assert isinstance(prompt, _Prompt)
            return prompt
        get = self._queue.get()
        timer = self.env.timeout(max(0.0, deadline - self.env.now))
        yield get | timer
        if not get.triggered:
            get.cancel()
            return None
        yield from self._turn()
        assert isinstance(get.value, _Prompt)
        return get.value

    def _tokenize(self, batch: list[_Prompt]) -> _Process:
        """One call on the one-thread executor (off the loop), then the result comes back
        through two turns and every prompt's future is set; the woken handlers take their
        turns before the batcher's next (`yield timeout(0)`), as their wake-ups are scheduled
        first."""
        yield self.env.timeout(self.token_s * sum(p.tokens for p in batch))
        yield from self._turns(_EXECUTOR_TURNS)
        for prompt in batch:
            prompt.done.succeed()
        yield self.env.timeout(0)
