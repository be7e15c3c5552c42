"""The per-tenant cap on services woken from zero, checked over every short history."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from gateway.wakes import Wakes

TENANTS = ("team-a", "team-b")
SERVICES = (("ml", "chat"), ("ml", "embed"), ("other", "chat"))
STEPS = [(verb, t, s) for verb in ("hold", "end") for t in TENANTS for s in SERVICES]


def replay(history, cap: int) -> tuple[Wakes, Counter]:
    """Each `hold` goes through can_wake (and wakes when allowed), each `end` releases one
    held request of that tenant and service, if it has one; with the requests held."""
    wakes, held = Wakes(), Counter()
    for verb, tenant, service in history:
        if verb == "hold":
            if wakes.can_wake(tenant, service, cap):
                wakes.wake(tenant, service)
                held[tenant, service] += 1
        elif held[tenant, service]:
            wakes.release(tenant, service)
            held[tenant, service] -= 1
    return wakes, +held


@pytest.mark.parametrize("cap", [0, 1, 2])
def test_every_history_of_four_steps_keeps_each_tenant_within_its_cap(cap):
    for history in itertools.product(STEPS, repeat=4):
        wakes, held = replay(history, cap)
        for tenant in TENANTS:
            mine = {s for (t, s) in held if t == tenant}
            assert wakes.waking(tenant) == len(mine) <= cap, history
            for service in SERVICES:
                # A service it already wakes takes more of its requests; another takes one
                # only below the cap; another tenant's count plays no part.
                assert wakes.can_wake(tenant, service, cap) == (
                    service in mine or len(mine) < cap
                ), history


def test_a_slot_is_free_again_once_the_last_held_request_for_it_ends():
    chat, embed = SERVICES[:2]
    wakes = Wakes()
    for _ in range(2):
        assert wakes.can_wake("team-a", chat, 1)
        wakes.wake("team-a", chat)
    assert not wakes.can_wake("team-a", embed, 1)
    assert wakes.can_wake("team-b", embed, 1)
    wakes.release("team-a", chat)
    assert not wakes.can_wake("team-a", embed, 1)
    wakes.release("team-a", chat)
    assert wakes.can_wake("team-a", embed, 1) and wakes.held == {}
