"""Bytes of request bodies each tenant has in the gateway at once, bounded.

A body is held from its first byte until its request ends (it is parsed, then forwarded
from memory, and retried from memory on another pod). One request's body is bounded by
`maxBodyBytes`; many at once, each under it, would still hold any amount, so every tenant's
bodies together are bounded too (`tenantBodyBytes`), counted as the bytes arrive: a tenant
that sends many large or slow bodies is refused (429) once it holds its share, and other
tenants' bodies are not held up by it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(slots=True)
class BodyBudget:
    per_tenant: int
    held: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))

    def lease(self, tenant: str) -> BodyLease:
        return BodyLease(self, tenant)


@dataclass(slots=True)
class BodyLease:
    """One request's share of its tenant's budget, given back whole when the request ends
    (`with lease:`)."""

    budget: BodyBudget
    tenant: str
    taken: int = 0
    refused: bool = False  # a take was refused

    def take(self, size: int) -> bool:
        """False, taking nothing, when the tenant would hold more than its budget."""
        held = self.budget.held
        if held[self.tenant] + size > self.budget.per_tenant:
            self.refused = True
            return False
        held[self.tenant] += size
        self.taken += size
        return True

    def __enter__(self) -> BodyLease:
        return self

    def __exit__(self, *_: object) -> None:
        held = self.budget.held
        held[self.tenant] -= self.taken
        if held[self.tenant] <= 0:
            del held[self.tenant]
        self.taken = 0
