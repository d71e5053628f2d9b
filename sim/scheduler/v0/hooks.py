"""The seam between the faithful v0 scheduler (`sim.scheduler.v0.scheduler`) and its speed layer
(`sim.scheduler.fast.v0`): the named hooks the scheduler calls, and their no-op defaults.

The scheduler holds one `V0Hooks` in `shortcuts`: `NoShortcuts` with the decode fast path off,
the layer's `V0DecodeShortcuts` with it on (`sim.scheduler.fast.v0.v0_shortcuts` picks). The
faithful code calls nothing of the layer but these hooks, and the layer reads nothing of the
scheduler but what the hooks pass and `V0Queues.running`. Every default leaves upstream's
behaviour as it is: no call skipped, no answer cached, no request kept out of a walk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

from sim.scheduler.budget import SchedulingBudget
from sim.scheduler.request import Request, StepPlan
from sim.scheduler.v0.outputs import RunningOutputs


class V0Queues(Protocol):
    """What the layer reads of the scheduler: its `running` queue (the priority policy
    replaces the deque, so the layer reads it afresh each time)."""

    @property
    def running(self) -> deque[Request]: ...


class V0Hooks(Protocol):
    """The hooks, in the order a step meets them."""

    def on_join(self, requests: Sequence[Request]) -> None:
        """`requests` were appended to `running` (`_add_seq_group_to_running`)."""

    def on_leave(self, request: Request) -> None:
        """`request` is being preempted (`_preempt`): it leaves `running`."""

    def before_manager_call(self, request: Request) -> None:
        """A real manager call on `request` follows (the manager catches up first)."""

    def after_manager_call(self, request: Request) -> None:
        """A real `allocate` / `append_slots` on `request` was made."""

    def known_later(self, request: Request) -> bool:
        """Whether `can_allocate` for the waiting head is known to answer LATER."""

    def on_later(self, request: Request) -> None:
        """`can_allocate` answered LATER for the waiting head."""

    def lazy_running(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> RunningOutputs | None:
        """The running phase without a walk, if the layer can; None: walk `running`."""

    def quiet_turn(
        self,
        request: Request,
        budget: SchedulingBudget,
        plan: StepPlan,
        chunking: bool,
        outputs: RunningOutputs,
    ) -> bool:
        """Schedule the head of `running` without a manager call, if that changes nothing."""

    def after_turn(self) -> None:
        """A request's upstream turn in the walk is over (the pool may have changed)."""

    def requeue_lazy(
        self,
        prefills: Sequence[Request],
        kept_prefill: Sequence[Request],
        swapped_in: Sequence[Request],
    ) -> None:
        """`_requeue` after `lazy_running` (only then is a walk `RunningWalk.LAZY`)."""

    def after_requeue(self) -> None:
        """`_requeue` refilled `running` after a full walk."""

    def after_update(self, plan: StepPlan, finished: list[Request], now_s: float) -> None:
        """`update` applied the step's outputs; `finished` left `running`."""

    def materialize(self) -> None:
        """Bring every request's tokens up to date."""

    def use_cohort(self, window: int | None) -> bool:
        """Keep steady decodes in a decode cohort; returns whether it is on."""


class NoShortcuts:
    """The hooks with the fast path off: every call is made, nothing is cached."""

    def on_join(self, requests: Sequence[Request]) -> None:
        pass

    def on_leave(self, request: Request) -> None:
        pass

    def before_manager_call(self, request: Request) -> None:
        pass

    def after_manager_call(self, request: Request) -> None:
        pass

    def known_later(self, request: Request) -> bool:
        return False

    def on_later(self, request: Request) -> None:
        pass

    def lazy_running(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> RunningOutputs | None:
        return None

    def quiet_turn(
        self,
        request: Request,
        budget: SchedulingBudget,
        plan: StepPlan,
        chunking: bool,
        outputs: RunningOutputs,
    ) -> bool:
        return False

    def after_turn(self) -> None:
        pass

    def requeue_lazy(
        self,
        prefills: Sequence[Request],
        kept_prefill: Sequence[Request],
        swapped_in: Sequence[Request],
    ) -> None:
        raise AssertionError("kvsim: a lazy running phase without the decode shortcuts")

    def after_requeue(self) -> None:
        pass

    def after_update(self, plan: StepPlan, finished: list[Request], now_s: float) -> None:
        pass

    def materialize(self) -> None:
        pass

    def use_cohort(self, window: int | None) -> bool:
        return False
