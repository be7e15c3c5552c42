"""The device plugin's Kubernetes I/O: its node's pods, node annotations, allocation marks,
the GPUHealthy conditions and events of pods on unhealthy GPUs, and its node's toolkit
condition.

Every call has a deadline: Allocate runs while the kubelet waits to start a
container, so an API server that does not answer must become a refusal the
kubelet reports, never a hang, and never a grant made without the pods to check.
A condition or event the API server does not take is logged and counted, and the
next round tries again: health reporting never stops the plugin.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from device_plugin import metrics
from device_plugin.allocator import AllocationError, Grant
from device_plugin.pod_health import (
    ConditionChange,
    ObservedPod,
    condition_patch,
    gpu_condition,
    timestamp,
    warning_event,
)
from device_plugin.toolkit import NodeCondition
from infergrid.assignment_annotation import decode_assignment, encode_assignment, mark_allocated
from infergrid.constants import ANNOTATION_GPU_ASSIGNMENT, CONDITION_GPU_HEALTHY
from infergrid.errors import ContractError
from infergrid.records import PodRecord, is_live, pod_record

log = logging.getLogger(__name__)

MARK_RETRIES = 5
API_TIMEOUT_S: Final = (3.0, 10.0)
"""Seconds to connect to the API server and to read its answer, for each call."""
UNANSWERED: Final = (ApiException, HTTPError, OSError)
"""What a call raises when the API server refuses, times out or cannot be reached."""
UNREAD: Final = (*UNANSWERED, ValueError, KeyError, TypeError)
"""What listing raises, also for an answer that is not a pod list."""
STRATEGIC_MERGE: Final = "application/strategic-merge-patch+json"


class KubePods:
    """Reads the pods bound to one node straight from the API server at each call."""

    def __init__(
        self,
        core: client.CoreV1Api,
        node: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self.core = core
        self.node = node
        self.clock = clock

    def pods(self) -> list[PodRecord]:
        """The node's live pods; AllocationError naming the API server when it does not answer."""
        try:
            items = self._node_pods()
        except UNREAD as err:
            raise AllocationError(
                f"the API server did not list the pods of node {self.node} "
                f"({type(err).__name__}: {err}); no GPU is granted unchecked"
            ) from err
        return [r for r in map(pod_record, items) if is_live(r)]

    def gpu_conditions(self) -> list[ObservedPod] | None:
        """The node's live pods with their GPUHealthy condition; None, logged, unanswered."""
        try:
            items = self._node_pods()
        except UNREAD as err:
            log.warning("cannot list node %s's pods to mark those on unhealthy GPUs: %s: %s",
                        self.node, type(err).__name__, err)  # fmt: skip
            return None
        observed = (ObservedPod(pod_record(item), gpu_condition(item)) for item in items)
        return [o for o in observed if is_live(o.pod)]

    def set_gpu_condition(self, change: ConditionChange) -> bool:
        """Patch the pod's condition, then post its event when it warns.

        False when the condition was not taken; a lost event is only logged, since
        the condition, already set, is what the next round compares with.
        """
        pod, status, now = change.pod, change.condition.status, self.clock()
        try:
            self.core.patch_namespaced_pod_status(
                pod.name,
                pod.namespace,
                condition_patch(change, now),
                _request_timeout=API_TIMEOUT_S,
                _content_type=STRATEGIC_MERGE,
            )
        except UNANSWERED as err:
            metrics.PUBLISH_ERRORS.labels("pod-condition").inc()
            log.warning(
                "could not set %s=%s on %s: %s", CONDITION_GPU_HEALTHY, status, pod.key, err
            )
            return False
        metrics.PODS_MARKED.labels(status).inc()
        log.info(
            "%s=%s on %s: %s", CONDITION_GPU_HEALTHY, status, pod.key, change.condition.message
        )
        if change.warns:
            self._post(pod, warning_event(change, self.node, now))
        return True

    def _post(self, pod: PodRecord, event: dict[str, Any]) -> None:
        try:
            self.core.create_namespaced_event(pod.namespace, event, _request_timeout=API_TIMEOUT_S)
        except UNANSWERED as err:
            metrics.PUBLISH_ERRORS.labels("pod-event").inc()
            log.warning("event %s on %s not recorded: %s", event["reason"], pod.key, err)

    def _node_pods(self) -> list[dict[str, Any]]:
        """Every pod bound to this node, as the API server's JSON."""
        raw = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}",
            _preload_content=False,
            _request_timeout=API_TIMEOUT_S,
        )
        return json.loads(raw.data)["items"]

    def mark_allocated(self, grants: list[Grant]) -> None:
        """Marks each granted container allocated in its pod's assignment annotation."""
        for grant in grants:
            pod, container = grant.pending.pod, grant.pending.container.name
            try:
                self._mark(pod.namespace, pod.name, container)
            except (*UNANSWERED, ContractError) as err:
                metrics.PUBLISH_ERRORS.labels("allocation-mark").inc()
                log.error("could not mark %s/%s allocated: %s", pod.key, container, err)

    def _mark(self, namespace: str, name: str, container: str) -> None:
        """Read, mark, write with the read resourceVersion; retried on a conflict."""
        for attempt in range(MARK_RETRIES):
            pod = self.core.read_namespaced_pod(name, namespace, _request_timeout=API_TIMEOUT_S)
            text = (pod.metadata.annotations or {}).get(ANNOTATION_GPU_ASSIGNMENT)
            if text is None:
                raise ContractError(ANNOTATION_GPU_ASSIGNMENT, "annotation disappeared")
            marked = encode_assignment(mark_allocated(decode_assignment(text), container))
            body = {
                "metadata": {
                    "resourceVersion": pod.metadata.resource_version,
                    "annotations": {ANNOTATION_GPU_ASSIGNMENT: marked},
                }
            }
            try:
                self.core.patch_namespaced_pod(
                    name, namespace, body, _request_timeout=API_TIMEOUT_S
                )
                return
            except ApiException as err:
                if err.status != 409 or attempt == MARK_RETRIES - 1:
                    raise


def patch_node(core: client.CoreV1Api, node: str, annotations: dict, labels: dict) -> None:
    body: dict = {"metadata": {}}
    if annotations:
        body["metadata"]["annotations"] = annotations
    if labels:
        body["metadata"]["labels"] = labels
    core.patch_node(node, body, _request_timeout=API_TIMEOUT_S)


def node_condition_patch(condition: NodeCondition, now: datetime) -> dict[str, Any]:
    """The strategic-merge patch of ``nodes/status`` that writes one condition.

    Conditions merge by type, so the kubelet's own (Ready, MemoryPressure...) stay.
    """
    stamp = timestamp(now)
    written = {
        "type": condition.type,
        "status": condition.status,
        "reason": condition.reason,
        "message": condition.message,
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }
    return {"status": {"conditions": [written]}}


def set_node_condition(
    core: client.CoreV1Api, node: str, condition: NodeCondition, now: datetime
) -> bool:
    """Writes `condition` on this node; False, logged and counted, when it was not taken."""
    try:
        core.patch_node_status(
            node,
            node_condition_patch(condition, now),
            _request_timeout=API_TIMEOUT_S,
            _content_type=STRATEGIC_MERGE,
        )
    except UNANSWERED as err:
        metrics.PUBLISH_ERRORS.labels("node-condition").inc()
        log.warning("could not set %s=%s on node %s: %s", condition.type, condition.status,
                    node, err)  # fmt: skip
        return False
    log.info("%s=%s on node %s: %s", condition.type, condition.status, node, condition.message)
    return True
