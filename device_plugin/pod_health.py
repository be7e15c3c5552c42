"""Telling the pods on a GPU that it turned unhealthy, and that it is healthy again.

An unhealthy GPU is only withdrawn from the kubelet's offer: the pods already on it
keep running on a broken GPU, and nothing says so. The plugin sets the condition
``infergrid.io/GPUHealthy`` "False" on every live pod of its node whose assignment
names that GPU (whole, shared, or as a MIG instance's parent), with the GPU and the
fault in its message, and posts one Warning event; the operator moves the pods that
keep it. When a transient fault passes, the condition goes back to "True".

``condition_changes`` decides, as a pure function of the pods, their assignments, the
condition each already carries and the unhealthy GPUs. A pod that already says the
same gets nothing, so a round that changes nothing writes nothing and no pod gets a
second event. ``PodHealthReporter`` runs it in a thread, at once on every health flip
and at least every ``interval_s``; it lists the pods only while some GPU is unhealthy
or some pod may still say "False", so a healthy node costs the API server nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol

from device_plugin.health import HealthTracker
from infergrid.codec import encode_time
from infergrid.constants import CONDITION_GPU_HEALTHY
from infergrid.inventory import GpuInventory
from infergrid.records import PodRecord

log = logging.getLogger(__name__)

REASON_UNHEALTHY: Final = "GPUUnhealthy"
REASON_HEALTHY: Final = "GPUHealthy"
EVENT_SOURCE: Final = "infergrid-device-plugin"
"""The component named in the events' source and reportingComponent."""
WAKE_S: Final = 0.5
"""How often the reporter's thread looks at its stop flag while it waits."""


@dataclass(frozen=True, slots=True)
class GpuCondition:
    """A pod's ``infergrid.io/GPUHealthy`` condition: "True" or "False", why, and on which GPU."""

    status: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class ObservedPod:
    """A live pod of the node and the GPUHealthy condition it carries now, if any."""

    pod: PodRecord
    condition: GpuCondition | None


@dataclass(frozen=True, slots=True)
class ConditionChange:
    """The condition to write on a pod; ``transition`` when its status differs from the pod's."""

    pod: PodRecord
    condition: GpuCondition
    transition: bool

    @property
    def warns(self) -> bool:
        """Whether the change deserves its Warning event: a pod that just learned of a fault."""
        return self.transition and self.condition.status == "False"


def condition_changes(
    pods: Iterable[ObservedPod], unhealthy: Mapping[str, str], indices: Mapping[str, int]
) -> list[ConditionChange]:
    """The conditions to write, one per pod whose condition must change.

    ``unhealthy`` is the tracker's reason per unhealthy GPU uuid, ``indices`` each
    GPU's NVML index, so messages name a GPU as people see it in ``nvidia-smi``.
    """
    changes = []
    for observed in pods:
        wanted = _wanted(observed, unhealthy, indices)
        if wanted is None or wanted == observed.condition:
            continue
        was = observed.condition
        transition = was is None or was.status != wanted.status
        changes.append(ConditionChange(observed.pod, wanted, transition))
    return changes


def _wanted(
    observed: ObservedPod, unhealthy: Mapping[str, str], indices: Mapping[str, int]
) -> GpuCondition | None:
    """The condition the pod should carry; None where it needs none (never told of a fault)."""
    held = held_gpus(observed.pod, indices)
    faulty = [uuid for uuid in held if uuid in unhealthy]
    if faulty:
        message = "; ".join(
            f"GPU {_named(uuid, indices)} is unhealthy: {unhealthy[uuid]}" for uuid in faulty
        )
        return GpuCondition("False", REASON_UNHEALTHY, message)
    if held and observed.condition is not None and observed.condition.status != "True":
        gpus = ", ".join(_named(uuid, indices) for uuid in held)
        return GpuCondition("True", REASON_HEALTHY, f"every GPU it holds is healthy: {gpus}")
    return None


def held_gpus(pod: PodRecord, indices: Mapping[str, int]) -> list[str]:
    """The uuids of the GPUs the pod's assignment names, a MIG instance by its parent GPU;
    in index order, GPUs this node does not know last."""
    if pod.assignment is None:
        return []
    containers = pod.assignment.containers
    uuids = {gpu.uuid for c in containers for gpu in c.gpus}
    uuids |= {c.mig.gpu_uuid for c in containers if c.mig is not None}
    return sorted(uuids, key=lambda uuid: (indices.get(uuid, len(indices)), uuid))


def _named(uuid: str, indices: Mapping[str, int]) -> str:
    index = indices.get(uuid)
    return uuid if index is None else f"{uuid} (index {index})"


def gpu_condition(pod: Mapping[str, Any]) -> GpuCondition | None:
    """The GPUHealthy condition in a pod's JSON; None when it carries none."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == CONDITION_GPU_HEALTHY:
            return GpuCondition(
                str(condition.get("status", "")),
                str(condition.get("reason", "")),
                str(condition.get("message", "")),
            )
    return None


def condition_patch(change: ConditionChange, now: datetime) -> dict[str, Any]:
    """The strategic-merge patch of ``pods/status`` that writes the change.

    Conditions merge by type, so the pod's other conditions stay as they are; the
    transition time moves only with the status.
    """
    condition = {
        "type": CONDITION_GPU_HEALTHY,
        "status": change.condition.status,
        "reason": change.condition.reason,
        "message": change.condition.message,
    }
    if change.transition:
        condition["lastTransitionTime"] = timestamp(now)
    return {"status": {"conditions": [condition]}}


def warning_event(change: ConditionChange, node: str, now: datetime) -> dict[str, Any]:
    """The core/v1 Event that tells ``kubectl describe pod`` readers of the fault."""
    pod, stamp = change.pod, timestamp(now)
    return {
        "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
        },
        "type": "Warning",
        "reason": change.condition.reason,
        "message": change.condition.message,
        "source": {"component": EVENT_SOURCE, "host": node},
        "reportingComponent": EVENT_SOURCE,
        "reportingInstance": node,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def timestamp(now: datetime) -> str:
    """RFC 3339 to the second, as Kubernetes writes its times."""
    return encode_time(now.replace(microsecond=0), "now")


class PodConditions(Protocol):
    """The node's pods with their GPUHealthy condition, and a way to write one (kube.py)."""

    def gpu_conditions(self) -> list[ObservedPod] | None:
        """The node's live pods; None, logged, when the API server did not answer."""
        ...

    def set_gpu_condition(self, change: ConditionChange) -> bool:
        """Write the change (and its event, when it warns); whether the condition was taken."""
        ...


class PodHealthReporter:
    """Keeps the GPUHealthy condition of the node's pods in step with the health tracker."""

    def __init__(
        self,
        tracker: HealthTracker,
        pods: PodConditions,
        inventory: Callable[[], GpuInventory],
        interval_s: float,
        stop: threading.Event,
    ) -> None:
        self._tracker = tracker
        self._pods = pods
        self._inventory = inventory
        self._interval_s = interval_s
        self._stop = stop
        self._settled = False
        """A round found every GPU healthy and left no pod saying "False": until a GPU
        turns unhealthy, there is nothing to list. False at start, so the first round
        turns back what pods kept from before a restart."""

    def run(self) -> None:
        """Rounds at once on every health flip and every ``interval_s`` until stopped."""
        seen, due = -1, 0.0
        while not self._stop.is_set():
            version = self._tracker.version
            if version != seen or time.monotonic() >= due:
                seen, due = version, time.monotonic() + self._interval_s
                try:
                    self.report_once()
                except Exception:
                    log.exception("marking the pods of unhealthy GPUs failed; retrying next round")
            self._tracker.wait_for_change(seen, WAKE_S)

    def report_once(self) -> None:
        """One round: list the pods if needed, and write each condition that must change."""
        unhealthy = self._tracker.unhealthy()
        if self._settled and not unhealthy:
            return
        observed = self._pods.gpu_conditions()
        if observed is None:
            return
        indices = {gpu.uuid: gpu.index for gpu in self._inventory().gpus}
        changes = condition_changes(observed, unhealthy, indices)
        written = [self._pods.set_gpu_condition(change) for change in changes]
        self._settled = not unhealthy and all(written)
