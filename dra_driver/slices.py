"""A node's GPUs as ResourceSlices of resource.k8s.io/v1: pure over plain data.

One device per GPU (``gpu-<index>``), or, for a GPU in MIG mode, one per MIG instance
(``mig-<gpu>-<n>``) and never the GPU itself. Two alpha gates shape the devices:

- ``DRAConsumableCapacity``: a GPU allows multiple allocations and offers ``memory`` (default
  all of it, so a claim that asks nothing holds the GPU whole) and ``cores`` (percent, default
  0) as consumable capacity; without it a GPU is allocated whole and has no ``cores``.
- ``DRAPartitionableDevices``: each MIG GPU has a counter set of its 7 compute slices and its
  memory, and each instance consumes from it. The API forbids counters and devices in one
  slice, so the counter sets get slices of their own.

The same table, ``node_devices``, tells the prepare step what each published name is.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from infergrid import dra
from infergrid.constants import LINK_NVLINK
from infergrid.inventory import Gpu, MigInstance
from infergrid.mig import MIG_SLICES

API_VERSION: Final = "resource.k8s.io/v1"
GATE_CONSUMABLE_CAPACITY: Final = "DRAConsumableCapacity"
GATE_PARTITIONABLE_DEVICES: Final = "DRAPartitionableDevices"

MAX_DEVICES: Final = 128
MAX_DEVICES_CONSUMING_COUNTERS: Final = 64
MAX_COUNTER_SETS: Final = 8
"""Per-slice limits of resource.k8s.io/v1 (ResourceSliceMaxDevices and its siblings)."""
MAX_ATTRIBUTE_CHARS: Final = 64
MAX_NAME_CHARS: Final = 253
MIN_MEMORY_REQUEST: Final = "1Mi"
"""A share's memory is whole MiB: the smallest request and the step between requests."""

_SLICES_OF_PROFILE: Final = re.compile(r"([1-7])g\.")


@dataclass(frozen=True, slots=True)
class Features:
    """Which gated fields to publish; the publisher turns one off when the API drops it."""

    consumable_capacity: bool = True
    partitionable_devices: bool = True


@dataclass(frozen=True, slots=True)
class NodeDevice:
    """A published device as prepare needs it: what the container is shown and given."""

    name: str
    uuid: str
    memory_mib: int
    mig: bool
    parent_uuid: str


def node_devices(gpus: Iterable[Gpu]) -> dict[str, NodeDevice]:
    """Every device this node publishes, by name: healthy GPUs whole, MIG GPUs as instances."""
    devices: dict[str, NodeDevice] = {}
    for gpu in gpus:
        if not gpu.healthy:
            continue
        if not gpu.mig_enabled:
            name = dra.gpu_device(gpu.index)
            devices[name] = NodeDevice(name, gpu.uuid, gpu.memory_mib, False, gpu.uuid)
            continue
        for n, instance in enumerate(gpu.mig_instances):
            name = dra.mig_device(gpu.index, n)
            devices[name] = NodeDevice(name, instance.uuid, instance.memory_mib, True, gpu.uuid)
    return devices


def nvlink_cliques(gpus: Sequence[Gpu]) -> dict[int, str]:
    """GPU index -> clique id: GPUs joined by NVLink, directly or through each other, share
    one, the UUID of their lowest-indexed GPU (unique across nodes, within the 64 characters
    an attribute may hold). A GPU without NVLink is a clique of its own."""
    parent = {gpu.index: gpu.index for gpu in gpus}

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    for gpu in gpus:
        for link in gpu.links:
            if link.type == LINK_NVLINK and link.peer_index in parent:
                low, high = sorted((root(gpu.index), root(link.peer_index)))
                parent[high] = low
    uuids = {gpu.index: gpu.uuid for gpu in gpus}
    return {index: uuids[root(index)] for index in parent}


def build_slices(
    node: str, gpus: Sequence[Gpu], features: Features, generation: int, owner: dict | None = None
) -> list[dict[str, Any]]:
    """The node's pool at ``generation``: counter-set slices first, then device slices.

    ``owner`` is the ownerReference (the Node) each slice carries, so slices go with the node.
    A node without GPUs still publishes one empty slice: the pool says "none here".
    """
    cliques = nvlink_cliques(gpus)
    healthy = [gpu for gpu in gpus if gpu.healthy]
    partitioned = features.partitionable_devices
    devices = [d for gpu in healthy for d in _devices(gpu, cliques[gpu.index], features)]
    counter_sets = [_counter_set(gpu) for gpu in healthy if partitioned and _has_mig(gpu)]
    per_slice = MAX_DEVICES_CONSUMING_COUNTERS if counter_sets else MAX_DEVICES
    specs = [{"sharedCounters": chunk} for chunk in _chunks(counter_sets, MAX_COUNTER_SETS)]
    specs += [{"devices": chunk} for chunk in _chunks(devices, per_slice)]
    if not specs:
        specs = [{"devices": []}]
    return [_slice(node, n, len(specs), generation, spec, owner) for n, spec in enumerate(specs)]


def slice_name(node: str, n: int) -> str:
    """``<node>-gpu.infergrid.io-<n>``; a node name too long for that is cut and hashed."""
    suffix = f"-{dra.DRIVER}-{n}"
    if len(node) + len(suffix) <= MAX_NAME_CHARS:
        return node + suffix
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    keep = MAX_NAME_CHARS - len(suffix) - len(digest) - 1
    return f"{node[:keep].rstrip('.-')}-{digest}{suffix}"


def _slice(
    node: str, n: int, count: int, generation: int, spec: dict, owner: dict | None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": slice_name(node, n)}
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": dra.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            **spec,
        },
    }


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _has_mig(gpu: Gpu) -> bool:
    return gpu.mig_enabled and bool(gpu.mig_instances)


def _devices(gpu: Gpu, clique: str, features: Features) -> list[dict[str, Any]]:
    if not gpu.mig_enabled:
        return [_gpu_device(gpu, clique, features.consumable_capacity)]
    return [
        _mig_device(gpu, n, instance, clique, features.partitionable_devices)
        for n, instance in enumerate(gpu.mig_instances)
    ]


def _common_attributes(gpu: Gpu, clique: str) -> dict[str, dict]:
    return {
        dra.ATTR_MODEL: _string(gpu.model),
        dra.ATTR_COMPUTE_CAPABILITY: {"version": _version(gpu.compute_capability)},
        dra.ATTR_NUMA_NODE: {"int": gpu.numa_node},
        dra.ATTR_NVLINK_CLIQUE: _string(clique),
    }


def _gpu_device(gpu: Gpu, clique: str, consumable: bool) -> dict[str, Any]:
    memory = _mib(gpu.memory_mib)
    device: dict[str, Any] = {
        "name": dra.gpu_device(gpu.index),
        "attributes": {
            dra.ATTR_TYPE: _string(dra.TYPE_GPU),
            dra.ATTR_UUID: _string(gpu.uuid),
            dra.ATTR_INDEX: {"int": gpu.index},
            dra.ATTR_SM_COUNT: {"int": gpu.sm_count},
            **_common_attributes(gpu, clique),
        },
        "capacity": {dra.CAP_MEMORY: {"value": memory}},
    }
    if consumable:
        device["allowMultipleAllocations"] = True
        device["capacity"] = {
            dra.CAP_MEMORY: {
                "value": memory,
                "requestPolicy": {
                    "default": memory,
                    "validRange": {"min": MIN_MEMORY_REQUEST, "step": MIN_MEMORY_REQUEST},
                },
            },
            dra.CAP_CORES: {
                "value": "100",
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": "100", "step": "1"},
                },
            },
        }
    return device


def _mig_device(
    gpu: Gpu, n: int, instance: MigInstance, clique: str, partitioned: bool
) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": dra.mig_device(gpu.index, n),
        "attributes": {
            dra.ATTR_TYPE: _string(dra.TYPE_MIG),
            dra.ATTR_UUID: _string(instance.uuid),
            dra.ATTR_SM_COUNT: {"int": instance.sm_count},
            dra.ATTR_MIG_PROFILE: _string(instance.profile),
            dra.ATTR_PARENT_UUID: _string(gpu.uuid),
            dra.ATTR_PARENT_INDEX: {"int": gpu.index},
            **_common_attributes(gpu, clique),
        },
        "capacity": {dra.CAP_MEMORY: {"value": _mib(instance.memory_mib)}},
    }
    if partitioned:
        counters = {dra.COUNTER_MEMORY: {"value": _mib(instance.memory_mib)}}
        slices = profile_slices(instance.profile)
        if slices is not None:
            counters[dra.COUNTER_MIG_SLICES] = {"value": str(slices)}
        device["consumesCounters"] = [
            {"counterSet": dra.counter_set(gpu.index), "counters": counters}
        ]
    return device


def _counter_set(gpu: Gpu) -> dict[str, Any]:
    """The MIG GPU's slices and memory. The instances exist already and all must fit at once,
    so a table that sizes them a little over the GPU raises the counters rather than hiding
    an instance."""
    slices = sum(profile_slices(i.profile) or 0 for i in gpu.mig_instances)
    memory = sum(i.memory_mib for i in gpu.mig_instances)
    return {
        "name": dra.counter_set(gpu.index),
        "counters": {
            dra.COUNTER_MIG_SLICES: {"value": str(max(MIG_SLICES, slices))},
            dra.COUNTER_MEMORY: {"value": _mib(max(gpu.memory_mib, memory))},
        },
    }


def profile_slices(profile: str) -> int | None:
    """Compute slices of a MIG profile name (``3g.40gb`` -> 3); None for a name not read."""
    match = _SLICES_OF_PROFILE.match(profile)
    return int(match.group(1)) if match else None


def _mib(mib: int) -> str:
    return f"{mib}Mi"


def _string(value: str) -> dict[str, str]:
    return {"string": value[:MAX_ATTRIBUTE_CHARS]}


def _version(compute_capability: str) -> str:
    """``8.0`` as the semantic version the API's version attributes take, ``8.0.0``."""
    parts = (compute_capability.split(".") + ["0", "0"])[:3]
    return ".".join(str(int(p)) if p.isdigit() else "0" for p in parts)


def dropped_gates(sent: Sequence[dict], stored: Sequence[dict]) -> set[str]:
    """The gates that are off, seen in what the API server kept of what was sent: it drops
    the fields of a disabled gate silently. ``sent`` and ``stored`` are slices by position."""
    off: set[str] = set()
    for wrote, kept in zip(sent, stored, strict=True):
        wrote_spec, kept_spec = wrote["spec"], kept.get("spec") or {}
        if wrote_spec.get("sharedCounters") and not kept_spec.get("sharedCounters"):
            off.add(GATE_PARTITIONABLE_DEVICES)
        kept_devices = {d.get("name"): d for d in kept_spec.get("devices") or []}
        for device in wrote_spec.get("devices") or []:
            back = kept_devices.get(device["name"], {})
            if device.get("allowMultipleAllocations") and not back.get("allowMultipleAllocations"):
                off.add(GATE_CONSUMABLE_CAPACITY)
            if device.get("consumesCounters") and not back.get("consumesCounters"):
                off.add(GATE_PARTITIONABLE_DEVICES)
    return off


def without(features: Features, gates: set[str]) -> Features:
    """``features`` with the named gates' fields turned off."""
    return Features(
        consumable_capacity=features.consumable_capacity and GATE_CONSUMABLE_CAPACITY not in gates,
        partitionable_devices=features.partitionable_devices
        and GATE_PARTITIONABLE_DEVICES not in gates,
    )
