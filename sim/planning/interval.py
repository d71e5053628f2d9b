"""The spread of a capacity over replicates: a 95 % Student-t confidence interval."""

from __future__ import annotations

import math
import statistics

#: Two-sided 95 % Student-t quantiles by degrees of freedom (beyond 30: the normal 1.96).
_T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def confidence_interval(
    values: list[float], level_t: dict[int, float] = _T95
) -> tuple[float, float, float]:
    """(mean, low, high) of a 95 % Student-t interval; one value gives (v, v, v).

    Example: [100, 110, 120] -> mean 110, sd 10, t(2) = 4.303 -> 110 +- 4.303 * 10 / sqrt(3)
    = (110, 85.16, 134.84).
    """
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    df = len(values) - 1
    t = next((level_t[k] for k in sorted(level_t) if k >= df), 1.96)
    half = t * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half
