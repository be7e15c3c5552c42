"""Lease election: the pure decision table, then the elector against an in-memory Lease API."""

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import urllib3
from kubernetes.client.rest import ApiException

from scheduler_extender import leader
from scheduler_extender.leader import (
    Action,
    LeaseElector,
    LeaseRecord,
    claimed,
    decide,
    lease_record,
    lease_spec,
    released,
)

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
DURATION = 15
ME, OTHER = "me", "other"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def record(holder: str, renewed: float | None = 0.0, transitions: int = 3) -> LeaseRecord:
    renewed_at = None if renewed is None else at(renewed)
    return LeaseRecord(holder, DURATION, at(-100), renewed_at, transitions)


# (lease, now, observed_at, action): now and observed_at in seconds after T0;
# the other holder renewed at T0 unless the case says otherwise.
DECISIONS = [
    ("absent", None, 0, 0, Action.TAKE),
    ("released", record(""), 0, 0, Action.TAKE),
    ("ours, fresh", record(ME), 1, 0, Action.RENEW),
    ("ours, expired", record(ME), 100, 0, Action.RENEW),
    ("other, fresh", record(OTHER), 1, 0, Action.WAIT),
    ("other, one tick before expiry", record(OTHER), 14.999, 0, Action.WAIT),
    ("other, expired on both clocks", record(OTHER), 15, 0, Action.TAKE),
    ("other, long expired", record(OTHER), 1000, 0, Action.TAKE),
    ("other, renewTime passed but only just observed", record(OTHER), 20, 10, Action.WAIT),
    ("other, observed long ago but renewTime ahead of us", record(OTHER, 10), 20, 0, Action.WAIT),
    ("other, both passed after a late observation", record(OTHER), 25, 10, Action.TAKE),
    ("other, no renewTime, just observed", record(OTHER, None), 5, 0, Action.WAIT),
    ("other, no renewTime, observed long enough", record(OTHER, None), 15, 0, Action.TAKE),
]


@pytest.mark.parametrize(
    "lease, now, observed, action", [d[1:] for d in DECISIONS], ids=[d[0] for d in DECISIONS]
)
def test_decision_table(lease, now, observed, action):
    assert decide(lease, ME, at(now), at(observed)) is action


def test_taking_counts_a_transition_and_renewing_does_not():
    taken = claimed(record(OTHER), ME, at(20), DURATION)
    assert taken == LeaseRecord(ME, DURATION, at(20), at(20), 4)
    renewed = claimed(taken, ME, at(25), DURATION)
    assert renewed == LeaseRecord(ME, DURATION, at(20), at(25), 4)


def test_creating_starts_at_zero_transitions():
    assert claimed(None, ME, at(0), DURATION) == LeaseRecord(ME, DURATION, at(0), at(0), 0)


def test_taking_a_released_lease_counts_a_transition():
    free = released(record(OTHER), at(5))
    assert free.holder == "" and free.transitions == 3
    assert claimed(free, ME, at(5), DURATION).transitions == 4


def test_lease_json_round_trip_keeps_microseconds():
    original = LeaseRecord(ME, DURATION, at(0.25), at(1.000001), 2)
    assert lease_record({"spec": lease_spec(original)}, 99) == original


def test_missing_or_bad_fields_read_as_defaults():
    lease = {"spec": {"renewTime": "yesterday", "acquireTime": "2025-01-01T00:00:00"}}
    assert lease_record(lease, 7) == LeaseRecord("", 7, None, None, 0)


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class FakeLeases:
    """The three Lease calls of CoordinationV1Api, on one in-memory Lease with resourceVersions."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down = False
        self.after_read: list = []

    def read_namespaced_lease(self, name, namespace, **_):
        self._check_up()
        if self.lease is None:
            raise ApiException(status=404, reason="NotFound")
        response = SimpleNamespace(data=json.dumps(self.lease).encode())
        while self.after_read:
            self.after_read.pop()()
        return response

    def create_namespaced_lease(self, namespace, body, **_):
        self._check_up()
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self._store(body)

    def replace_namespaced_lease(self, name, namespace, body, **_):
        self._check_up()
        if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self._store(body)

    def holder(self) -> str:
        return self.lease["spec"]["holderIdentity"]

    def _store(self, body) -> None:
        self.version += 1
        self.lease = {"metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        self.lease["spec"] = json.loads(json.dumps(body["spec"]))

    def _check_up(self) -> None:
        if self.down:
            raise urllib3.exceptions.ProtocolError("connection refused")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def leases(monkeypatch) -> FakeLeases:
    fake = FakeLeases()
    monkeypatch.setattr(leader.client, "CoordinationV1Api", lambda api: fake)
    return fake


def elector(identity: str, clock: FakeClock) -> LeaseElector:
    return LeaseElector(None, "ns", "extender", identity, DURATION, 5, clock)


def test_first_candidate_creates_the_lease_and_the_second_waits(leases, clock):
    a, b = elector("a", clock), elector("b", clock)
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew() and not b.is_leader()
    clock.advance(5)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert leases.holder() == "a" and leases.lease["spec"]["leaseTransitions"] == 0


def test_a_leader_that_cannot_renew_steps_down_after_one_duration(leases, clock):
    a = elector("a", clock)
    a.try_acquire_or_renew()
    leases.down = True
    clock.advance(DURATION - 1)
    assert a.try_acquire_or_renew() and a.is_leader()
    clock.advance(1)
    assert not a.is_leader() and not a.try_acquire_or_renew()


def test_a_silent_leader_is_replaced_a_full_duration_after_it_was_last_seen(leases, clock):
    a, b = elector("a", clock), elector("b", clock)
    a.try_acquire_or_renew()
    clock.advance(100)
    assert not b.try_acquire_or_renew()  # first sight of a stale lease: wait it out
    clock.advance(DURATION - 1)
    assert not b.try_acquire_or_renew()
    clock.advance(1)
    assert b.try_acquire_or_renew()
    assert leases.holder() == "b" and leases.lease["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew() and not a.is_leader()


def test_release_hands_over_at_once_and_for_good(leases, clock):
    a, b = elector("a", clock), elector("b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader() and leases.holder() == ""
    assert b.try_acquire_or_renew()
    assert not a.try_acquire_or_renew()
    assert leases.holder() == "b" and leases.lease["spec"]["leaseTransitions"] == 1


def test_release_leaves_a_lease_someone_else_holds(leases, clock):
    a, b = elector("a", clock), elector("b", clock)
    a.try_acquire_or_renew()
    b.release()
    assert leases.holder() == "a" and a.try_acquire_or_renew()


def test_losing_the_write_race_means_not_leading(leases, clock):
    a, b = elector("a", clock), elector("b", clock)
    a.try_acquire_or_renew()
    a.release()
    leases.after_read.append(
        lambda: leases._store({**leases.lease, "spec": {"holderIdentity": "c"}})
    )
    assert not b.try_acquire_or_renew() and not b.is_leader()
    assert leases.holder() == "c"


def test_an_empty_identity_is_refused(leases, clock):
    with pytest.raises(ValueError, match="identity"):
        elector("", clock)
