"""The GPU state of a cluster as the API server holds it: what `infergrid placements` prints,
and what `infergrid what-if` replays.

Reads the same annotations the extender watches, once, through the same records,
so a node the extender would not offer (an unreadable annotation, one naming
another node) is left out here too, and reported by name rather than hidden.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from infergrid.assignment_annotation import PodAssignment
from infergrid.inventory import GpuInventory
from infergrid.records import LIVE_PODS, PodRecord, is_live, node_record, pod_record
from infergrid.usage import GpuUsage


@dataclass
class Snapshot:
    inventories: list[GpuInventory] = field(default_factory=list)
    usages: dict[str, GpuUsage] = field(default_factory=dict)
    assignments: dict[str, PodAssignment] = field(default_factory=dict)  # "namespace/name"
    problems: list[str] = field(default_factory=list)
    allocatable: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per node with an inventory: allocatable CPU millicores and memory MiB."""
    pods: list[tuple[PodRecord, dict[str, Any]]] = field(default_factory=list)
    """Every live pod that reads, with its JSON: what-if reads the requests in its spec."""


def read_snapshot(api: client.ApiClient) -> Snapshot:
    """Lists nodes and live pods once, as the extender's watch does."""
    return snapshot_of(*list_objects(api))


def list_objects(api: client.ApiClient) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The nodes and the live pods as Kubernetes JSON; only reads."""
    core = client.CoreV1Api(api)
    nodes = core.list_node(_preload_content=False)
    pods = core.list_pod_for_all_namespaces(field_selector=LIVE_PODS, _preload_content=False)
    return _items(nodes), _items(pods)


def _items(response: Any) -> list[dict[str, Any]]:
    """The objects of a list response read raw: the records decode Kubernetes JSON."""
    return json.loads(response.data).get("items") or []


def snapshot_of(nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]]) -> Snapshot:
    """What the extender would count, from Node and Pod JSON; each problem names its object."""
    snap = Snapshot()
    for node in map(node_record, nodes):
        if node.problem:
            snap.problems.append(f"node {node.name}: {node.problem}")
            continue
        if node.inventory is not None:
            snap.inventories.append(node.inventory)
            snap.allocatable[node.name] = (node.cpu_milli, node.memory_mib)
        if node.usage is not None:
            snap.usages[node.name] = node.usage
    for body in pods:
        pod = pod_record(body)
        if not is_live(pod):
            continue
        if pod.problem:
            snap.problems.append(f"pod {pod.key}: {pod.problem}")
            continue
        snap.pods.append((pod, body))
        if pod.assignment is not None:
            snap.assignments[pod.key] = pod.assignment
    return snap
