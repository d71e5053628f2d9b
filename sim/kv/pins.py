"""The vLLM code each design models, and how a scenario names it (`scheduler.vllm_version`).

One type, `VllmPin`, names every code base a design can be pinned to; each behaviour that
differs between pins is a property of it (`sim.kv.pin_behaviours`, with the tables of what
each release changed), read by the model that has the behaviour (nothing compares a version
string). `resolve_pin(design, name)` turns a scenario's `scheduler.vllm_version` into a pin;
`manager_pin(design, name)` does the same for a `KVCacheConfig.vllm_pin`, where None keeps the
behaviour a manager always had.

==========  ==========================  ================  ===================================
design      pins (scenario default *)   unpinned manager  source
==========  ==========================  ================  ===================================
v0-v1       0.5.4 *                     0.5.4             the 0.5.4 wheel (release 4db5176)
v0-v2       0.5.4 *, 0.5.4+7380         0.5.4+7380        the wheel; the wheel plus PR #7380
v0-fixed    0.5.4 *                     0.5.4             kvsim's fix over the wheel's V2
v1-engine   4ac7713, 0.11.0, 0.19.1,    4ac7713           upstream main 4ac7713; releases
            0.20.0, 0.25.1, 0.26.0,
            0.33.0 *
==========  ==========================  ================  ===================================
"""

from __future__ import annotations

from sim.kv.config import Design
from sim.kv.pin_behaviours import AdmissionCap, VllmPin

#: `VllmPin` and `AdmissionCap` are defined with the behaviours; every model imports them
#: from here, with the pins each design can be given.
__all__ = [
    "PINS_BY_DESIGN",
    "SCENARIO_DEFAULT",
    "UNPINNED_MANAGER",
    "V1_BASELINE",
    "AdmissionCap",
    "VllmPin",
    "find_pin",
    "manager_pin",
    "resolve_pin",
]

#: The pins each design can be given, in the order reports list them.
PINS_BY_DESIGN: dict[Design, tuple[VllmPin, ...]] = {
    Design.V0_V1: (VllmPin.V0_5_4,),
    Design.V0_V2: (VllmPin.V0_5_4, VllmPin.V0_5_4_PR_7380),
    Design.V0_FIXED: (VllmPin.V0_5_4,),
    Design.V1_ENGINE: (
        VllmPin.C4AC7713,
        VllmPin.V0_11_0,
        VllmPin.V0_19_1,
        VllmPin.V0_20_0,
        VllmPin.V0_25_1,
        VllmPin.V0_26_0,
        VllmPin.V0_33_0,
    ),
}

#: What a scenario that names no version gets: for v0 the release the real-code mode runs (so
#: model and real code agree when nothing is named), for the V1 engine the latest release.
SCENARIO_DEFAULT: dict[Design, VllmPin] = {
    Design.V0_V1: VllmPin.V0_5_4,
    Design.V0_V2: VllmPin.V0_5_4,
    Design.V0_FIXED: VllmPin.V0_5_4,
    Design.V1_ENGINE: VllmPin.V0_33_0,
}

#: What the V1 manager built without a pin follows (the commit kvsim's V1 model was written from).
V1_BASELINE = VllmPin.C4AC7713

#: What a manager built from a `KVCacheConfig` without `vllm_pin` follows: the behaviour it
#: always had, so tests and the fuzzer that name no pin are unchanged (v0-v2: with #7380).
UNPINNED_MANAGER: dict[Design, VllmPin] = {
    Design.V0_V1: VllmPin.V0_5_4,
    Design.V0_V2: VllmPin.V0_5_4_PR_7380,
    Design.V0_FIXED: VllmPin.V0_5_4,
    Design.V1_ENGINE: V1_BASELINE,
}


def _named(design: Design, name: str) -> VllmPin:
    """The pin of `design` called `name`, or the one-line error naming the design's pins."""
    allowed = PINS_BY_DESIGN[design]
    for pin in allowed:
        if pin.value == name:
            return pin
    where = "the V1 engine" if design is Design.V1_ENGINE else design.value
    names = ", ".join(pin.value for pin in allowed)
    raise ValueError(f"unknown vLLM version {name!r} for {where}; pinned: {names}")


def resolve_pin(design: Design | str, name: str | None) -> VllmPin:
    """The pin a scenario's `scheduler.vllm_version` names for `design`; None gives the
    design's `SCENARIO_DEFAULT`.

    Example: ``resolve_pin("v0-v2", "0.5.4+7380")`` -> `V0_5_4_PR_7380`;
    ``resolve_pin("v1-engine", None)`` -> `V0_33_0`; ``resolve_pin("v0-v1", "0.5.4+7380")``
    raises ValueError ("unknown vLLM version '0.5.4+7380' for v0-v1; pinned: 0.5.4").
    """
    design = Design(design)
    return SCENARIO_DEFAULT[design] if name is None else _named(design, name)


def manager_pin(design: Design | str, name: str | None) -> VllmPin:
    """The pin a manager of `design` follows for `KVCacheConfig.vllm_pin`; None gives the
    design's `UNPINNED_MANAGER` (``manager_pin("v1-engine", None)`` -> 4ac7713, not 0.33.0)."""
    design = Design(design)
    return UNPINNED_MANAGER[design] if name is None else _named(design, name)


def find_pin(name: str) -> VllmPin | None:
    """The pin called `name` whatever the design, or None (a real install's version string
    such as '0.6.5.dev' names no pin)."""
    return next((pin for pin in VllmPin if pin.value == name), None)
