"""A DRA node's ResourceSlices, decoded into the inventory the placement core already reads.

A node in DRA mode publishes its GPUs as ResourceSlices of driver ``gpu.infergrid.io``
(names in ``infergrid.dra``). Here a node's slices become the ``GpuInventory`` the device
plugin's annotation gives, and its devices the map a claim's results are read against
(``infergrid.dra_ledger``), so filter, prioritize and preempt decide for DRA nodes with the
same core and policy. Pure, over resource.k8s.io/v1 JSON; every bad field is a
ContractError naming it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import UTC, datetime
from typing import Any, Final

from infergrid.assignment_annotation import AssignedMig
from infergrid.codec import each, expect, field, integer, join, unique
from infergrid.constants import LINK_NVLINK, MAX_VGPU_SLOTS_PER_GPU
from infergrid.dra import (
    ATTR_COMPUTE_CAPABILITY,
    ATTR_INDEX,
    ATTR_MIG_PROFILE,
    ATTR_MODEL,
    ATTR_NUMA_NODE,
    ATTR_NVLINK_CLIQUE,
    ATTR_PARENT_INDEX,
    ATTR_PARENT_UUID,
    ATTR_SM_COUNT,
    ATTR_TYPE,
    ATTR_UUID,
    CAP_MEMORY,
    DRIVER,
    TYPE_GPU,
    TYPE_MIG,
)
from infergrid.errors import ContractError
from infergrid.inventory import Gpu, GpuInventory, GpuLink, MigInstance
from infergrid.mig import MIG_PROFILE_NAME
from infergrid.pod_host import MIB
from infergrid.quantity import parse_whole_quantity
from infergrid.usage import GpuUsage, GpuUsageSample

EXCLUSIVE_TAINTS: Final = ("NoSchedule", "NoExecute")
"""A device tainted with one of these takes no new claim without a toleration: not offered."""
NEVER_STALE: Final = datetime(9999, 1, 1, tzinfo=UTC)
"""The heartbeat of a DRA node's usage. The kubelet withdraws a gone driver's slices, so
slices that are there vouch for their GPUs; nothing measures use beside the claims."""
_VERSION: Final = re.compile(r"([0-9]+)\.([0-9]+)\.[0-9]+")


@dataclass(frozen=True, slots=True)
class DraDevice:
    """A device of a node's slices as a claim result holds it: the GPU it is on, that GPU's
    memory, whether claims may share it (consumable capacity), or the MIG instance it is."""

    gpu_uuid: str
    memory_mib: int
    shareable: bool = False
    mig: AssignedMig | None = None


@dataclass(frozen=True, slots=True)
class SliceRecord:
    """One ResourceSlice of the driver, decoded; a slice with a ``problem`` offers nothing
    and makes its whole pool a problem."""

    name: str
    pool: str
    generation: int = 0
    slice_count: int = 1
    gpus: tuple[Gpu, ...] = ()
    migs: tuple[tuple[str, int, MigInstance], ...] = ()
    """(parent GPU uuid, parent index, instance) of each MIG device."""
    devices: Mapping[str, DraDevice] = dataclass_field(default_factory=dict)
    cliques: tuple[tuple[int, str], ...] = ()
    """(GPU index, NVLink clique) of each GPU that names one."""
    problem: str | None = None


# ResourceSlices.


def slice_record(obj: dict[str, Any]) -> SliceRecord:
    """The record of a ResourceSlice's JSON; a bad field becomes ``problem``, never an
    exception (only a slice without a name raises: it cannot be kept)."""
    name = field(field(obj, "metadata", dict), "name", str, "metadata")
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    pool = spec.get("pool") if isinstance(spec.get("pool"), dict) else {}
    pool_name = pool.get("name") if isinstance(pool.get("name"), str) else ""
    try:
        return decode_slice(obj)
    except ContractError as err:
        return SliceRecord(name, pool_name or str(spec.get("nodeName") or ""), problem=str(err))


def decode_slice(obj: dict[str, Any]) -> SliceRecord:
    """A ResourceSlice of the driver; ContractError names the first bad field."""
    meta = field(obj, "metadata", dict)
    spec = field(obj, "spec", dict)
    driver = field(spec, "driver", str, "spec")
    if driver != DRIVER:
        raise ContractError("spec.driver", f"{driver!r} is not {DRIVER!r}")
    pool = field(spec, "pool", dict, "spec")
    pool_name = field(pool, "name", str, "spec.pool")
    node = spec.get("nodeName")
    if node != pool_name:
        raise ContractError("spec.nodeName", f"must name the node, the pool {pool_name!r}")
    items = each(spec, "devices", dict, "spec", default=[])
    devices = [_device(d, p) for d, p in items]
    unique(((d[0], join(p, "name")) for d, (_, p) in zip(devices, items, strict=True)), "device")
    gpus = tuple(d[1] for d in devices if isinstance(d[1], Gpu))
    return SliceRecord(
        name=field(meta, "name", str, "metadata"),
        pool=pool_name,
        generation=integer(pool, "generation", "spec.pool", default=0),
        slice_count=integer(pool, "resourceSliceCount", "spec.pool", low=1, default=1),
        gpus=gpus,
        migs=tuple(d[1] for d in devices if isinstance(d[1], tuple)),
        devices={name: held for name, _, held, _ in devices},
        cliques=tuple((g.index, c) for (_, g, _, c) in devices if isinstance(g, Gpu) and c),
    )


def _device(obj: dict[str, Any], path: str) -> tuple[str, Any, DraDevice, str]:
    """(name, Gpu or (parent uuid, parent index, MigInstance), how a claim holds it, clique)."""
    name = field(obj, "name", str, path)
    attrs = field(obj, "attributes", dict, path, default={})
    apath = join(path, "attributes")
    kind = _attribute(attrs, ATTR_TYPE, "string", apath)
    memory = _capacity_mib(obj, path)
    healthy = not any(
        isinstance(t, dict) and t.get("effect") in EXCLUSIVE_TAINTS
        for t in field(obj, "taints", list, path, default=[])
    )
    uuid = _attribute(attrs, ATTR_UUID, "string", apath)
    if kind == TYPE_MIG:
        parent = _attribute(attrs, ATTR_PARENT_UUID, "string", apath)
        profile = _attribute(attrs, ATTR_MIG_PROFILE, "string", apath)
        if not MIG_PROFILE_NAME.fullmatch(profile):
            raise ContractError(join(apath, ATTR_MIG_PROFILE), f"{profile!r} is not like 1g.10gb")
        sm = _attribute(attrs, ATTR_SM_COUNT, "int", apath, default=0)
        instance = MigInstance(profile, uuid, memory, _non_negative(sm, apath, ATTR_SM_COUNT))
        index = _non_negative(
            _attribute(attrs, ATTR_PARENT_INDEX, "int", apath), apath, ATTR_PARENT_INDEX
        )
        return (
            name,
            (parent, index, instance),
            DraDevice(parent, memory, False, AssignedMig(uuid, profile, parent)),
            "",
        )
    if kind != TYPE_GPU:
        raise ContractError(join(apath, ATTR_TYPE), f"{kind!r} is not {TYPE_GPU} or {TYPE_MIG}")
    gpu = Gpu(
        uuid=uuid,
        index=_non_negative(_attribute(attrs, ATTR_INDEX, "int", apath), apath, ATTR_INDEX),
        model=_attribute(attrs, ATTR_MODEL, "string", apath),
        memory_mib=memory,
        sm_count=_non_negative(
            _attribute(attrs, ATTR_SM_COUNT, "int", apath), apath, ATTR_SM_COUNT
        ),
        compute_capability=_compute_capability(attrs, apath),
        numa_node=_numa(attrs, apath),
        healthy=healthy,
    )
    shareable = field(obj, "allowMultipleAllocations", bool, path, default=False)
    clique = _attribute(attrs, ATTR_NVLINK_CLIQUE, "string", apath, default="")
    return name, gpu, DraDevice(uuid, memory, shareable), clique


_MISSING: Final = object()


def _attribute(
    attrs: dict[str, Any], name: str, kind: str, path: str, default: Any = _MISSING
) -> Any:
    """An attribute by its short or its driver-qualified name, of one value kind
    (``int``, ``string``, ``version``, ``bool``)."""
    qualified = f"{DRIVER}/{name}"
    key = name if name in attrs else qualified if qualified in attrs else None
    if key is None:
        if default is _MISSING:
            raise ContractError(join(path, name), "is required")
        return default
    value = expect(attrs[key], dict, join(path, key))
    if set(value) != {kind}:
        raise ContractError(join(path, key), f"must hold exactly one value, {kind}")
    return expect(
        value[kind],
        int if kind == "int" else bool if kind == "bool" else str,
        join(join(path, key), kind),
    )


def _non_negative(value: int, path: str, name: str) -> int:
    if value < 0:
        raise ContractError(join(path, name), f"must be at least 0, got {value}")
    return value


def _numa(attrs: dict[str, Any], path: str) -> int:
    numa = _attribute(attrs, ATTR_NUMA_NODE, "int", path)
    if numa < -1:
        raise ContractError(join(path, ATTR_NUMA_NODE), f"must be -1 or more, got {numa}")
    return numa


def _compute_capability(attrs: dict[str, Any], path: str) -> str:
    """The version attribute ``8.0.0`` as the inventory's ``8.0``."""
    value = _attribute(attrs, ATTR_COMPUTE_CAPABILITY, "version", path)
    found = _VERSION.fullmatch(value)
    if found is None:
        raise ContractError(join(path, ATTR_COMPUTE_CAPABILITY), f"{value!r} is not like '8.0.0'")
    return f"{int(found[1])}.{int(found[2])}"


def _capacity_mib(obj: dict[str, Any], path: str) -> int:
    """The device's ``memory`` capacity in MiB, rounded down: never more than it has."""
    capacity = field(obj, "capacity", dict, path)
    cpath = join(path, "capacity")
    key = CAP_MEMORY if CAP_MEMORY in capacity else f"{DRIVER}/{CAP_MEMORY}"
    entry = field(capacity, key, dict, cpath)
    memory = parse_whole_quantity(entry.get("value"), join(join(cpath, key), "value")) // MIB
    if memory < 1:
        raise ContractError(join(join(cpath, key), "value"), "must be at least 1Mi")
    return memory


def pool_inventory(
    node: str, slices: Iterable[SliceRecord]
) -> tuple[GpuInventory, dict[str, DraDevice]]:
    """The inventory of ``node``'s pool (its slices of the newest generation, all of them
    there), and its devices by name; ContractError where the pool is incomplete or bad.

    Its GPUs take shares (as many as the memory allows) only where every one allows multiple
    allocations (``DRAConsumableCapacity`` on): the driver publishes them all alike, and a
    share placed on a GPU that takes one claim could not be allocated."""
    pool = [s for s in slices if s.pool == node]
    if not pool:
        raise ContractError("resourceslices", f"node {node!r} has no slice of {DRIVER}")
    newest = max(s.generation for s in pool)
    pool = sorted((s for s in pool if s.generation == newest), key=lambda s: s.name)
    for bad in (s for s in pool if s.problem):
        raise ContractError(f"resourceslices[{bad.name}]", bad.problem or "")
    counts = {s.slice_count for s in pool}
    if len(counts) != 1 or len(pool) != counts.pop():
        raise ContractError("resourceslices", f"pool {node!r} generation {newest} is incomplete")
    devices: dict[str, DraDevice] = {}
    for one in pool:
        for name, device in one.devices.items():
            if name in devices:
                raise ContractError(f"resourceslices[{one.name}]", f"device {name!r} twice")
            devices[name] = device
    listed = [g for s in pool for g in s.gpus]
    unique(((g.index, f"resourceslices[{node}]") for g in listed), "GPU index")
    unique(((g.uuid, f"resourceslices[{node}]") for g in listed), "GPU uuid")
    gpus = _with_migs(listed, [m for s in pool for m in s.migs])
    links = _nvlinks([c for s in pool for c in s.cliques])
    gpus = [g if g.index not in links else _linked(g, links[g.index]) for g in gpus]
    whole_devices = [d for d in devices.values() if d.mig is None]
    shares = all(d.shareable for d in whole_devices) and bool(whole_devices)
    slots = MAX_VGPU_SLOTS_PER_GPU if shares else 0
    return GpuInventory(node, tuple(gpus), share_slots=slots), devices


def _with_migs(gpus: list[Gpu], migs: list[tuple[str, int, MigInstance]]) -> list[Gpu]:
    """The GPUs with their MIG instances; a parent the slices do not list as a device is
    made from its instances (model unknown), so their memory still counts."""
    by_uuid = {g.uuid: g for g in gpus}
    grouped: dict[str, list[MigInstance]] = {}
    index: dict[str, int] = {}
    for parent, at, instance in migs:
        grouped.setdefault(parent, []).append(instance)
        index[parent] = at
    for parent, instances in grouped.items():
        gpu = by_uuid.get(parent) or Gpu(
            parent, index[parent], "", sum(m.memory_mib for m in instances), 0, "", -1, True
        )
        if gpu.index != index[parent]:
            raise ContractError(
                f"MIG instances of {parent}",
                f"parentIndex {index[parent]} is not the GPU's index {gpu.index}",
            )
        by_uuid[parent] = Gpu(
            **{**_fields(gpu), "mig_enabled": True, "mig_instances": tuple(instances)}
        )
    return sorted(by_uuid.values(), key=lambda g: g.index)


def _fields(gpu: Gpu) -> dict[str, Any]:
    return {name: getattr(gpu, name) for name in Gpu.__slots__}


def _nvlinks(cliques: list[tuple[int, str]]) -> dict[int, tuple[int, ...]]:
    """Each GPU's peers: the other GPUs of its NVLink clique."""
    members: dict[str, list[int]] = {}
    for index, clique in cliques:
        members.setdefault(clique, []).append(index)
    return {i: tuple(p for p in group if p != i) for group in members.values() for i in group}


def _linked(gpu: Gpu, peers: tuple[int, ...]) -> Gpu:
    links = tuple(GpuLink(p, LINK_NVLINK, 1) for p in sorted(peers))
    return Gpu(**{**_fields(gpu), "links": links})


def idle_usage(inventory: GpuInventory) -> GpuUsage:
    """What a DRA node's GPUs use beside their claims: nothing measured, never stale."""
    return GpuUsage(
        inventory.node, NEVER_STALE, tuple(GpuUsageSample(g.uuid, 0, 0) for g in inventory.gpus)
    )
