"""Leader election on a ``coordination.k8s.io/v1`` Lease, the way client-go does it.

Only one extender replica may bind: two would each see free memory the other
just took. The replica holding the Lease leads. Whether a replica may take or
keep the Lease is the pure ``decide``; ``LeaseElector`` only reads and writes
the Lease around it, with the read resourceVersion, so a lost race is a 409.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)

HTTP_NOT_FOUND: Final = 404
HTTP_CONFLICT: Final = 409
_MICRO_TIME: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


class Action(StrEnum):
    """What a candidate does with the Lease this round."""

    TAKE = "take"
    RENEW = "renew"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The Lease spec fields election reads and writes; times are aware UTC."""

    holder: str
    duration_s: int
    acquired_at: datetime | None
    renewed_at: datetime | None
    transitions: int


def decide(
    record: LeaseRecord | None, identity: str, now: datetime, observed_at: datetime
) -> Action:
    """TAKE an absent, released or expired Lease; RENEW our own; WAIT while another holds it.

    Another holder's Lease has expired only when ``now`` is a full duration past
    both its renewTime and ``observed_at``, the moment this candidate first saw
    that renewal. The second bound is client-go's: it trusts only our own clock,
    so a holder whose clock runs behind ours does not lose the Lease early.
    """
    if record is None or not record.holder:
        return Action.TAKE
    if record.holder == identity:
        return Action.RENEW
    return Action.TAKE if _expired(record, now, observed_at) else Action.WAIT


def _expired(record: LeaseRecord, now: datetime, observed_at: datetime) -> bool:
    duration = timedelta(seconds=record.duration_s)
    renewal_passed = record.renewed_at is None or now >= record.renewed_at + duration
    return renewal_passed and now >= observed_at + duration


def claimed(
    record: LeaseRecord | None, identity: str, now: datetime, duration_s: int
) -> LeaseRecord:
    """The Lease after TAKE or RENEW; a change of holder counts one transition."""
    if record is not None and record.holder == identity:
        return replace(record, duration_s=duration_s, renewed_at=now)
    transitions = 0 if record is None else record.transitions + 1
    return LeaseRecord(identity, duration_s, now, now, transitions)


def released(record: LeaseRecord, now: datetime) -> LeaseRecord:
    """The Lease with no holder, so a successor takes it at once instead of waiting it out."""
    return replace(record, holder="", acquired_at=None, renewed_at=now)


def lease_record(lease: dict[str, Any], default_duration_s: int) -> LeaseRecord:
    """The election fields of a Lease's JSON; an unreadable time counts as absent."""
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or "",
        duration_s=spec.get("leaseDurationSeconds") or default_duration_s,
        acquired_at=_parse_time(spec.get("acquireTime")),
        renewed_at=_parse_time(spec.get("renewTime")),
        transitions=spec.get("leaseTransitions") or 0,
    )


def lease_spec(record: LeaseRecord) -> dict[str, Any]:
    """The Lease spec JSON of ``record``."""
    return {
        "holderIdentity": record.holder,
        "leaseDurationSeconds": record.duration_s,
        "acquireTime": _format_time(record.acquired_at),
        "renewTime": _format_time(record.renewed_at),
        "leaseTransitions": record.transitions,
    }


def _parse_time(text: Any) -> datetime | None:
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return moment.astimezone(UTC) if moment.tzinfo is not None else None


def _format_time(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).strftime(_MICRO_TIME)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class LeaseElector:
    """Takes and renews one Lease; ``is_leader`` says whether this replica may act.

    A leader that cannot renew stops leading once its last successful renewal
    is a lease duration old, even if it never hears back from the API server:
    by then another replica may have taken the Lease.
    """

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: int = 15,
        renew_period_s: float = 5.0,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        if not identity:
            raise ValueError("identity must not be empty: an empty holder means a free Lease")
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_period_s = renew_period_s
        self._clock = clock
        self._leases = client.CoordinationV1Api(api)
        self._lock = threading.Lock()
        self._renewed_at: datetime | None = None
        self._seen: tuple[str, datetime] | None = None
        self._stepped_down = False

    def is_leader(self) -> bool:
        """True while the last successful take or renewal is under a lease duration old."""
        renewed = self._renewed_at
        duration = timedelta(seconds=self.lease_duration_s)
        return renewed is not None and self._clock() - renewed < duration

    def try_acquire_or_renew(self) -> bool:
        """One round: read the Lease, decide, write; True when this replica holds it now.

        API errors are logged, not raised; leadership then lasts only as long as
        the last renewal allows.
        """
        with self._lock:
            if self._stepped_down:
                return False
            now = self._clock()
            was_leader = self.is_leader()
            try:
                won = self._round(now)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as err:
                log.warning("lease %s/%s: cannot reach the API: %s", self.namespace, self.name, err)
                return self.is_leader()
            self._renewed_at = now if won else None
            if won != was_leader:
                log.info("%s %s leadership of %s", self.identity, _verb(won), self.name)
            return won

    def run(self, stop: threading.Event) -> None:
        """Keeps trying or renewing every ``renew_period_s`` until ``stop``, then releases."""
        while not stop.is_set():
            self.try_acquire_or_renew()
            stop.wait(self.renew_period_s)
        self.release()

    def release(self) -> None:
        """Steps down for good and frees the Lease if we hold it, so a successor takes over now."""
        with self._lock:
            self._stepped_down = True
            self._renewed_at = None
            try:
                lease = self._read()
                record = None if lease is None else lease_record(lease, self.lease_duration_s)
                if record is not None and record.holder == self.identity:
                    self._replace(lease, released(record, self._clock()))
                    log.info("%s released %s", self.identity, self.name)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as err:
                log.warning("lease %s/%s: cannot release: %s", self.namespace, self.name, err)

    def _round(self, now: datetime) -> bool:
        lease = self._read()
        if lease is None:
            return self._create(claimed(None, self.identity, now, self.lease_duration_s))
        record = lease_record(lease, self.lease_duration_s)
        action = decide(record, self.identity, now, self._observed(lease, now))
        if action is Action.WAIT:
            return False
        return self._replace(lease, claimed(record, self.identity, now, self.lease_duration_s))

    def _observed(self, lease: dict[str, Any], now: datetime) -> datetime:
        """When this replica first saw the Lease as it is now (by resourceVersion)."""
        version = lease["metadata"]["resourceVersion"]
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, now)
        return self._seen[1]

    def _read(self) -> dict[str, Any] | None:
        try:
            response = self._leases.read_namespaced_lease(
                self.name, self.namespace, **self._call_options()
            )
        except ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                return None
            raise
        return json.loads(response.data)

    def _create(self, record: LeaseRecord) -> bool:
        """Creates the Lease as ours; False when another replica created it first."""
        body = {"metadata": {"name": self.name}, "spec": lease_spec(record)}
        return self._write(self._leases.create_namespaced_lease, self.namespace, body)

    def _replace(self, lease: dict[str, Any], record: LeaseRecord) -> bool:
        """Writes ``record`` over the Lease as read; False when it changed since (409)."""
        meta = lease["metadata"]
        body = {
            "metadata": {"name": self.name, "resourceVersion": meta["resourceVersion"]},
            "spec": lease_spec(record),
        }
        return self._write(self._leases.replace_namespaced_lease, self.name, self.namespace, body)

    def _write(self, call: Callable[..., Any], *args: Any) -> bool:
        try:
            call(*args, **self._call_options())
        except ApiException as err:
            if err.status == HTTP_CONFLICT:
                return False
            raise
        return True

    def _call_options(self) -> dict[str, Any]:
        """Raw JSON, and a timeout so one slow call cannot outlast a renewal period."""
        return {"_preload_content": False, "_request_timeout": max(self.renew_period_s, 1.0)}


def _verb(won: bool) -> str:
    return "took" if won else "lost"
