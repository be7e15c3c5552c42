"""The device plugin's Kubernetes I/O: its node's pods, node annotations, allocation marks."""

from __future__ import annotations

import json
import logging

from kubernetes import client
from kubernetes.client.rest import ApiException

from device_plugin import metrics
from device_plugin.allocator import Grant
from infergrid.assignment_annotation import decode_assignment, encode_assignment, mark_allocated
from infergrid.constants import ANNOTATION_GPU_ASSIGNMENT
from infergrid.errors import ContractError
from infergrid.records import PodRecord, is_live, pod_record

log = logging.getLogger(__name__)

MARK_RETRIES = 5


class KubePods:
    """Reads the pods bound to one node straight from the API server at each call."""

    def __init__(self, core: client.CoreV1Api, node: str):
        self.core = core
        self.node = node

    def pods(self) -> list[PodRecord]:
        raw = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}", _preload_content=False
        )
        items = json.loads(raw.data)["items"]
        return [r for r in map(pod_record, items) if is_live(r)]

    def mark_allocated(self, grants: list[Grant]) -> None:
        """Marks each granted container allocated in its pod's assignment annotation."""
        for grant in grants:
            pod, container = grant.pending.pod, grant.pending.container.name
            try:
                self._mark(pod.namespace, pod.name, container)
            except (ApiException, ContractError) as err:
                metrics.PUBLISH_ERRORS.labels("allocation-mark").inc()
                log.error("could not mark %s/%s allocated: %s", pod.key, container, err)

    def _mark(self, namespace: str, name: str, container: str) -> None:
        """Read, mark, write with the read resourceVersion; retried on a conflict."""
        for attempt in range(MARK_RETRIES):
            pod = self.core.read_namespaced_pod(name, namespace)
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
                self.core.patch_namespaced_pod(name, namespace, body)
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
    core.patch_node(node, body)
