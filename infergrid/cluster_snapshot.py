"""The GPU state of a cluster as the API server holds it: what `infergrid placements` prints.

Reads the same annotations the extender watches, once. An annotation that does not
decode is reported by name rather than hidden, and leaves its object out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from kubernetes import client

from infergrid.assignment_annotation import PodAssignment, decode_assignment
from infergrid.constants import (
    ANNOTATION_GPU_ASSIGNMENT,
    ANNOTATION_GPU_INVENTORY,
    ANNOTATION_GPU_USAGE,
)
from infergrid.errors import ContractError
from infergrid.inventory import GpuInventory, decode_inventory
from infergrid.usage import GpuUsage, decode_usage

T = TypeVar("T")
_DONE_PHASES = ("Succeeded", "Failed")


@dataclass
class Snapshot:
    inventories: list[GpuInventory] = field(default_factory=list)
    usages: dict[str, GpuUsage] = field(default_factory=dict)
    assignments: dict[str, PodAssignment] = field(default_factory=dict)  # "namespace/name"
    problems: list[str] = field(default_factory=list)

    def decode(self, where: str, text: str | None, decoder: Callable[[str], T]) -> T | None:
        if text is None:
            return None
        try:
            return decoder(text)
        except ContractError as err:
            self.problems.append(f"{where}: {err}")
            return None


def read_snapshot(api: client.ApiClient) -> Snapshot:
    core = client.CoreV1Api(api)
    snap = Snapshot()
    for node in core.list_node().items:
        notes = node.metadata.annotations or {}
        where = f"node {node.metadata.name}"
        if inv := snap.decode(where, notes.get(ANNOTATION_GPU_INVENTORY), decode_inventory):
            snap.inventories.append(inv)
        if usage := snap.decode(where, notes.get(ANNOTATION_GPU_USAGE), decode_usage):
            snap.usages[node.metadata.name] = usage
    for pod in core.list_pod_for_all_namespaces().items:
        if pod.status.phase in _DONE_PHASES:
            continue
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        text = (pod.metadata.annotations or {}).get(ANNOTATION_GPU_ASSIGNMENT)
        if assignment := snap.decode(f"pod {key}", text, decode_assignment):
            snap.assignments[key] = assignment
    return snap
