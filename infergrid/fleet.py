"""The fleet file: a YAML description of fake GPU nodes.

One file feeds both the local cluster's KWOK nodes and the device plugin's fake
NVML, so both see the same GPUs. Everything not written in the file is derived
deterministically (UUIDs, links, NUMA nodes), and a typo in a key is an error,
never silently ignored. A node's ``xidEvents`` and ``eccEvents`` schedule GPU
faults that its fake NVML reports, so the device plugin's health handling runs
end to end. Fake GPUs have ECC on, with every count at 0.
"""

import math
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from infergrid.codec import (
    check_version,
    each,
    expect,
    field,
    integer,
    join,
    reject_unknown,
    unique,
)
from infergrid.constants import (
    DEFAULT_VGPU_SLOTS_PER_GPU,
    LINK_NUMA,
    LINK_NVLINK,
    LINK_PCIE_SWITCH,
    LINK_SYSTEM,
    MAX_TIME_SLICES_PER_GPU,
    MAX_VGPU_SLOTS_PER_GPU,
)
from infergrid.errors import ContractError
from infergrid.inventory import (
    ECC_FIELDS,
    EccState,
    Gpu,
    GpuInventory,
    GpuLink,
    MigInstance,
    compute_capability,
    decode_ecc,
)
from infergrid.mig import MIG_SLICES, MigProfile, mig_profile
from infergrid.yamlfile import read_yaml

_NODE_KEYS: Final = (
    "name",
    "count",
    "cpu",
    "memory",
    "vgpuSlotsPerGpu",
    "timeSlices",
    "heldBusyPercent",
    "gpus",
    "topology",
    "mig",
    "unhealthy",
    "kubelet",
    "xidEvents",
    "eccEvents",
)
_XID_EVENT_KEYS: Final = ("gpu", "xid", "afterSeconds")
_ECC_EVENT_KEYS: Final = ("gpu", "afterSeconds", *(key for key, _, _ in ECC_FIELDS))
_GPU_KEYS: Final = ("model", "count", "memoryMiB", "smCount", "computeCapability")
_TOPOLOGY_KEYS: Final = ("nvlink", "nvlinkCount", "gpusPerSwitch", "numaNodes")
_NVLINK_MODES: Final = ("all", "pairs", "none")
KUBELET_KWOK: Final = "kwok"
KUBELET_REAL: Final = "real"
_KUBELETS: Final = (KUBELET_KWOK, KUBELET_REAL)
_NODE_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUANTITY: Final = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_GPU_INDEX: Final = re.compile(r"[0-9]+")
_UUID_NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_DNS, "infergrid.io")
FAKE_ECC: Final = EccState(0, 0, 0, False, 0, False, False)
"""The ECC record every fake GPU starts with: ECC on, nothing wrong, every value supported."""


@dataclass(frozen=True, slots=True)
class ScheduledXid:
    """An XID the fake NVML reports on GPU ``gpu``, ``after_s`` seconds after it starts.

    How tests and the local cluster show the device plugin a GPU fault without a GPU.
    """

    gpu: int
    xid: int
    after_s: float


@dataclass(frozen=True, slots=True)
class ScheduledEcc:
    """ECC values the fake NVML reports on GPU ``gpu`` from ``after_s`` seconds after it starts.

    ``values`` holds what the event sets; a None field keeps what the GPU had.
    """

    gpu: int
    after_s: float
    values: EccState


@dataclass(frozen=True, slots=True)
class FleetNode:
    """One node: its Kubernetes capacity and the GPUs its fake NVML reports.

    A KWOK node only pretends to run pods; a real node runs a kubelet with containerd on this
    machine, whose CPU and memory are the machine's own (`cpu` and `memory` do not apply).
    """

    name: str
    cpu: str
    memory: str
    inventory: GpuInventory
    real: bool = False
    xid_events: tuple[ScheduledXid, ...] = ()
    ecc_events: tuple[ScheduledEcc, ...] = ()
    # How busy the pods holding its GPUs keep them, in percent of what each holds: its fake
    # NVML's utilisation then follows who holds what (0: the GPUs stay idle, as tests set).
    held_busy_percent: int = 0

    @property
    def vgpu_slots_per_gpu(self) -> int:
        return self.inventory.share_slots

    @property
    def time_slices(self) -> int:
        """The device plugin's ``gpuReplicas`` on this node: pods that may share one GPU."""
        return self.inventory.time_slices


@dataclass(frozen=True, slots=True)
class Fleet:
    """Every node of a fleet file, with node groups expanded."""

    nodes: tuple[FleetNode, ...]


@dataclass(frozen=True, slots=True)
class _GpuModel:
    model: str
    count: int
    memory_mib: int
    sm_count: int
    compute_capability: str


@dataclass(frozen=True, slots=True)
class _Topology:
    """How the GPUs of a node are wired; GPUs are split over NUMA nodes in index order."""

    nvlink: str
    nvlink_count: int
    gpus_per_switch: int
    numa_nodes: int

    def numa_node(self, index: int, gpu_count: int) -> int:
        return index * self.numa_nodes // gpu_count

    def link(self, index: int, peer: int, gpu_count: int) -> GpuLink:
        """The closest connection between two GPUs."""
        if self.nvlink == "all" or (self.nvlink == "pairs" and index // 2 == peer // 2):
            return GpuLink(peer, LINK_NVLINK, self.nvlink_count)
        if index // self.gpus_per_switch == peer // self.gpus_per_switch:
            return GpuLink(peer, LINK_PCIE_SWITCH)
        if self.numa_node(index, gpu_count) == self.numa_node(peer, gpu_count):
            return GpuLink(peer, LINK_NUMA)
        return GpuLink(peer, LINK_SYSTEM)


def load_fleet(path: str | Path) -> Fleet:
    """The fleet described by the YAML file at ``path``."""
    return parse_fleet(read_yaml(path), str(path))


def parse_fleet(data: object, source: str) -> Fleet:
    """The fleet in a parsed YAML document; errors name the field and the ``source`` file."""
    try:
        return _parse(data)
    except ContractError as error:
        raise ContractError(error.field, f"{error.reason} (in {source})") from None


def _parse(data: object) -> Fleet:
    doc = expect(data, dict, "fleet")
    reject_unknown(doc, ("version", "nodes"))
    check_version(doc)
    nodes = [(node, path) for obj, path in each(doc, "nodes", dict) for node in _nodes(obj, path)]
    if not nodes:
        raise ContractError("nodes", "a fleet needs at least one node")
    unique(((node.name, join(path, "name")) for node, path in nodes), "node name")
    return Fleet(tuple(node for node, _ in nodes))


def _nodes(obj: dict[str, Any], path: str) -> list[FleetNode]:
    """The nodes of one entry: ``name`` alone, or ``name-0`` … when ``count`` is above 1."""
    reject_unknown(obj, _NODE_KEYS, path)
    name = field(obj, "name", str, path)
    if not _NODE_NAME.fullmatch(name):
        raise ContractError(join(path, "name"), f"{name!r} is not a valid node name")
    count = integer(obj, "count", path, low=1, default=1)
    real = _kubelet(obj, path) == KUBELET_REAL
    cpu = _quantity(obj, "cpu", path, "32")
    memory = _quantity(obj, "memory", path, "256Gi")
    slots = integer(
        obj, "vgpuSlotsPerGpu", path, 1, MAX_VGPU_SLOTS_PER_GPU, default=DEFAULT_VGPU_SLOTS_PER_GPU
    )
    time_slices = integer(obj, "timeSlices", path, 1, MAX_TIME_SLICES_PER_GPU, default=1)
    busy = integer(obj, "heldBusyPercent", path, 0, 100, default=0)
    gpus = _gpu_model(field(obj, "gpus", dict, path), join(path, "gpus"))
    topology = _topology(field(obj, "topology", dict, path, default={}), join(path, "topology"))
    mig = _mig(field(obj, "mig", dict, path, default={}), join(path, "mig"), gpus)
    unhealthy = {
        _gpu_index(i, p, gpus) for i, p in each(obj, "unhealthy", object, path, default=[])
    }
    xids = tuple(_xid_event(e, p, gpus) for e, p in each(obj, "xidEvents", dict, path, default=[]))
    eccs = tuple(_ecc_event(e, p, gpus) for e, p in each(obj, "eccEvents", dict, path, default=[]))
    names = [name] if count == 1 else [f"{name}-{i}" for i in range(count)]
    return [
        FleetNode(
            n,
            cpu,
            memory,
            _inventory(n, gpus, topology, mig, unhealthy, slots, time_slices),
            real,
            xids,
            eccs,
            busy,
        )
        for n in names
    ]


def _kubelet(obj: dict[str, Any], path: str) -> str:
    """Which kubelet runs the node; a real one reports the machine's own CPU and memory."""
    kubelet = field(obj, "kubelet", str, path, default=KUBELET_KWOK)
    if kubelet not in _KUBELETS:
        raise ContractError(
            join(path, "kubelet"), f"{kubelet!r} is not one of {', '.join(_KUBELETS)}"
        )
    if kubelet == KUBELET_REAL:
        for key in ("cpu", "memory"):
            if key in obj:
                raise ContractError(
                    join(path, key), "a real node reports the machine's own; leave it out"
                )
    return kubelet


def _quantity(obj: dict[str, Any], key: str, path: str, default: str) -> str:
    value = field(obj, key, str, path, default=default)
    if not _QUANTITY.fullmatch(value):
        raise ContractError(
            join(path, key), f"{value!r} is not a Kubernetes quantity like 32 or 256Gi"
        )
    return value


def _gpu_model(obj: dict[str, Any], path: str) -> _GpuModel:
    reject_unknown(obj, _GPU_KEYS, path)
    return _GpuModel(
        model=field(obj, "model", str, path),
        count=integer(obj, "count", path, low=1),
        memory_mib=integer(obj, "memoryMiB", path, low=1),
        sm_count=integer(obj, "smCount", path, low=1),
        compute_capability=compute_capability(obj, path),
    )


def _topology(obj: dict[str, Any], path: str) -> _Topology:
    reject_unknown(obj, _TOPOLOGY_KEYS, path)
    nvlink = field(obj, "nvlink", str, path, default="none")
    if nvlink not in _NVLINK_MODES:
        raise ContractError(
            join(path, "nvlink"), f"{nvlink!r} is not one of {', '.join(_NVLINK_MODES)}"
        )
    return _Topology(
        nvlink=nvlink,
        nvlink_count=integer(obj, "nvlinkCount", path, low=1, default=12),
        gpus_per_switch=integer(obj, "gpusPerSwitch", path, low=1, default=2),
        numa_nodes=integer(obj, "numaNodes", path, low=1, default=1),
    )


def _gpu_index(raw: object, path: str, gpus: _GpuModel) -> int:
    """A GPU index given as a number or, as a YAML key, a string of digits."""
    text = str(raw) if type(raw) is int else raw
    if not isinstance(text, str) or not _GPU_INDEX.fullmatch(text):
        raise ContractError(path, f"{raw!r} is not a GPU index")
    if int(text) >= gpus.count:
        raise ContractError(path, f"no GPU {text}; the node has GPUs 0 to {gpus.count - 1}")
    return int(text)


def _xid_event(obj: dict[str, Any], path: str, gpus: _GpuModel) -> ScheduledXid:
    """One ``xidEvents`` entry: ``{gpu: 0, xid: 48, afterSeconds: 5}``."""
    reject_unknown(obj, _XID_EVENT_KEYS, path)
    return ScheduledXid(
        gpu=_event_gpu(obj, path, gpus),
        xid=integer(obj, "xid", path, low=1),
        after_s=_seconds(obj, "afterSeconds", path),
    )


def _ecc_event(obj: dict[str, Any], path: str, gpus: _GpuModel) -> ScheduledEcc:
    """One ``eccEvents`` entry: ``{gpu: 0, afterSeconds: 5, volatileDoubleBit: 1}``."""
    reject_unknown(obj, _ECC_EVENT_KEYS, path)
    gpu, after_s = _event_gpu(obj, path, gpus), _seconds(obj, "afterSeconds", path)
    values = decode_ecc(obj, path)
    if values == EccState():
        keys = ", ".join(key for key, _, _ in ECC_FIELDS)
        raise ContractError(path, f"sets no ECC value; give at least one of {keys}")
    return ScheduledEcc(gpu, after_s, values)


def _event_gpu(obj: dict[str, Any], path: str, gpus: _GpuModel) -> int:
    """The ``gpu`` of a scheduled event: the index of one of the node's GPUs."""
    return _gpu_index(field(obj, "gpu", int, path), join(path, "gpu"), gpus)


def _seconds(obj: dict[str, Any], key: str, path: str) -> float:
    """A finite number of seconds, 0 or more; YAML writes 5 and 0.5 alike."""
    if obj.get(key) is None:
        raise ContractError(join(path, key), "is required")
    value = obj[key]
    if type(value) not in (int, float) or not 0 <= value < math.inf:
        raise ContractError(join(path, key), f"{value!r} is not a number of seconds, 0 or more")
    return float(value)


def _mig(obj: dict[Any, Any], path: str, gpus: _GpuModel) -> dict[int, tuple[MigProfile, ...]]:
    """MIG instances per GPU index; a GPU listed here is in MIG mode, even with no instances."""
    chosen: dict[int, tuple[MigProfile, ...]] = {}
    for key, names in obj.items():
        where = join(path, str(key))
        index = _gpu_index(key, where, gpus)
        if index in chosen:
            raise ContractError(where, f"GPU {index} is listed twice")
        chosen[index] = _mig_profiles(expect(names, list, where), where, gpus)
    return chosen


def _mig_profiles(names: list[Any], path: str, gpus: _GpuModel) -> tuple[MigProfile, ...]:
    profiles = tuple(
        mig_profile(gpus.model, gpus.memory_mib, expect(name, str, join(path, n)), join(path, n))
        for n, name in enumerate(names)
    )
    slices = sum(p.slices for p in profiles)
    if slices > MIG_SLICES:
        raise ContractError(path, f"profiles use {slices} compute slices; a GPU has {MIG_SLICES}")
    memory = sum(p.memory_mib for p in profiles)
    if memory > gpus.memory_mib:
        raise ContractError(path, f"profiles need {memory} MiB; the GPU has {gpus.memory_mib}")
    return profiles


def _inventory(
    node: str,
    gpus: _GpuModel,
    topology: _Topology,
    mig: dict[int, tuple[MigProfile, ...]],
    unhealthy: set[int],
    share_slots: int,
    time_slices: int,
) -> GpuInventory:
    return GpuInventory(
        node,
        tuple(
            _gpu(node, i, gpus, topology, mig.get(i), i not in unhealthy) for i in range(gpus.count)
        ),
        share_slots,
        time_slices,
    )


def _gpu(
    node: str,
    index: int,
    gpus: _GpuModel,
    topology: _Topology,
    mig: tuple[MigProfile, ...] | None,
    healthy: bool,
) -> Gpu:
    instances = tuple(
        MigInstance(p.name, _uuid("MIG", node, index, n), p.memory_mib, p.sm_count(gpus.sm_count))
        for n, p in enumerate(mig or ())
    )
    return Gpu(
        uuid=_uuid("GPU", node, index),
        index=index,
        model=gpus.model,
        memory_mib=gpus.memory_mib,
        sm_count=gpus.sm_count,
        compute_capability=gpus.compute_capability,
        numa_node=topology.numa_node(index, gpus.count),
        healthy=healthy,
        mig_enabled=mig is not None,
        mig_instances=instances,
        links=tuple(
            topology.link(index, peer, gpus.count) for peer in range(gpus.count) if peer != index
        ),
        ecc=FAKE_ECC,
    )


def _uuid(prefix: str, *parts: object) -> str:
    """A stable UUID, so every reader of the fleet file sees the same GPUs."""
    return f"{prefix}-{uuid.uuid5(_UUID_NAMESPACE, '/'.join(map(str, parts)))}"
