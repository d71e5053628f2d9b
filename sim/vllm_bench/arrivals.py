"""When `vllm bench serve` sends each request: 0.33.0 `vllm/benchmarks/serve.py` `get_request`
(L431-545), without ramp-up or self-timed traces.

* `--request-rate inf`: every request at 0;
* `--burstiness inf`: one every `1 / rate` seconds;
* else gaps drawn one by one from numpy's global generator, seeded with `--seed` in
  `main_async` (L2060-2061): `numpy.random.gamma(shape=burstiness, scale=1 / (rate *
  burstiness))` (burstiness 1: exponential, a Poisson process). The cumulative times are then
  rescaled so the last request is sent at exactly `num_prompts / rate` (L513-528). A fresh
  `numpy.random.RandomState(seed)` draws the same numbers as the reseeded global one, as long as
  nothing else draws from it first: true for `random` (its own `default_rng`) and `sharegpt`
  (Python's `random`); `prefix_repetition` draws its prompt tokens from the global generator
  first (a count that depends on the tokenizer's vocabulary), so there the gaps have the
  release's distribution but not its exact stream.

Example::

    >>> [round(t, 3) for t in send_times(3, request_rate=2.0, burstiness=1.0, seed=0)]
    [0.401, 1.035, 1.5]
"""

from __future__ import annotations

import math

import numpy as np

from sim.errors import InputError


def send_times(
    num_requests: int, *, request_rate: float, burstiness: float, seed: int
) -> list[float]:
    """Each request's send time in seconds from the start (see the module docstring)."""
    if not burstiness > 0:
        raise InputError(f"--burstiness {burstiness}: must be positive")
    if not request_rate > 0:
        raise InputError(f"--request-rate {request_rate}: must be positive (or inf)")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    if math.isinf(burstiness):
        gaps = [1.0 / request_rate] * num_requests
    else:
        state = np.random.RandomState(seed)
        theta = 1.0 / (request_rate * burstiness)
        gaps = [float(state.gamma(shape=burstiness, scale=theta)) for _ in range(num_requests)]
    times = np.cumsum(gaps).tolist()
    if times[-1] != 0:
        factor = (num_requests / request_rate) / times[-1]
        times = [t * factor for t in times]
    return times
