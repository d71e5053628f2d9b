"""Schedulers: pure-Python models of vLLM's v0 and V1-engine schedulers (no SimPy inside)."""

from sim.scheduler.config import Policy, PreemptionMode, SchedulerConfig
from sim.scheduler.request import Request, RequestState, ScheduledWork, StepPlan
from sim.scheduler.v0.scheduler import V0Scheduler
from sim.scheduler.v1.scheduler import V1Scheduler

__all__ = [
    "Policy",
    "PreemptionMode",
    "Request",
    "RequestState",
    "ScheduledWork",
    "SchedulerConfig",
    "StepPlan",
    "V0Scheduler",
    "V1Scheduler",
]
