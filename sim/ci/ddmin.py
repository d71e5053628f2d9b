"""The two generic searches `kvsim shrink` runs: ddmin over a list, binary search over an int.

Neither knows about scenarios: each takes a predicate `test` that must hold on the starting
value and returns a smaller value on which it still holds (see `sim.ci.shrink` for the phases
that use them).
"""

from __future__ import annotations

import math
from collections.abc import Callable


def ddmin(items: list, test: Callable[[list], bool]) -> list:
    """Zeller's ddmin: a 1-minimal sublist of `items` (order kept) for which `test` holds.

    `test(items)` must hold. Example: with test = "contains 3 and 7", [0..9] -> [3, 7].
    """
    n = 2
    while len(items) >= 2:
        size = math.ceil(len(items) / n)
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        for chunk in chunks:
            if test(chunk):
                items, n = chunk, 2
                break
        else:
            for i in range(len(chunks)):
                complement = [x for j, c in enumerate(chunks) if j != i for x in c]
                if test(complement):
                    items, n = complement, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(len(items), 2 * n)
    return items


def minimize_int(current: int, lowest: int, test: Callable[[int], bool]) -> int:
    """The smallest value in [lowest, current] found by binary search with `test` holding.

    `test(current)` must hold; a non-monotone `test` still yields a value where it holds.
    Example: minimize_int(100, 1, lambda v: v >= 37) == 37.
    """
    if current <= lowest:
        return current
    if test(lowest):
        return lowest
    bad, good = lowest, current
    while good - bad > 1:
        mid = (bad + good) // 2
        if test(mid):
            good = mid
        else:
            bad = mid
    return good
