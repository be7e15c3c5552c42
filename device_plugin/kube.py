"""The device plugin's Kubernetes I/O: its node's pods, node annotations, allocation marks.

Every call has a deadline: Allocate runs while the kubelet waits to start a
container, so an API server that does not answer must become a refusal the
kubelet reports, never a hang, and never a grant made without the pods to check.
"""

from __future__ import annotations

import json
import logging
from typing import Final

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from device_plugin import metrics
from device_plugin.allocator import AllocationError, Grant
from infergrid.assignment_annotation import decode_assignment, encode_assignment, mark_allocated
from infergrid.constants import ANNOTATION_GPU_ASSIGNMENT
from infergrid.errors import ContractError
from infergrid.records import PodRecord, is_live, pod_record

log = logging.getLogger(__name__)

MARK_RETRIES = 5
API_TIMEOUT_S: Final = (3.0, 10.0)
"""Seconds to connect to the API server and to read its answer, for each call."""
UNANSWERED: Final = (ApiException, HTTPError, OSError)
"""What a call raises when the API server refuses, times out or cannot be reached."""


class KubePods:
    """Reads the pods bound to one node straight from the API server at each call."""

    def __init__(self, core: client.CoreV1Api, node: str):
        self.core = core
        self.node = node

    def pods(self) -> list[PodRecord]:
        """The node's live pods; AllocationError naming the API server when it does not answer."""
        try:
            raw = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node}",
                _preload_content=False,
                _request_timeout=API_TIMEOUT_S,
            )
            items = json.loads(raw.data)["items"]
        except (*UNANSWERED, ValueError, KeyError, TypeError) as err:
            raise AllocationError(
                f"the API server did not list the pods of node {self.node} "
                f"({type(err).__name__}: {err}); no GPU is granted unchecked"
            ) from err
        return [r for r in map(pod_record, items) if is_live(r)]

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
