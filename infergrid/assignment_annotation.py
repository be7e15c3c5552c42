"""Which GPUs a pod got, as the extender writes them in ``infergrid.io/gpu-assignment`` at bind.

The device plugin honours this annotation at Allocate and marks each container
allocated in it, so it is the one record both sides agree on; a restarted
extender rebuilds its view of used GPU memory from these annotations.
"""

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from infergrid.codec import (
    decode_time,
    dump_document,
    each,
    encode_time,
    field,
    integer,
    join,
    load_document,
    unique,
)
from infergrid.constants import ANNOTATION_GPU_ASSIGNMENT
from infergrid.errors import ContractError


@dataclass(frozen=True, slots=True)
class AssignedGpu:
    """A GPU, or a share of it: memory in MiB and a percent of its SMs (100 for a whole GPU)."""

    uuid: str
    memory_mib: int
    cores: int


@dataclass(frozen=True, slots=True)
class AssignedMig:
    """A MIG instance and the GPU it lives on."""

    uuid: str
    profile: str
    gpu_uuid: str


@dataclass(frozen=True, slots=True)
class ContainerAssignment:
    """What one container got: whole GPUs, one share of a GPU, or exactly one MIG instance.

    ``shared`` tells a share from a whole GPU: a share may hold all of a GPU's
    memory and SMs and still not be exclusive, so the numbers cannot tell.
    """

    name: str
    gpus: tuple[AssignedGpu, ...] = ()
    mig: AssignedMig | None = None
    allocated: bool = False
    shared: bool = False

    @property
    def kind(self) -> str:
        """``mig``, ``share`` or ``whole``, the same words as the pod's GPU request."""
        return "mig" if self.mig is not None else "share" if self.shared else "whole"


@dataclass(frozen=True, slots=True)
class PodAssignment:
    """Every GPU container of a pod, on ``node``, decided at ``assigned_at`` (aware UTC)."""

    node: str
    assigned_at: datetime
    containers: tuple[ContainerAssignment, ...]


def encode_assignment(assignment: PodAssignment) -> str:
    """The annotation value for ``assignment``."""
    return dump_document(
        {
            "node": assignment.node,
            "assignedAt": encode_time(assignment.assigned_at, "assignedAt"),
            "containers": [_container_json(c) for c in assignment.containers],
        }
    )


def _container_json(container: ContainerAssignment) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": container.name,
        "allocated": container.allocated,
        "shared": container.shared,
        "gpus": [
            {"uuid": g.uuid, "memoryMiB": g.memory_mib, "cores": g.cores} for g in container.gpus
        ],
    }
    if container.mig is not None:
        mig = container.mig
        body["mig"] = {"uuid": mig.uuid, "profile": mig.profile, "gpuUuid": mig.gpu_uuid}
    return body


def decode_assignment(text: str) -> PodAssignment:
    """The assignment in an annotation value; ContractError names the first bad field."""
    doc = load_document(text, ANNOTATION_GPU_ASSIGNMENT)
    containers = [
        (_decode_container(obj, path), path) for obj, path in each(doc, "containers", dict)
    ]
    unique(((c.name, join(p, "name")) for c, p in containers), "container")
    return PodAssignment(
        node=field(doc, "node", str),
        assigned_at=decode_time(doc, "assignedAt"),
        containers=tuple(c for c, _ in containers),
    )


def _decode_container(obj: dict[str, Any], path: str) -> ContainerAssignment:
    gpus = [(_decode_gpu(g, p), p) for g, p in each(obj, "gpus", dict, path)]
    unique(((g.uuid, join(p, "uuid")) for g, p in gpus), "GPU uuid")
    mig_obj = field(obj, "mig", dict, path, default=None)
    mig = None if mig_obj is None else _decode_mig(mig_obj, join(path, "mig"))
    if bool(gpus) == (mig is not None):
        raise ContractError(path, "a container gets either GPUs or one MIG instance")
    shared = field(obj, "shared", bool, path)
    if shared and len(gpus) != 1:
        raise ContractError(join(path, "shared"), "a share is of exactly one GPU")
    return ContainerAssignment(
        name=field(obj, "name", str, path),
        gpus=tuple(g for g, _ in gpus),
        mig=mig,
        allocated=field(obj, "allocated", bool, path),
        shared=shared,
    )


def _decode_gpu(obj: dict[str, Any], path: str) -> AssignedGpu:
    return AssignedGpu(
        uuid=field(obj, "uuid", str, path),
        memory_mib=integer(obj, "memoryMiB", path, low=1),
        cores=integer(obj, "cores", path, 0, 100),
    )


def _decode_mig(obj: dict[str, Any], path: str) -> AssignedMig:
    return AssignedMig(
        uuid=field(obj, "uuid", str, path),
        profile=field(obj, "profile", str, path),
        gpu_uuid=field(obj, "gpuUuid", str, path),
    )


def mark_allocated(assignment: PodAssignment, container_name: str) -> PodAssignment:
    """A copy of ``assignment`` with ``container_name`` marked allocated by the device plugin."""
    if all(c.name != container_name for c in assignment.containers):
        raise ContractError("containers", f"no container {container_name!r} in the assignment")
    containers = tuple(
        replace(c, allocated=True) if c.name == container_name else c for c in assignment.containers
    )
    return replace(assignment, containers=containers)
