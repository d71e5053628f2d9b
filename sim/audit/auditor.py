"""The auditor: a wrapper between any caller and any block manager that checks every call.

It never changes what the manager decides. It observes each call, compares it with what the
preceding admission query promised, and checks pool invariants:

* conservation: free + held == total (O(1), after every call);
* admission consistency: an OK from `can_allocate` is followed by an `allocate` that succeeds
  (else `admission_undercount`) and takes no more blocks than were counted (else
  `admission_overtake`: the same undercount, survived because the pool had room);
* leaks: blocks taken by a failed allocation that no table owns;
* the sliding-window footprint bound of the design (at the cheap level, after calls that took
  blocks), and the watermark;
* refcounts (full level only, O(pool) per call): every table entry is held, and the held count
  agrees with the refcount map.

Worked example (the 4-vs-3 case, v0 BlockSpaceManagerV2, bs=16, W=24 so M=3, G=10)::

    can_allocate(A, 112 tokens) counts min(7, 3) = 3 -> OK
    allocate(A) takes 7 blocks -> F=3              => Violation(admission_overtake, 3 vs 7)
    can_allocate(B, 64 tokens)  counts min(4, 3) = 3 <= 3 -> OK
    allocate(B) needs 4, pops 3, raises NoFreeBlocksError     -> F=0
    => Violation(admission_undercount, counted=3, needed=4, free=3)
       Violation(leaked_blocks, 3 blocks; returned to the pool under the record policy)
"""

from __future__ import annotations

from typing import Any

from sim.audit.base import AuditLevel, AuditorBase
from sim.audit.v0 import AuditedV0Manager
from sim.audit.v1 import AuditedV1Manager

__all__ = ["AuditLevel", "AuditedV0Manager", "AuditedV1Manager", "AuditorBase", "audited"]


def audited(manager: Any, **kwargs: Any) -> AuditedV0Manager | AuditedV1Manager:
    """Wrap `manager` in the auditor for its API."""
    if hasattr(manager, "allocate_slots"):
        return AuditedV1Manager(manager, **kwargs)
    return AuditedV0Manager(manager, **kwargs)
