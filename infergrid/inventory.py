"""A node's GPUs, as the device plugin publishes them in ``infergrid.io/gpu-inventory``.

The extender places pods from this annotation alone, so a restarted extender
rebuilds everything it knows from it; the same inventory gives the node's labels
and the extended-resource capacity the device plugin advertises.
"""

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

from infergrid.codec import (
    dump_document,
    each,
    field,
    integer,
    join,
    load_document,
    unique,
)
from infergrid.constants import (
    ANNOTATION_GPU_INVENTORY,
    DEFAULT_VGPU_SLOTS_PER_GPU,
    LABEL_GPU_COMPUTE_CAPABILITY,
    LABEL_GPU_COMPUTE_LEVEL,
    LABEL_GPU_COUNT,
    LABEL_GPU_MEMORY,
    LABEL_GPU_MIXED,
    LABEL_GPU_MODEL,
    LABEL_GPU_PRODUCT,
    LABEL_MIG_CAPABLE,
    LINK_NVLINK,
    LINK_TYPES,
    MAX_TIME_SLICES_PER_GPU,
    MAX_VGPU_SLOTS_PER_GPU,
    RESOURCE_GPU,
    RESOURCE_VGPU,
    mig_resource,
)
from infergrid.errors import ContractError
from infergrid.gpu_models import compute_level, label_value, short_name
from infergrid.mig import find_family

_COMPUTE_CAPABILITY: Final = re.compile(r"[0-9]+\.[0-9]+")


@dataclass(frozen=True, slots=True)
class GpuLink:
    """How a GPU reaches one peer; ``count`` is the number of NVLinks, 0 for other types."""

    peer_index: int
    type: str
    count: int = 0


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG instance carved out of a GPU; a pod gets it whole."""

    profile: str
    uuid: str
    memory_mib: int
    sm_count: int


@dataclass(frozen=True, slots=True)
class EccState:
    """A GPU's uncorrectable (double-bit) ECC record, as NVML reports it.

    Each field is None where NVML does not support it on this GPU: all of them
    with ECC off or on a GPU without ECC, retired pages on Ampere and later
    (which remap rows instead), remapped rows before Ampere. Volatile counts
    start again at each driver load; aggregate counts and retired pages and
    remapped rows are kept on the GPU across reboots.
    """

    volatile_double_bit: int | None = None
    aggregate_double_bit: int | None = None
    retired_pages_double_bit: int | None = None
    """Pages retired for double-bit errors."""
    retired_pages_pending: bool | None = None
    """A page waits to be retired at the next reset."""
    remapped_rows_uncorrectable: int | None = None
    """Rows remapped for uncorrectable errors."""
    remap_pending: bool | None = None
    """A row waits to be remapped at the next reset."""
    remap_failed: bool | None = None
    """A row could not be remapped: the GPU has no spare rows left."""


ECC_FIELDS: Final = (
    ("volatileDoubleBit", "volatile_double_bit", int),
    ("aggregateDoubleBit", "aggregate_double_bit", int),
    ("retiredPagesDoubleBit", "retired_pages_double_bit", int),
    ("retiredPagesPending", "retired_pages_pending", bool),
    ("remappedRowsUncorrectable", "remapped_rows_uncorrectable", int),
    ("remapPending", "remap_pending", bool),
    ("remapFailed", "remap_failed", bool),
)
"""(JSON key, EccState field, kind) of each ECC value: the one table the annotation and
the fleet file's ``eccEvents`` read and write, so their names cannot drift apart."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU; in MIG mode it is offered only as its MIG instances."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    sm_count: int
    compute_capability: str
    numa_node: int
    healthy: bool
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    links: tuple[GpuLink, ...] = ()
    ecc: EccState | None = None
    """None where the plugin could not read it (or an annotation written before it)."""


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """Every GPU of one node, and how many shares and time slices the plugin lets one GPU hold.

    ``share_slots`` is the plugin's `infergrid.io/vgpu` slots per GPU: the kubelet
    can hand a GPU to no more share containers than that, so placement must not.
    ``time_slices`` is its `gpuReplicas`: how many `nvidia.com/gpu` containers may
    hold one GPU at once, each seeing all of it; 1 keeps a whole GPU exclusive.
    It is published only when above 1, so annotations written before it still decode.
    """

    node: str
    gpus: tuple[Gpu, ...]
    share_slots: int = DEFAULT_VGPU_SLOTS_PER_GPU
    time_slices: int = 1


def encode_inventory(inventory: GpuInventory) -> str:
    """The annotation value for ``inventory``."""
    body: dict[str, Any] = {
        "node": inventory.node,
        "shareSlotsPerGpu": inventory.share_slots,
        "gpus": [_gpu_json(g) for g in inventory.gpus],
    }
    if inventory.time_slices != 1:
        body["timeSlices"] = inventory.time_slices
    return dump_document(body)


def _gpu_json(gpu: Gpu) -> dict[str, Any]:
    return {
        "uuid": gpu.uuid,
        "index": gpu.index,
        "model": gpu.model,
        "memoryMiB": gpu.memory_mib,
        "smCount": gpu.sm_count,
        "computeCapability": gpu.compute_capability,
        "numaNode": gpu.numa_node,
        "healthy": gpu.healthy,
        "mig": {
            "enabled": gpu.mig_enabled,
            "instances": [
                {
                    "profile": m.profile,
                    "uuid": m.uuid,
                    "memoryMiB": m.memory_mib,
                    "smCount": m.sm_count,
                }
                for m in gpu.mig_instances
            ],
        },
        "links": [{"peer": k.peer_index, "type": k.type, "count": k.count} for k in gpu.links],
    } | ({} if gpu.ecc is None else {"ecc": _ecc_json(gpu.ecc)})


def _ecc_json(ecc: EccState) -> dict[str, int | bool]:
    """The ``ecc`` object: the values NVML supports, the others left out."""
    values = ((key, getattr(ecc, name)) for key, name, _ in ECC_FIELDS)
    return {key: value for key, value in values if value is not None}


def decode_ecc(obj: dict[str, Any], path: str) -> EccState:
    """An ``ecc`` object; an absent or null value is None (not supported), counts are 0 or more."""
    return EccState(
        **{
            name: None if obj.get(key) is None else _ecc_value(obj, key, kind, path)
            for key, name, kind in ECC_FIELDS
        }
    )


def _ecc_value(obj: dict[str, Any], key: str, kind: type, path: str) -> int | bool:
    return integer(obj, key, path) if kind is int else field(obj, key, bool, path)


def decode_inventory(text: str) -> GpuInventory:
    """The inventory in an annotation value; ContractError names the first bad field."""
    doc = load_document(text, ANNOTATION_GPU_INVENTORY)
    decoded = [(_decode_gpu(obj, path), path) for obj, path in each(doc, "gpus", dict)]
    unique(((g.index, join(p, "index")) for g, p in decoded), "GPU index")
    unique(((g.uuid, join(p, "uuid")) for g, p in decoded), "GPU uuid")
    indices = {g.index for g, _ in decoded}
    for gpu, path in decoded:
        _check_peers(gpu, path, indices)
    return GpuInventory(
        node=field(doc, "node", str),
        gpus=tuple(g for g, _ in decoded),
        share_slots=integer(
            doc,
            "shareSlotsPerGpu",
            low=1,
            high=MAX_VGPU_SLOTS_PER_GPU,
            default=DEFAULT_VGPU_SLOTS_PER_GPU,
        ),
        time_slices=integer(doc, "timeSlices", low=1, high=MAX_TIME_SLICES_PER_GPU, default=1),
    )


def _check_peers(gpu: Gpu, path: str, indices: set[int]) -> None:
    """Each link goes to another GPU of the node, at most one link per peer."""
    peers = [
        (k.peer_index, join(join(join(path, "links"), i), "peer")) for i, k in enumerate(gpu.links)
    ]
    unique(peers, "peer")
    for peer, where in peers:
        if peer == gpu.index or peer not in indices:
            raise ContractError(where, f"no other GPU has index {peer}")


def compute_capability(obj: dict[str, Any], path: str) -> str:
    """The ``computeCapability`` field, a CUDA version like ``8.0``."""
    value = field(obj, "computeCapability", str, path)
    if not _COMPUTE_CAPABILITY.fullmatch(value):
        raise ContractError(join(path, "computeCapability"), f"{value!r} is not like '8.0'")
    return value


def _decode_gpu(obj: dict[str, Any], path: str) -> Gpu:
    mig = field(obj, "mig", dict, path)
    mig_path = join(path, "mig")
    enabled = field(mig, "enabled", bool, mig_path)
    instances = tuple(_decode_mig(m, p) for m, p in each(mig, "instances", dict, mig_path))
    if instances and not enabled:
        raise ContractError(join(mig_path, "instances"), "MIG instances need mig.enabled true")
    links = tuple(_decode_link(k, p) for k, p in each(obj, "links", dict, path))
    ecc = field(obj, "ecc", dict, path, default=None)
    return Gpu(
        uuid=field(obj, "uuid", str, path),
        index=integer(obj, "index", path),
        model=field(obj, "model", str, path),
        memory_mib=integer(obj, "memoryMiB", path),
        sm_count=integer(obj, "smCount", path),
        compute_capability=compute_capability(obj, path),
        numa_node=integer(obj, "numaNode", path),
        healthy=field(obj, "healthy", bool, path),
        mig_enabled=enabled,
        mig_instances=instances,
        links=links,
        ecc=None if ecc is None else decode_ecc(ecc, join(path, "ecc")),
    )


def _decode_mig(obj: dict[str, Any], path: str) -> MigInstance:
    return MigInstance(
        profile=field(obj, "profile", str, path),
        uuid=field(obj, "uuid", str, path),
        memory_mib=integer(obj, "memoryMiB", path),
        sm_count=integer(obj, "smCount", path),
    )


def _decode_link(obj: dict[str, Any], path: str) -> GpuLink:
    kind = field(obj, "type", str, path)
    if kind not in LINK_TYPES:
        raise ContractError(join(path, "type"), f"{kind!r} is not one of {', '.join(LINK_TYPES)}")
    low, high = (1, None) if kind == LINK_NVLINK else (0, 0)
    return GpuLink(
        peer_index=integer(obj, "peer", path),
        type=kind,
        count=integer(obj, "count", path, low, high),
    )


def node_labels(inventory: GpuInventory) -> dict[str, str]:
    """Labels for nodeSelector and affinity (see infergrid.gpu_models).

    Product, model, memory and compute capability are those of the lowest-index GPU;
    the compute level is the highest on the node, and a node with several models says
    so, so that affinity keeps it and the extender checks each GPU.
    """
    first = min(inventory.gpus, key=lambda g: g.index, default=None)
    capable = any(g.mig_enabled or find_family(g.model, g.memory_mib) for g in inventory.gpus)
    models = {g.model for g in inventory.gpus}
    levels = [compute_level(g.compute_capability) for g in inventory.gpus]
    return {
        LABEL_GPU_PRODUCT: label_value(first.model) if first else "",
        LABEL_GPU_MODEL: short_name(first.model, first.memory_mib) if first else "",
        LABEL_GPU_COUNT: str(len(inventory.gpus)),
        LABEL_GPU_MEMORY: str(first.memory_mib) if first else "0",
        LABEL_GPU_COMPUTE_CAPABILITY: first.compute_capability if first else "",
        LABEL_GPU_COMPUTE_LEVEL: str(max(levels, default=0)),
        LABEL_GPU_MIXED: "true" if len(models) > 1 else "false",
        LABEL_MIG_CAPABLE: "true" if capable else "false",
    }


def node_capacity(inventory: GpuInventory) -> dict[str, str]:
    """Extended resources the device plugin advertises; unhealthy GPUs offer nothing.

    A GPU in MIG mode is offered only as its MIG instances, never whole or shared;
    any other GPU as ``time_slices`` replicas and ``share_slots`` share slots
    (device_plugin/devices.py lists the same devices, one ID each).
    """
    usable = [g for g in inventory.gpus if g.healthy]
    whole = sum(1 for g in usable if not g.mig_enabled)
    migs = Counter(m.profile for g in usable if g.mig_enabled for m in g.mig_instances)
    capacity = {
        RESOURCE_GPU: str(whole * inventory.time_slices),
        RESOURCE_VGPU: str(whole * inventory.share_slots),
    }
    capacity.update({mig_resource(p): str(n) for p, n in sorted(migs.items())})
    return capacity
