"""Per-tenant admission: token buckets of requests and of model tokens, and concurrency.

A request is admitted when its tenant has a request token, a free concurrency slot and, in
its bucket of model tokens, the request's whole reservation: the most tokens it can cost
(`request_body.reservation`: its prompt's bound plus every answer's `max_tokens`, or the
model's context). Otherwise the answer says how long to wait (`Retry-After`), or, for a
reservation larger than the whole bucket, that it can never be admitted. The reservation is
settled when the engine reports the request's real usage, so a tenant cannot outrun its
budget by asking for many long answers at once, and is not charged for tokens never
generated; an answer that reports nothing keeps the reservation. Pure over a clock the
caller passes in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gateway.tenants import TenantLimits

TOKEN_REFILL_S = 60.0


@dataclass(slots=True)
class TokenBucket:
    rate: float  # tokens per second
    capacity: float
    level: float = math.nan
    updated: float = 0.0

    def refill(self, now: float) -> None:
        if math.isnan(self.level):
            self.level, self.updated = self.capacity, now
        elapsed = max(0.0, now - self.updated)
        if math.isfinite(self.rate):
            self.level = min(self.capacity, self.level + elapsed * self.rate)
        else:
            self.level = self.capacity
        self.updated = now

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until `amount` is there: 0 when it is there now."""
        self.refill(now)
        missing = amount - self.level
        if missing <= 0:
            return 0.0
        return math.inf if self.rate <= 0 else missing / self.rate

    def charge(self, amount: float, now: float) -> None:
        """Takes `amount`, which may leave the level below zero: a debt paid by refills."""
        self.refill(now)
        if math.isfinite(self.level):
            self.level -= amount

    def credit(self, amount: float, now: float) -> None:
        """Gives back `amount` of a reservation, never above the capacity: what a tenant did
        not spend is no credit for later."""
        self.refill(now)
        self.level = min(self.capacity, self.level + amount)


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    retry_after_s: float = 0.0
    reason: str = ""  # "requests", "tokens", "concurrency" or NEVER when refused


NEVER = "token_capacity"  # a reservation over the whole bucket: no wait admits it


@dataclass(slots=True)
class TenantState:
    limits: TenantLimits
    requests: TokenBucket
    tokens: TokenBucket
    in_flight: int = 0

    @classmethod
    def of(cls, limits: TenantLimits) -> TenantState:
        per_s = limits.tokens_per_minute / TOKEN_REFILL_S
        return cls(
            limits,
            TokenBucket(limits.requests_per_s, limits.burst),
            TokenBucket(per_s, limits.tokens_per_minute),
        )


@dataclass(slots=True)
class Admission:
    """The live state of every tenant; limits changed in the Secret apply at once, while
    the in-flight counts carry over."""

    tenants: dict[str, TenantState] = field(default_factory=dict)

    def state(self, limits: TenantLimits) -> TenantState:
        state = self.tenants.get(limits.name)
        if state is None or state.limits != limits:
            fresh = TenantState.of(limits)
            fresh.in_flight = state.in_flight if state else 0
            self.tenants[limits.name] = state = fresh
        return state

    def admit(self, limits: TenantLimits, reservation: float, now: float) -> Decision:
        state = self.state(limits)
        if reservation > state.tokens.capacity:
            return Decision(False, math.inf, NEVER)
        if limits.max_concurrent is not None and state.in_flight >= limits.max_concurrent:
            return Decision(False, 1.0, "concurrency")
        tokens_wait = state.tokens.wait_for(reservation, now)
        if tokens_wait > 0:
            return Decision(False, tokens_wait, "tokens")
        request_wait = state.requests.wait_for(1.0, now)
        if request_wait > 0:
            return Decision(False, request_wait, "requests")
        state.requests.charge(1.0, now)
        state.tokens.charge(reservation, now)
        state.in_flight += 1
        return Decision(True)

    def settle(
        self, limits: TenantLimits, reservation: float, used: float | None, now: float
    ) -> None:
        """The request ended: its slot is free, and the usage its answer reported (None:
        none) replaces the reservation held on admission. Never more than the reservation:
        it bounds what the request can cost, and an engine is its service owner's code,
        which must not run another tenant's bucket into debt by reporting more."""
        state = self.state(limits)
        state.in_flight = max(0, state.in_flight - 1)
        if used is not None and used < reservation:
            state.tokens.credit(reservation - used, now)
