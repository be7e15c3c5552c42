"""Which PriorityClasses an InferenceService may give its engine pods.

A priority class decides who is preempted when the cluster is full: a tenant who could
name any class could evict other tenants' pods, or, with system-node-critical, the
cluster's own add-ons. So the operator's allowedPriorityClasses setting lists what
services may name, and system-* classes are refused even where listed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from infergrid.constants import SYSTEM_CLASS_PREFIX
from infergrid.errors import ContractError

SPEC_FIELD: Final = "spec.scheduling.priorityClassName"


def check_priority_class(name: str, allowed: Collection[str]) -> None:
    """A ContractError naming the spec field unless `name` is empty (none) or allowed."""
    if not name:
        return
    if name.startswith(SYSTEM_CLASS_PREFIX):
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
