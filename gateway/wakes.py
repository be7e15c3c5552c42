"""Scale from zero, capped per tenant: how many services one tenant's requests wake at once.

A request held for a service at zero replicas wakes it: the gateway asks for a replica and
the operator's autoscaler counts the held request as demand, so a pod starts and takes its
share of a GPU. Unbounded, one tenant (or every anonymous caller) could wake every service
at zero of every namespace it may call by sending one request to each. So each tenant may
wake at most `max_scale_from_zero` distinct services at a time; its further requests to
the ones it already wakes wait with the others, and one to another service is refused.

A service counts as woken by a tenant from its first held request until its last one ends
(served, timed out or refused), ready pod or not. Pure: check with `can_wake`, then
`wake`, and `release` when the held request ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.catalog import Key


@dataclass(slots=True)
class Wakes:
    held: dict[str, dict[Key, int]] = field(default_factory=dict)  # tenant -> service -> held

    def waking(self, tenant: str) -> int:
        """Services the tenant's held requests wake now."""
        return len(self.held.get(tenant, {}))

    def can_wake(self, tenant: str, service: Key, cap: int) -> bool:
        mine = self.held.get(tenant, {})
        return service in mine or len(mine) < cap

    def wake(self, tenant: str, service: Key) -> None:
        mine = self.held.setdefault(tenant, {})
        mine[service] = mine.get(service, 0) + 1

    def release(self, tenant: str, service: Key) -> None:
        mine = self.held[tenant]
        assert mine.get(service, 0) > 0, (tenant, service)  # one release per wake
        mine[service] -= 1
        if not mine[service]:
            del mine[service]
        if not mine:
            del self.held[tenant]
