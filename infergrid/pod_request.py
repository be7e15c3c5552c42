"""What GPUs a pod asks for, worked out once from its spec and reused for every node.

The extender, the device plugin and the CLI all read a pod's GPU request here,
so they agree on every rule; a request that breaks one fails with the container
and resource named, before any node is looked at.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from infergrid.codec import each, expect, field, join
from infergrid.constants import (
    ANNOTATION_PLACEMENT_POLICY,
    ANNOTATION_TOPOLOGY,
    DEFAULT_POLICY,
    PLACEMENT_POLICIES,
    RESOURCE_DOMAIN_PREFIX,
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    RESOURCE_MIG_PREFIX,
    RESOURCE_VGPU,
    TOPOLOGIES,
)
from infergrid.dra import RESOURCE_GPU_CLAIM
from infergrid.errors import ContractError
from infergrid.gpu_models import GpuConstraint, read_constraint
from infergrid.mig import MIG_PROFILE_NAME
from infergrid.quantity import parse_whole_quantity

Kind = Literal["none", "whole", "share", "mig"]

_OWN_RESOURCES: Final = (RESOURCE_VGPU, RESOURCE_GPU_MEMORY, RESOURCE_GPU_CORES)
_KNOWN_RESOURCES: Final = (*_OWN_RESOURCES, RESOURCE_GPU_CLAIM)
_SHARE_SETTINGS: Final = (RESOURCE_GPU_MEMORY, RESOURCE_GPU_CORES)
_ALL_CORES: Final = 100


@dataclass(frozen=True, slots=True)
class ContainerGpuRequest:
    """One container's GPU request.

    ``gpus`` is the number of GPUs it touches (N whole GPUs, 1 for a share, 0 for
    MIG); ``memory_mib`` and ``cores`` describe a share and are 0 otherwise. A share
    without ``infergrid.io/gpu-cores`` has ``cores`` 0: it reserves no SMs and runs
    best-effort beside the others, so memory alone decides how many fit on a GPU.
    """

    name: str
    kind: Kind
    gpus: int = 0
    memory_mib: int = 0
    cores: int = 0
    mig_profile: str | None = None
    init: bool = False


@dataclass(frozen=True, slots=True)
class PodGpuRequest:
    """Every container's request (init containers first) and how the pod wants them placed."""

    containers: tuple[ContainerGpuRequest, ...]
    policy: str = DEFAULT_POLICY
    topology: str | None = None
    gpu_constraint: GpuConstraint = GpuConstraint()
    by_claim: bool = False
    """The pod's GPUs come by ResourceClaim (it asks ``infergrid.io/gpu-claim``): only DRA
    nodes take it, and its GPU containers stand for its claims' requests."""

    @property
    def gpu_containers(self) -> tuple[ContainerGpuRequest, ...]:
        """Only the containers that ask for a GPU."""
        return tuple(c for c in self.containers if c.kind != "none")


@dataclass(frozen=True, slots=True)
class _Amount:
    """A resource amount and the ``resources.limits`` or ``.requests`` path it came from."""

    value: int
    section: str


@dataclass(frozen=True, slots=True)
class _Asked:
    """The GPU resources one container asks for, with what errors about them need."""

    name: str
    init: bool
    amounts: dict[str, _Amount]

    def value(self, resource: str) -> int:
        return self.amounts[resource].value if resource in self.amounts else 0

    def error(self, resource: str, reason: str, section: str | None = None) -> ContractError:
        where = join(section or self.amounts[resource].section, resource)
        return ContractError(where, f"container {self.name!r}: {reason}")


ClaimContainers = Callable[[dict[str, Any]], tuple[ContainerGpuRequest, ...]]
"""The GPU containers that stand for a pod's claims (``infergrid.dra_ledger``)."""


def parse_pod_request(
    pod: object, default_policy: str = DEFAULT_POLICY, claims: ClaimContainers | None = None
) -> PodGpuRequest:
    """The GPU request of a pod given as Kubernetes JSON (camelCase keys).

    A pod that asks ``infergrid.io/gpu-claim`` gets its GPUs by claim: no container may also
    ask the device plugin, and its GPU containers are ``claims(pod)`` (none where the reader
    passes no ``claims``: the device plugin, which never serves it).
    """
    pod = expect(pod, dict, "pod")
    spec = field(pod, "spec", dict)
    containers = [
        _container(obj, path, init=True)
        for obj, path in each(spec, "initContainers", dict, "spec", default=[])
    ]
    containers += [
        _container(obj, path, init=False) for obj, path in each(spec, "containers", dict, "spec")
    ]
    by_claim = asks_claims(pod)
    if by_claim:
        plugin = next((c for c in containers if c.kind != "none"), None)
        if plugin is not None:
            raise ContractError(
                "spec",
                f"container {plugin.name!r}: a pod asking {RESOURCE_GPU_CLAIM} gets its "
                "GPUs by claim only, not from the device plugin too",
            )
        containers += claims(pod) if claims is not None else ()
    return PodGpuRequest(
        by_claim=by_claim,
        containers=tuple(containers),
        policy=_annotation(pod, ANNOTATION_PLACEMENT_POLICY, PLACEMENT_POLICIES, default_policy),
        topology=_annotation(pod, ANNOTATION_TOPOLOGY, TOPOLOGIES, None),
        gpu_constraint=read_constraint(_annotations(pod)),
    )


def asks_claims(pod: dict[str, Any]) -> bool:
    """Whether a container of the pod asks ``infergrid.io/gpu-claim`` (in limits or
    requests), which marks a pod whose GPUs come by ResourceClaim."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            resources = (container.get("resources") or {}) if isinstance(container, dict) else {}
            for section in ("limits", "requests"):
                if RESOURCE_GPU_CLAIM in (resources.get(section) or {}):
                    return True
    return False


def _annotations(pod: dict[str, Any]) -> dict[str, Any]:
    return field(
        field(pod, "metadata", dict, default={}), "annotations", dict, "metadata", default={}
    )


def _annotation(
    pod: dict[str, Any], key: str, allowed: tuple[str, ...], default: str | None
) -> str | None:
    value = field(_annotations(pod), key, str, "metadata.annotations", default=default)
    if value is not None and value not in allowed:
        where = join("metadata.annotations", key)
        raise ContractError(where, f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _container(obj: dict[str, Any], path: str, init: bool) -> ContainerGpuRequest:
    name = field(obj, "name", str, path)
    resources = field(obj, "resources", dict, path, default={})
    return _classify(_Asked(name, init, _gpu_amounts(resources, join(path, "resources"), name)))


def _gpu_amounts(resources: dict[str, Any], path: str, name: str) -> dict[str, _Amount]:
    """GPU resources asked for, each from limits or else requests; the two must agree."""
    amounts: dict[str, _Amount] = {}
    for section in ("limits", "requests"):
        section_path = join(path, section)
        for resource, raw in field(resources, section, dict, path, default={}).items():
            if not _is_gpu_resource(resource, join(section_path, str(resource)), name):
                continue
            value = _whole_number(raw, join(section_path, resource), name)
            known = amounts.setdefault(resource, _Amount(value, section_path))
            if known.value != value:
                where = join(section_path, resource)
                raise ContractError(
                    where, f"container {name!r}: requests {value} but limits {known.value}"
                )
    # A zero count asks for nothing; a share's memory and cores count even at zero.
    return {r: a for r, a in amounts.items() if a.value > 0 or r in _SHARE_SETTINGS}


def _is_gpu_resource(resource: object, path: str, name: str) -> bool:
    if not isinstance(resource, str):
        return False
    if resource.startswith(RESOURCE_DOMAIN_PREFIX) and resource not in _KNOWN_RESOURCES:
        raise ContractError(
            path, f"container {name!r}: unknown resource; known: {', '.join(_KNOWN_RESOURCES)}"
        )
    return resource in (RESOURCE_GPU, *_OWN_RESOURCES) or resource.startswith(RESOURCE_MIG_PREFIX)


def _whole_number(raw: object, path: str, name: str) -> int:
    """A quantity that counts units, in any form Kubernetes writes it (``20k`` is 20000)."""
    try:
        return parse_whole_quantity(raw, path)
    except ContractError as err:
        raise ContractError(err.field, f"container {name!r}: {err.reason}") from None


def _classify(asked: _Asked) -> ContainerGpuRequest:
    """Which of the three ways to get a GPU the container uses, checking every rule."""
    migs = [r for r in asked.amounts if r.startswith(RESOURCE_MIG_PREFIX)]
    if migs:
        return _mig_request(asked, migs)
    for setting in _SHARE_SETTINGS:
        if setting in asked.amounts and RESOURCE_VGPU not in asked.amounts:
            raise asked.error(setting, f"needs {RESOURCE_VGPU}: 1")
    if RESOURCE_VGPU in asked.amounts:
        return _share_request(asked)
    if RESOURCE_GPU in asked.amounts:
        return ContainerGpuRequest(
            asked.name, "whole", gpus=asked.value(RESOURCE_GPU), init=asked.init
        )
    return ContainerGpuRequest(asked.name, "none", init=asked.init)


def _mig_request(asked: _Asked, migs: list[str]) -> ContainerGpuRequest:
    if len(migs) > 1:
        raise asked.error(migs[1], f"asks for a second MIG profile besides {migs[0]}")
    mixed = [r for r in (RESOURCE_GPU, *_OWN_RESOURCES) if r in asked.amounts]
    if mixed:
        raise asked.error(mixed[0], f"cannot be combined with {migs[0]} in one container")
    profile = migs[0].removeprefix(RESOURCE_MIG_PREFIX)
    if not MIG_PROFILE_NAME.fullmatch(profile):
        raise asked.error(migs[0], f"{profile!r} is not a MIG profile name like 1g.10gb")
    if asked.value(migs[0]) != 1:
        raise asked.error(migs[0], "a container gets exactly one MIG instance; ask for 1")
    return ContainerGpuRequest(asked.name, "mig", mig_profile=profile, init=asked.init)


def _share_request(asked: _Asked) -> ContainerGpuRequest:
    if asked.value(RESOURCE_VGPU) != 1:
        raise asked.error(RESOURCE_VGPU, f"a share is of one GPU; ask {RESOURCE_GPU} for more")
    if RESOURCE_GPU in asked.amounts:
        raise asked.error(RESOURCE_GPU, f"cannot be combined with {RESOURCE_VGPU} in one container")
    if RESOURCE_GPU_MEMORY not in asked.amounts:
        section = asked.amounts[RESOURCE_VGPU].section
        raise asked.error(RESOURCE_GPU_MEMORY, "a share needs its GPU memory in MiB", section)
    memory = asked.value(RESOURCE_GPU_MEMORY)
    if memory < 1:
        raise asked.error(RESOURCE_GPU_MEMORY, "must be at least 1 MiB")
    cores = asked.value(RESOURCE_GPU_CORES) if RESOURCE_GPU_CORES in asked.amounts else 0
    if RESOURCE_GPU_CORES in asked.amounts and not 1 <= cores <= _ALL_CORES:
        raise asked.error(RESOURCE_GPU_CORES, f"must be a percent from 1 to 100, got {cores}")
    return ContainerGpuRequest(
        asked.name, "share", gpus=1, memory_mib=memory, cores=cores, init=asked.init
    )
