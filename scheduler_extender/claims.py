"""The DRA half of the watch cache's ledger: InferGrid's ResourceSlices and every
ResourceClaim, and per DRA node what allocated claims hold there, as assignments.

An allocated claim holds its devices as a pod's assignment annotation holds GPUs, so its
holdings join the node's assignments and the placement core counts both alike. They are
charged to the one pod the claim is reserved for; a claim reserved for several pods, or for
none yet (allocated, its pod not bound), is charged to itself (``claim:<uid>``): it still
holds its devices, and no one pod's eviction frees them, so it is never a victim.

Not thread-safe: the ``ClusterCache`` calls it under its lock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

from infergrid.assignment_annotation import ContainerAssignment, PodAssignment
from infergrid.dra_ledger import ClaimRecord, holdings
from infergrid.dra_slices import DraDevice, SliceRecord

log = logging.getLogger(__name__)

CLAIM_HOLDER: Final = "claim:"
"""The prefix of a holder that is a claim itself, not a pod."""
ALLOCATED_AT: Final = datetime(1970, 1, 1, tzinfo=UTC)
"""When a claim's holding counts as made: before any annotation's, so the recorded
allocation, which the driver honours, wins a clash on the node."""


def holder_of(claim: ClaimRecord) -> str:
    """Who a claim's holdings are charged to: its one pod, else the claim itself."""
    pods = claim.reserved_for
    return pods[0] if len(pods) == 1 else f"{CLAIM_HOLDER}{claim.uid}"


class ClaimLedger:
    """Slices by name, claims by uid, and per node the holdings of the claims in its pool."""

    def __init__(self) -> None:
        self._slices: dict[str, SliceRecord] = {}
        self._pool_slices: dict[str, set[str]] = {}
        self._claims: dict[str, ClaimRecord] = {}
        self._names: dict[tuple[str, str], str] = {}
        self._pool_claims: dict[str, set[str]] = {}
        self._held: dict[str, dict[str, PodAssignment]] = {}
        """Per node, per holder, what the claims allocated in its pool hold there."""
        self._charged: dict[str, str] = {}
        """Per pod charged with holdings, the node they are on."""

    # Changes: each returns the pools (nodes) whose slices or claims moved.

    def put_slice(self, name: str, record: SliceRecord | None) -> set[str]:
        old = self._slices.pop(name, None)
        if old is not None:
            _drop(self._pool_slices, old.pool, name)
        if record is not None:
            self._slices[name] = record
            self._pool_slices.setdefault(record.pool, set()).add(name)
        return {r.pool for r in (old, record) if r is not None and r.pool}

    def put_claim(self, uid: str, record: ClaimRecord | None) -> set[str]:
        old = self._claims.pop(uid, None)
        if old is not None:
            self._names.pop((old.namespace, old.name), None)
            for pool in old.pools:
                _drop(self._pool_claims, pool, uid)
        if record is not None:
            self._claims[uid] = record
            self._names[(record.namespace, record.name)] = uid
            for pool in record.pools:
                self._pool_claims.setdefault(pool, set()).add(uid)
        if old == record:
            return set()
        return set().union(*(r.pools for r in (old, record) if r is not None))

    def replace_slices(self, records: list[SliceRecord]) -> set[str]:
        touched = set().union(*(self.put_slice(n, None) for n in list(self._slices)))
        return touched.union(*(self.put_slice(r.name, r) for r in records))

    def replace_claims(self, records: list[ClaimRecord]) -> set[str]:
        before = dict(self._claims)
        for uid in list(self._claims):
            self.put_claim(uid, None)
        for record in records:
            self.put_claim(record.uid, record)
        uids = before.keys() | self._claims.keys()
        moved = (
            c
            for u in uids
            if before.get(u) != self._claims.get(u)
            for c in (before.get(u), self._claims.get(u))
            if c is not None
        )
        return set().union(*(c.pools for c in moved))

    def recharge(self, node: str, devices: Mapping[str, DraDevice]) -> tuple[bool, set[str]]:
        """Works out again what the claims in ``node``'s pool hold on its ``devices``:
        whether that changed, and the pods charged there now."""
        held: dict[str, list[ContainerAssignment]] = {}
        for uid in sorted(self._pool_claims.get(node, ())):
            claim = self._claims[uid]
            mine = tuple(h for h in claim.held if h.pool == node)
            found = holdings(_only(claim, mine), devices)
            if found:
                held.setdefault(holder_of(claim), []).extend(found)
        now = {k: PodAssignment(node, ALLOCATED_AT, tuple(v)) for k, v in held.items()}
        before = self._held.get(node, {})
        for holder in before.keys() - now.keys():
            self._charged.pop(holder, None)
        for holder in now:
            if not holder.startswith(CLAIM_HOLDER):
                self._charged[holder] = node
        if now:
            self._held[node] = now
        else:
            self._held.pop(node, None)
        return before != now, {h for h in now if not h.startswith(CLAIM_HOLDER)}

    # Queries.

    def slices_of(self, pool: str) -> list[SliceRecord]:
        return [self._slices[n] for n in sorted(self._pool_slices.get(pool, ()))]

    def claim(self, namespace: str, name: str) -> ClaimRecord | None:
        uid = self._names.get((namespace, name))
        return None if uid is None else self._claims[uid]

    def held_on(self, node: str) -> dict[str, PodAssignment]:
        return self._held.get(node, {})

    def charged(self, uid: str) -> bool:
        """Whether allocated claims hold devices for the pod."""
        return uid in self._charged

    def has_holdings(self, node: str) -> bool:
        return node in self._held

    def size(self) -> dict[str, int]:
        return {"resourceslices": len(self._slices), "resourceclaims": len(self._claims)}


def _only(claim: ClaimRecord, held: tuple) -> ClaimRecord:
    """The claim with only the results in one pool (a claim may span several)."""
    if held == claim.held:
        return claim
    return ClaimRecord(
        claim.uid,
        claim.namespace,
        claim.name,
        claim.requests,
        claim.problem,
        claim.allocated,
        held,
        claim.reserved_for,
    )


def _drop(index: dict[str, set[str]], key: str, item: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(item)
        if not members:
            del index[key]
