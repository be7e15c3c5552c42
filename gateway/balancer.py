"""Which pod of a track takes a request: least work first, the same conversation to the same
pod while that pod is not busy.

A pod's work is what the gateway has in flight to it plus the queue depth its engine last
reported (other gateways' and direct clients' requests wait there too). A chat whose prefix
(a hash of the first characters of the conversation) was served by a pod goes back to it,
where the engine's prefix cache holds that prefix's KV blocks, unless that pod has more than
`slack` requests of work above the least-loaded one: then it goes to the least loaded and the
prefix moves there. Everything here is pure over plain data; the gateway keeps the state.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Final

from gateway.catalog import Backend, Key

LEAST_LOADED: Final = "least-loaded"
ROUND_ROBIN: Final = "round-robin"
POLICIES: Final = (LEAST_LOADED, ROUND_ROBIN)
AFFINITY_ENTRIES: Final = 65536  # prefixes remembered, least recently used dropped first

Work = Callable[[Key], float]


def prefix_key(text: str, chars: int) -> str | None:
    """A short digest of the first `chars` characters, or None for an empty text."""
    head = text[:chars]
    if not head:
        return None
    return hashlib.blake2b(head.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


class PrefixAffinity:
    """Prefix -> the pod that last served it, bounded (least recently used first out)."""

    def __init__(self, capacity: int = AFFINITY_ENTRIES) -> None:
        self.capacity = capacity
        self._pods: OrderedDict[str, Key] = OrderedDict()

    def get(self, prefix: str) -> Key | None:
        pod = self._pods.get(prefix)
        if pod is not None:
            self._pods.move_to_end(prefix)
        return pod

    def put(self, prefix: str, pod: Key) -> None:
        self._pods[prefix] = pod
        self._pods.move_to_end(prefix)
        while len(self._pods) > self.capacity:
            self._pods.popitem(last=False)

    def __len__(self) -> int:
        return len(self._pods)


class Balancer:
    """Picks a pod among candidates, by policy. The rotation breaks ties among equally loaded
    pods, so idle pods share the first requests instead of the first pod taking them all."""

    def __init__(self, policy: str = LEAST_LOADED, slack: float = 2.0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"routing policy {policy!r} is not one of {', '.join(POLICIES)}")
        self.policy = policy
        self.slack = slack
        self.affinity = PrefixAffinity()
        self._turn = itertools.count()

    def pick(self, candidates: Sequence[Backend], work: Work, prefix: str | None) -> Backend:
        if not candidates:
            raise ValueError("no pod to pick from")
        start = next(self._turn) % len(candidates)
        rotated = [*candidates[start:], *candidates[:start]]
        if self.policy == ROUND_ROBIN:
            return rotated[0]
        least = min(rotated, key=lambda b: work(b.key))
        if prefix is None:
            return least
        remembered = self.affinity.get(prefix)
        bound = work(least.key) + self.slack
        kept = next((b for b in rotated if b.key == remembered and work(b.key) <= bound), None)
        chosen = kept or least
        self.affinity.put(prefix, chosen.key)
        return chosen
