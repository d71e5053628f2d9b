"""The audit layer: invariant checks around every block-manager call, and Violation records."""

from sim.audit.auditor import AuditedV0Manager, AuditedV1Manager, AuditLevel, audited
from sim.audit.violations import AuditError, Violation, ViolationKind, ViolationPolicy

__all__ = [
    "AuditError",
    "AuditLevel",
    "AuditedV0Manager",
    "AuditedV1Manager",
    "Violation",
    "ViolationKind",
    "ViolationPolicy",
    "audited",
]
