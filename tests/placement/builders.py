"""Small nodes and pods for the placement tests, built from the contract's own types."""

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from infergrid.assignment_annotation import (
    AssignedGpu,
    AssignedMig,
    ContainerAssignment,
    PodAssignment,
)
from infergrid.constants import LINK_NVLINK, LINK_SYSTEM
from infergrid.inventory import Gpu, GpuInventory, GpuLink, MigInstance
from infergrid.placement import NodeSet, NodeState, build_node_state, resolve_policy
from infergrid.pod_request import ContainerGpuRequest, PodGpuRequest
from infergrid.usage import GpuUsage, GpuUsageSample

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
STALE_AFTER = timedelta(seconds=30)
NODE = "node-a"
L4_MIB = 24576
A100_MIB = 81920

BINPACK = resolve_policy("binpack")
SPREAD = resolve_policy("spread")
FGD = resolve_policy("fgd")


def gpu(
    index: int,
    memory: int = L4_MIB,
    model: str = "NVIDIA L4",
    healthy: bool = True,
    numa: int = 0,
    mig: tuple[str, ...] = (),
) -> Gpu:
    """GPU ``GPU-<index>``; with ``mig`` profiles it is in MIG mode with those instances."""
    instances = tuple(
        MigInstance(profile, f"MIG-{index}-{k}", 40192 if profile.startswith("3g") else 9728, 42)
        for k, profile in enumerate(mig)
    )
    return Gpu(
        uuid=f"GPU-{index}",
        index=index,
        model=model,
        memory_mib=memory,
        sm_count=58,
        compute_capability="8.9",
        numa_node=numa,
        healthy=healthy,
        mig_enabled=bool(mig),
        mig_instances=instances,
    )


def inventory(*gpus: Gpu, nvlink: Mapping[tuple[int, int], int] | None = None) -> GpuInventory:
    """The GPUs of ``NODE``, linked by ``nvlink`` ({(a, b): links}) and by ``system`` otherwise."""
    pairs = {frozenset(p): n for p, n in (nvlink or {}).items()}
    linked = []
    for g in gpus:
        links = tuple(
            GpuLink(p.index, LINK_NVLINK, pairs[key])
            if (key := frozenset((g.index, p.index))) in pairs
            else GpuLink(p.index, LINK_SYSTEM, 0)
            for p in gpus
            if p.index != g.index
        )
        linked.append(replace(g, links=links))
    return GpuInventory(NODE, tuple(linked))


def usage(
    inv: GpuInventory,
    used: Mapping[int, int] | None = None,
    heartbeat: datetime = NOW,
    missing: Iterable[int] = (),
) -> GpuUsage:
    """Samples for every GPU except ``missing``; ``used`` maps an index to measured MiB."""
    used = used or {}
    skip = set(missing)
    samples = tuple(
        GpuUsageSample(g.uuid, used.get(g.index, 0), 0) for g in inv.gpus if g.index not in skip
    )
    return GpuUsage(inv.node, heartbeat, samples)


def node_of(
    inv: GpuInventory,
    assignments: Iterable[PodAssignment] = (),
    used: Mapping[int, int] | None = None,
    **usage_args,
) -> NodeState:
    """The state of ``inv`` at ``NOW`` with fresh usage unless told otherwise."""
    return build_node_state(inv, usage(inv, used, **usage_args), assignments, NOW, STALE_AFTER)


def pod(*containers: ContainerGpuRequest, topology: str | None = None) -> PodGpuRequest:
    return PodGpuRequest(containers=containers, topology=topology)


def share(memory: int, cores: int = 100, name: str = "engine", init: bool = False):
    return ContainerGpuRequest(name, "share", gpus=1, memory_mib=memory, cores=cores, init=init)


def whole(count: int, name: str = "engine") -> ContainerGpuRequest:
    return ContainerGpuRequest(name, "whole", gpus=count)


def mig(profile: str, name: str = "engine") -> ContainerGpuRequest:
    return ContainerGpuRequest(name, "mig", mig_profile=profile)


def held_share(index: int, memory: int, cores: int, name: str = "other") -> PodAssignment:
    """A recorded pod holding a share of ``GPU-<index>``."""
    gpus = (AssignedGpu(f"GPU-{index}", memory, cores),)
    return PodAssignment(NODE, NOW, (ContainerAssignment(name, gpus=gpus, shared=True),))


def held_whole(*indices: int, memory: int = L4_MIB, name: str = "other") -> PodAssignment:
    """A recorded pod holding ``GPU-<index>`` whole for each index."""
    gpus = tuple(AssignedGpu(f"GPU-{i}", memory, 100) for i in indices)
    return PodAssignment(NODE, NOW, (ContainerAssignment(name, gpus=gpus),))


def held_mig(uuid: str, parent: int, profile: str = "3g.40gb") -> PodAssignment:
    """A recorded pod holding MIG instance ``uuid`` of ``GPU-<parent>``."""
    held = AssignedMig(uuid, profile, f"GPU-{parent}")
    return PodAssignment(NODE, NOW, (ContainerAssignment("other", mig=held),))


def node_set_of(nodes: list[NodeState]) -> tuple[NodeSet, list[str]]:
    """A node set holding each node under its name, and the names in order."""
    node_set = NodeSet()
    for node in nodes:
        node_set.put(node, node.name)
    return node_set, [n.name for n in nodes]


def scored_rows(node_set: NodeSet) -> list[int]:
    """The index rows the node set scores from now on, each time it scores them: what a
    kept or warmed score saves is what this never lists."""
    rows: list[int] = []
    index = node_set._index
    original = index.raw_scores
    index.raw_scores = lambda asked, *rest: rows.extend(asked.tolist()) or original(asked, *rest)
    return rows
