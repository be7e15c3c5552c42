"""Which engine pod to replace because its GPU turned unhealthy, if any.

The device plugin marks every pod holding a GPU that faulted (an XID, ECC errors)
with the condition `infergrid.io/GPUHealthy=False`. After a grace period, which
lets a transient fault pass, the operator deletes such a pod: its Deployment
makes a new one, which the extender places on a healthy GPU (an unhealthy one
offers nothing). One replacement at a time per service: while a pod of the service
is going away or starting, and is not itself on a faulted GPU, none is deleted,
so a fault across a node never takes every replica down at once.

Pure: the timer handler passes the pods in (as API dicts) and deletes what
this returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from infergrid.constants import CONDITION_GPU_HEALTHY


@dataclass(frozen=True, slots=True)
class Replacement:
    """The pod to delete (by name and uid, so a pod made again under its name is spared)."""

    name: str
    uid: str
    message: str


def pod_to_replace(
    pods: Sequence[Mapping[str, Any]], now: datetime, grace_s: float
) -> Replacement | None:
    """The pod longest on a faulted GPU, once past `grace_s`, unless a replacement is under way."""
    faulted: list[tuple[datetime, Mapping[str, Any], str]] = []
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp"):
            return None  # a replacement (or some other deletion) is under way
        fault = _gpu_fault(pod)
        if fault is None:
            if not _ready(pod):
                return None  # a replica is starting: let it come up first
            continue
        since, message = fault
        faulted.append((since, pod, message))
    due = [(since, pod, m) for since, pod, m in faulted if (now - since).total_seconds() >= grace_s]
    if not due:
        return None
    since, pod, message = min(due, key=lambda item: item[0])
    meta = pod["metadata"]
    why = f"pod {meta['name']}: its GPU is unhealthy since {since.isoformat()}: {message}"
    return Replacement(meta["name"], meta.get("uid", ""), why)


def _gpu_fault(pod: Mapping[str, Any]) -> tuple[datetime, str] | None:
    """When the pod's GPU turned unhealthy, and why; None when it is not marked so."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == CONDITION_GPU_HEALTHY and condition.get("status") == "False":
            since = _time(condition.get("lastTransitionTime"))
            return (since, condition.get("message") or "") if since else None
    return None


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _time(text: object) -> datetime | None:
    """An RFC 3339 time as the API server writes it; None for anything else."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
