"""What happens to a request after the model ran: a token is sampled, the request may finish.

Shared by both schedulers; each decides when `num_computed_tokens` advances (v0 after the
step, in `_process_model_outputs`; the V1 engine at schedule time, `_update_after_schedule`).
"""

from __future__ import annotations

import contextlib

from sim.audit import AuditError
from sim.audit.base import AuditorBase
from sim.scheduler.fast.layer import sync
from sim.scheduler.request import Request, RequestState, StepPlan


def sample_token(request: Request, now_s: float) -> None:
    """Append one generated token and stamp first-token / last-token times."""
    seq = request.seq
    seq.content.append_output(-(seq.seq_id + 1), 1)  # == seq.append_tokens(1), without a hop
    if request.first_token_s is None:
        request.first_token_s = now_s
    request.last_token_s = now_s
    if request.token_times_s is not None:
        request.token_times_s.append(now_s)


def finish(request: Request, reason: str, now_s: float) -> None:
    request.finish(RequestState.FINISHED, reason, now_s)


def fail(
    manager: AuditorBase, request: Request, plan: StepPlan, error: AuditError, now_s: float
) -> None:
    """Fail a request whose manager call raised (the auditor recorded why) and release what it
    still holds. A free the auditor refuses (an AuditError: recorded as a violation) is ignored;
    any other exception is a kvsim bug and propagates (vLLM's managers free a sequence without
    a table as a no-op, so there is no KeyError to expect here)."""
    request.finish(RequestState.FAILED, error.violation.message, now_s)
    with contextlib.suppress(AuditError):
        sync(manager, request)
        manager.free(request.seq)
    plan.failed.append(request)
