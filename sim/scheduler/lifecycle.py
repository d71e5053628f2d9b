"""What happens to a request after the model ran: a token is sampled, the request may finish.

Shared by both schedulers; each decides when `num_computed_tokens` advances (v0 after the
step, in `_process_model_outputs`; the V1 engine at schedule time, `_update_after_schedule`).
"""

from __future__ import annotations

from sim.scheduler.request import Request, RequestState


def sample_token(request: Request, now_s: float) -> None:
    """Append one generated token and stamp first-token / last-token times."""
    request.seq.append_tokens(1)
    if request.first_token_s is None:
        request.first_token_s = now_s
    request.last_token_s = now_s


def stop_reason(request: Request, max_model_len: int, cap_at_model_len: str) -> str | None:
    """Why the request stops after its latest token, or None.

    `cap_at_model_len` is ">" for v0 (`seq.get_len() > max_model_len`, stop_checker.py @fc93e56)
    and ">=" for the V1 engine (`num_tokens >= max_model_len`, sched/utils.py @4ac7713).
    Example: max_tokens=3 -> stops with "length" once 3 tokens were generated.
    """
    if request.seq.output_len >= request.max_tokens:
        return "length: generated max_tokens"
    n = request.seq.num_tokens
    if (cap_at_model_len == ">" and n > max_model_len) or (
        cap_at_model_len == ">=" and n >= max_model_len
    ):
        return "length: reached max_model_len"
    return None


def finish(request: Request, reason: str, now_s: float) -> None:
    request.finish(RequestState.FINISHED, reason, now_s)
