"""An InferenceService's status, computed from what its Deployments and pods report.

Pure: the handlers read the Deployments and pods (as API dicts) and pass them
in with the previous conditions; the result is the status to write. Scheduling
failures come from the pods' PodScheduled condition, which the scheduler sets
together with its FailedScheduling event and the same message ("0/12 nodes
are available: ..."), so the reason a GPU pod waits reaches `kubectl get
infsvc -o yaml` without reading events, which expire and aggregate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infergrid.tracks import CANARY, STABLE

from .render import service_url, stable_selector

READY, SCHEDULED, PROGRESSING, DEGRADED = "Ready", "Scheduled", "Progressing", "Degraded"
TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"


@dataclass(frozen=True, slots=True)
class Track:
    """One Deployment as seen against the replicas the spec asks of it."""

    desired: int
    replicas: int = 0
    ready: int = 0
    rolled_out: bool = False
    stalled: str = ""  # the Deployment's message when its progress deadline passed
    failure: str = ""  # the Deployment's ReplicaFailure message, e.g. a quota refusal


def observe_deployment(deployment: Mapping[str, Any] | None, desired: int) -> Track:
    """A Deployment's state; a missing one has no pods and has not rolled out."""
    if deployment is None:
        return Track(desired)
    meta, spec, status = deployment["metadata"], deployment["spec"], deployment.get("status") or {}
    updated = status.get("updatedReplicas", 0)
    rolled_out = (
        status.get("observedGeneration", 0) >= meta.get("generation", 0)
        and spec.get("replicas") == desired
        and updated == desired
        and status.get("replicas", 0) == updated
        and status.get("availableReplicas", 0) >= updated
    )
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    progressing = conditions.get("Progressing", {})
    failure = conditions.get("ReplicaFailure", {})
    return Track(
        desired=desired,
        replicas=status.get("replicas", 0),
        ready=status.get("readyReplicas", 0),
        rolled_out=rolled_out,
        stalled=progressing.get("message", "")
        if progressing.get("reason") == "ProgressDeadlineExceeded"
        else "",
        failure=failure.get("message", "") if failure.get("status") == TRUE else "",
    )


def unschedulable(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """The scheduler's message for each live pod it could not place."""
    messages = []
    for pod in _live(pods):
        for c in pod.get("status", {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == FALSE:
                messages.append(c.get("message") or c.get("reason", "unschedulable"))
    return messages


def unbound(pods: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for pod in _live(pods) if not pod["spec"].get("nodeName"))


def compute_conditions(
    tracks: Mapping[str, Track], pods: Sequence[Mapping[str, Any]]
) -> list[dict[str, str]]:
    """Ready, Scheduled, Progressing and Degraded, each with a reason and a message."""
    failing = unschedulable(pods)
    desired = sum(t.desired for t in tracks.values())
    ready = sum(t.ready for t in tracks.values())
    stalled = next((t.stalled for t in tracks.values() if t.stalled), "")
    failure = next((t.failure for t in tracks.values() if t.failure), "")
    rolled_out = all(t.rolled_out for t in tracks.values())
    counts = f"{ready}/{desired} replicas ready"
    return [
        _ready(desired, ready, rolled_out, failing, counts),
        _scheduled(failing, unbound(pods), len(_live(pods))),
        _progressing(rolled_out, stalled, counts),
        _degraded(failing, stalled, failure),
    ]


def _ready(
    desired: int, ready: int, rolled_out: bool, failing: list[str], counts: str
) -> dict[str, str]:
    if desired == 0:
        return _condition(READY, FALSE, "ScaledToZero", "no replicas are requested")
    if failing:
        return _condition(READY, FALSE, "Unschedulable", f"{counts}; {failing[0]}")
    if ready >= desired and rolled_out:
        return _condition(READY, TRUE, "AllReplicasReady", counts)
    return _condition(READY, FALSE, "ReplicasNotReady", counts)


def _scheduled(failing: list[str], waiting: int, live: int) -> dict[str, str]:
    if failing:
        message = f"{len(failing)} of {live} pods cannot be scheduled: {failing[0]}"
        return _condition(SCHEDULED, FALSE, "Unschedulable", message)
    if waiting:
        return _condition(SCHEDULED, UNKNOWN, "Pending", f"{waiting} pods wait for the scheduler")
    return _condition(SCHEDULED, TRUE, "AllPodsScheduled", f"{live} pods scheduled")


def _progressing(rolled_out: bool, stalled: str, counts: str) -> dict[str, str]:
    if stalled:
        return _condition(PROGRESSING, FALSE, "ProgressDeadlineExceeded", stalled)
    if not rolled_out:
        return _condition(PROGRESSING, TRUE, "RollingOut", counts)
    return _condition(PROGRESSING, FALSE, "RolloutComplete", counts)


def _degraded(failing: list[str], stalled: str, failure: str) -> dict[str, str]:
    if failing:
        return _condition(DEGRADED, TRUE, "Unschedulable", failing[0])
    if stalled:
        return _condition(DEGRADED, TRUE, "ProgressDeadlineExceeded", stalled)
    if failure:
        return _condition(DEGRADED, TRUE, "ReplicaFailure", failure)
    return _condition(DEGRADED, FALSE, "AsExpected", "")


def merge_conditions(
    previous: Sequence[Mapping[str, Any]], current: Sequence[dict[str, str]], now: str
) -> list[dict[str, str]]:
    """`current` with lastTransitionTime kept from `previous` where the status did not change."""
    before = {c["type"]: c for c in previous}
    merged = []
    for c in current:
        old = before.get(c["type"])
        changed = old is None or old.get("status") != c["status"]
        since = now if changed else old.get("lastTransitionTime", now)
        merged.append({**c, "lastTransitionTime": since})
    return merged


def compute_status(
    name: str,
    namespace: str,
    tracks: Mapping[str, Track],
    pods: Sequence[Mapping[str, Any]],
    previous: Sequence[Mapping[str, Any]],
    now: str,
) -> dict[str, Any]:
    """The operator-owned status fields; `canary` is None (removed) when there is no canary."""
    stable = tracks.get(STABLE, Track(0))
    canary = tracks.get(CANARY)
    return {
        "replicas": stable.replicas,
        "readyReplicas": stable.ready,
        "selector": stable_selector(name),
        "url": service_url(name, namespace),
        "conditions": merge_conditions(previous, compute_conditions(tracks, pods), now),
        "canary": {"replicas": canary.replicas, "readyReplicas": canary.ready} if canary else None,
    }


def refused_conditions(
    reason: str, message: str, previous: Sequence[Mapping[str, Any]], now: str
) -> list[dict[str, str]]:
    """A service the operator will not serve as it stands: not Ready, Degraded, and why.

    `InvalidSpec` names the field; `OwnershipConflict` names the objects in the way.
    """
    current = [
        _condition(READY, FALSE, reason, message),
        _condition(DEGRADED, TRUE, reason, message),
    ]
    kept = [c for c in previous if c["type"] not in (READY, DEGRADED)]
    return [*kept, *merge_conditions(previous, current, now)]


def status_patch(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `wanted` that differ from `current` (None removes a field)."""
    return {k: v for k, v in wanted.items() if current.get(k) != v}


def transitions(
    previous: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str, str]]:
    """Events worth posting, as (Normal|Warning, reason, message): becoming Ready, or failing."""
    before = {c["type"]: c.get("status") for c in previous}
    events = []
    for c in current:
        if before.get(c["type"]) == c["status"]:
            continue
        if c["type"] == READY and c["status"] == TRUE:
            events.append(("Normal", "Ready", c["message"]))
        elif c["type"] == DEGRADED and c["status"] == TRUE:
            events.append(("Warning", c["reason"], c["message"]))
    return events


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def _live(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods not on their way out; a terminating pod's state says nothing about the service."""
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]
