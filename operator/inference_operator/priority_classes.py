"""Which PriorityClasses an InferenceService may give its engine pods.

A priority class decides who is preempted when the cluster is full: a tenant who could
name any class could evict other tenants' pods, or, with system-node-critical, the
cluster's own add-ons. So the operator's allowedPriorityClasses setting lists what
services may name, and system-* classes are refused even where listed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from infergrid.errors import ContractError

SYSTEM_PREFIX: Final = "system-"
SPEC_FIELD: Final = "spec.scheduling.priorityClassName"


def check_priority_class(name: str, allowed: Collection[str]) -> None:
    """A ContractError naming the spec field unless `name` is empty (none) or allowed."""
    if not name:
        return
    if name.startswith(SYSTEM_PREFIX):
        raise ContractError(
            SPEC_FIELD, f"{name!r}: system-* classes are reserved for the cluster's own parts"
        )
    if name not in allowed:
        listed = ", ".join(sorted(allowed)) or "none"
        raise ContractError(
            SPEC_FIELD,
            f"{name!r} is not in the operator's allowedPriorityClasses ({listed}); "
            "ask the cluster admin to allow it, or leave it empty",
        )


def refuse_system_classes(classes: tuple[str, ...], key: str) -> tuple[str, ...]:
    """The setting as given, refused at start if it lists a class no service may use."""
    system = [c for c in classes if c.startswith(SYSTEM_PREFIX)]
    if system:
        raise ContractError(key, f"{system[0]!r}: system-* classes are never given to engines")
    return classes
