"""A live cluster in the replay's own types: its GPU nodes as the core's node states, and the
pods that ask for GPUs as ``SimPod``s, read from the Kubernetes JSON the API server lists.

The nodes come through ``cluster_snapshot`` (the records the extender reads) and
``build_node_state`` (the extender's own constructor), each pod's request through
``parse_pod_request`` and ``parse_host_request`` (the extender's parsers), so the
replay starts from what the extender counts. Each node is kept twice:

* ``now``: every recorded assignment reserved, and the CPU and memory of every
  pod bound there requested, as the extender sees it;
* ``vacated``: the same with the GPU pods gone, where the replay starts. Pods
  that stay put (no GPU, or a request that does not read) keep what they hold,
  and measured use keeps what the GPU pods' assignments do not explain (a
  process InferGrid did not place, a driver's few hundred MiB).

Pods replay by creation time, then ``namespace/name``. The typical pods (the
simulator's M, which fragmentation and stranded memory are measured over) are
those of the GPU pods, taken as the simulator takes a trace's
(``typical_demands``); without GPU pods, one whole GPU, the extender's default.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from itertools import chain
from typing import Any, Final

from infergrid.assignment_annotation import PodAssignment
from infergrid.cluster_snapshot import Snapshot, snapshot_of
from infergrid.codec import each, expect, field, join
from infergrid.errors import ContractError
from infergrid.inventory import GpuInventory
from infergrid.placement import (
    ALL_CORES,
    DEFAULT_WORKLOAD,
    HostResources,
    NodeState,
    Workload,
    build_node_state,
)
from infergrid.placement.learned import pod_demands
from infergrid.pod_host import parse_host_request
from infergrid.pod_request import PodGpuRequest, parse_pod_request
from infergrid.records import PodRecord
from infergrid.simulate.cluster import SimPod
from infergrid.simulate.policies import typical_demands
from infergrid.simulate.trace import MILLI_GPU
from infergrid.usage import GpuUsage

KINDS: Final = ("Node", "Pod")
"""The kinds a snapshot file's items are read as; any other kind is passed over."""


@dataclass(frozen=True, slots=True)
class LivePod:
    """A live pod that asks for GPUs: as the replay takes it (named ``namespace/name``), the
    node its assignment names now (None: it holds no GPU), and when it was created."""

    pod: SimPod
    node: str | None
    created: str

    @property
    def key(self) -> str:
        return self.pod.name


@dataclass(frozen=True, slots=True)
class LiveCluster:
    """The GPU nodes by name, ``now`` and ``vacated`` (see the module), the GPU pods in replay
    order, their typical pods, and what could not be read, each naming its object."""

    now: tuple[NodeState, ...]
    vacated: tuple[NodeState, ...]
    pods: tuple[LivePod, ...]
    typical: Workload
    problems: tuple[str, ...]


def objects_of(document: object, source: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The nodes and pods of a ``kubectl get nodes,pods -A -o json`` document; a bad item fails
    naming its field (``FILE: items[3].metadata.uid``)."""
    doc = expect(document, dict, source)
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for item, path in each(doc, "items", dict, source):
        kind = item.get("kind")
        if kind not in KINDS:
            continue
        metadata = field(item, "metadata", dict, path)
        where = join(path, "metadata")
        field(metadata, "name", str, where)
        field(metadata, "annotations", dict, where, default={})
        for part in ("spec", "status"):
            field(item, part, dict, path, default={})
        if kind == "Pod":
            field(metadata, "uid", str, where)
        (nodes if kind == "Node" else pods).append(item)
    return nodes, pods


def cluster_of(
    nodes: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]],
    now: datetime | None,
    stale_after: timedelta,
) -> LiveCluster:
    """The cluster the node and pod JSON describe. A node whose usage heartbeat is older than
    ``stale_after`` at ``now`` offers nothing, as in the extender; ``now`` None is the
    snapshot's own time, its newest heartbeat (a file read later is not all stale)."""
    snap = snapshot_of(nodes, pods)
    problems = list(snap.problems)
    moving: list[tuple[PodRecord, LivePod]] = []
    for record, body in snap.pods:
        try:
            request, host = parse_pod_request(body), parse_host_request(body)
        except ContractError as err:
            problems.append(f"pod {record.key}: {err}; it stays where it is")
            continue
        if not request.gpu_containers:
            continue
        sim = SimPod(record.key, request, host, _gpu_milli(request))
        node = record.assignment.node if record.assignment else None
        created = str((body.get("metadata") or {}).get("creationTimestamp") or "")
        moving.append((record, LivePod(sim, node, created)))
    moving.sort(key=lambda rp: (rp[1].created, rp[1].key))
    at = now if now is not None else _snapshot_time(snap)
    movers = {r.uid for r, _ in moving}
    states = [
        _node(snap, inventory, movers, at, stale_after)
        for inventory in sorted(snap.inventories, key=lambda i: i.node)
    ]
    live = tuple(pod for _, pod in moving)
    return LiveCluster(
        now=tuple(n for n, _ in states),
        vacated=tuple(v for _, v in states),
        pods=live,
        typical=_typical(live),
        problems=tuple(problems),
    )


def _gpu_milli(request: PodGpuRequest) -> int:
    """The pod's GPU request in milli-GPUs, as the replay's arrived and allocated % count it:
    1000 per whole GPU, and a share's SM percent (its part of any GPU, whatever the GPU's
    memory); a MIG instance, carved ahead of time, counts none, as in fragmentation."""
    milli = 0
    for container in request.gpu_containers:
        if container.kind == "whole":
            milli += container.gpus * MILLI_GPU
        elif container.kind == "share":
            milli += container.cores * MILLI_GPU // ALL_CORES
    return milli


def _typical(pods: Sequence[LivePod]) -> Workload:
    """The typical pods of the GPU pods; one whole GPU without any."""
    demands = list(chain.from_iterable(pod_demands(p.pod.request, p.pod.host) for p in pods))
    return typical_demands(demands) if demands else DEFAULT_WORKLOAD


def _snapshot_time(snap: Snapshot) -> datetime:
    """The newest heartbeat of the snapshot's nodes; without one, any time will do, since
    every node then offers nothing."""
    beats = [usage.heartbeat for usage in snap.usages.values()]
    return max(beats) if beats else datetime.fromtimestamp(0, UTC)


def _node(
    snap: Snapshot, inventory: GpuInventory, movers: set[str], now: datetime, stale_after: timedelta
) -> tuple[NodeState, NodeState]:
    """The node ``now`` and ``vacated`` (see the module); ``movers`` are the GPU pods' uids.
    Assignments count where they name the node, requests where a pod is bound."""
    name = inventory.node
    usage = snap.usages.get(name)
    held = _held_on(name, [r for r, _ in snap.pods])
    stays = [a for r, a in held if r.uid not in movers]
    current = build_node_state(inventory, usage, [a for _, a in held], now, stale_after)
    left = build_node_state(inventory, usage, stays, now, stale_after)
    remaining = _left_behind(usage, current, left)
    vacated = build_node_state(inventory, remaining, stays, now, stale_after)
    cpu, memory = snap.allocatable[name]
    if not cpu:  # as the extender: where a node reads no CPU, kube-scheduler alone counts it
        return current, vacated
    bound = [r for r, _ in snap.pods if r.node_name == name]
    kept = [r for r in bound if r.uid not in movers]
    return _with_host(current, cpu, memory, bound), _with_host(vacated, cpu, memory, kept)


def _with_host(node: NodeState, cpu: int, memory: int, bound: Sequence[PodRecord]) -> NodeState:
    """The node with its allocatable CPU and memory, and what the pods bound to it request."""
    requested_cpu = sum(r.cpu_milli for r in bound)
    requested_memory = sum(r.memory_mib for r in bound)
    return replace(node, host=HostResources(cpu, memory, requested_cpu, requested_memory))


def _held_on(node: str, records: Iterable[PodRecord]) -> list[tuple[PodRecord, PodAssignment]]:
    """The pods' assignments on ``node``, oldest first, as the extender orders them."""
    held = [(r, r.assignment) for r in records if r.assignment and r.assignment.node == node]
    return sorted(held, key=lambda ra: (ra[1].assigned_at, ra[0].key))


def _left_behind(usage: GpuUsage | None, current: NodeState, left: NodeState) -> GpuUsage | None:
    """The measured use with what the GPU pods are assigned on each GPU taken out."""
    if usage is None:
        return None
    moved = {
        g.uuid: g.assigned_mib - k.assigned_mib
        for g, k in zip(current.gpus, left.gpus, strict=True)
    }
    samples = tuple(
        replace(s, used_mib=max(0, s.used_mib - moved.get(s.uuid, 0))) for s in usage.gpus
    )
    return replace(usage, gpus=samples)
