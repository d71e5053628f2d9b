"""Strict field types for everything a user writes (scenario sections, geometry dicts, links).

pydantic's default (lax) mode turns YAML `true` into the integer 1, `16.0` and `"16"` into
16, and lets `.inf` / `.nan` through a float field. A scenario is typed by hand, so each of
those is a typo to report, not a value to guess:

* `Int`: a real integer (not a bool, a float or a string) within 64 bits: the tables store
  int64, and numpy / Arrow overflow beyond it.
* `Float`: an int or a float (not a bool or a string), finite.
* `Bool`: `true` / `false` only (not 1, "yes").
* `Seconds`: a finite, non-negative `Float` at most `MAX_TIME_S`.

`--set KEY=VALUE` values are parsed as YAML scalars first (`sim.scenario.overrides`), so
`--set cache.block_size=32` is the integer 32 and passes `Int`.

Example::

    >>> from pydantic import TypeAdapter
    >>> TypeAdapter(Int).validate_python(16)
    16
    >>> TypeAdapter(Int).validate_python(True)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    pydantic_core.ValidationError: Input should be a valid integer
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, Strict

INT64_MAX = 2**63 - 1

#: The latest time (s) a simulation may reach: float64 then still spaces its values at most
#: 2**-20 s (< 1 us) apart, so a millisecond latency is resolved to better than 0.1 %.
#: Worked example: float64 has a 52-bit fraction, so for t in [2**k, 2**(k+1)) adjacent values
#: are 2**(k-52) s apart; k = 32 (t < 2**33 s, about 272 years) gives 2**-20 s = 0.95 us.
#: At t = 1e15 s (k = 49) they are 2**-3 = 0.125 s apart: a 10 ms TTFT rounds to 0.
MAX_TIME_S = float(2**33)


def _int64(value: int) -> int:
    # A validator, not Field(ge=, le=): a field's own `Field(ge=1)` would be replaced by it.
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ValueError(f"{value} does not fit in 64 bits (at most {INT64_MAX})")
    return value


Int = Annotated[int, Strict(), AfterValidator(_int64)]
Float = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Bool = Annotated[bool, Strict()]
Seconds = Annotated[float, Strict(), Field(ge=0, le=MAX_TIME_S, allow_inf_nan=False)]


def time_error(what: str, seconds: float) -> str | None:
    """Why `seconds` (a simulated time) is too large to resolve a millisecond, else None.

    >>> print(time_error("arrival_s", 1e300))
    arrival_s: 1e+300 s is beyond 8589934592 s (float64 no longer resolves a millisecond there)
    """
    if seconds <= MAX_TIME_S:
        return None
    return (
        f"{what}: {seconds:.6g} s is beyond {MAX_TIME_S:.0f} s "
        "(float64 no longer resolves a millisecond there)"
    )


__all__ = ["INT64_MAX", "MAX_TIME_S", "Bool", "Float", "Int", "Seconds", "time_error"]
