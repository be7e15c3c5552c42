"""Allocated ResourceClaims and the claims a pod asks by, decoded into what the placement
core already reads.

kube-scheduler's DRA plugin records what each pod holds as an allocated ResourceClaim. The
extender keeps one ledger across both modes, so here an allocated claim becomes the
``ContainerAssignment``s an assignment annotation gives (its devices read against the node's
slices, ``infergrid.dra_slices``), and a claim's requests become the
``ContainerGpuRequest``s a container's resources give.

Everything is pure and reads resource.k8s.io/v1 JSON; every bad field is a ContractError
naming it. Only the driver's own results and device classes are read: a claim may ask other
drivers for other devices, which are theirs to account.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from infergrid.assignment_annotation import AssignedGpu, ContainerAssignment
from infergrid.codec import each, expect, field, integer, join
from infergrid.constants import MAX_VGPU_SLOTS_PER_GPU
from infergrid.dra import (
    ATTR_MIG_PROFILE,
    CAP_CORES,
    CAP_MEMORY,
    CLASS_GPU,
    CLASS_MIG,
    CLASS_SHARE,
    DRIVER,
)
from infergrid.dra_slices import DraDevice
from infergrid.errors import ContractError
from infergrid.mig import MIG_PROFILE_NAME
from infergrid.pod_host import MIB
from infergrid.pod_request import ContainerGpuRequest
from infergrid.quantity import parse_whole_quantity

CLASSES: Final = (CLASS_GPU, CLASS_SHARE, CLASS_MIG)
ALL_CORES: Final = 100
_MIG_SELECTOR: Final = re.compile(
    r"""device\.attributes\[["']"""
    + re.escape(DRIVER)
    + r"""["']\]\."""
    + ATTR_MIG_PROFILE
    + r"""\s*==\s*["']([^"']+)["']"""
)


@dataclass(frozen=True, slots=True)
class HeldDevice:
    """One result of an allocated claim, the driver's: which device of which pool, and the
    capacity it consumed where the claim says (None: not said, the device's default)."""

    request: str
    pool: str
    device: str
    memory_mib: int | None = None
    cores: int | None = None


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """A ResourceClaim, decoded: what it asks of the driver (or why that does not read),
    what its allocation holds, and the pods it is reserved for."""

    uid: str
    namespace: str
    name: str
    requests: tuple[ContainerGpuRequest, ...] = ()
    problem: str | None = None
    allocated: bool = False
    held: tuple[HeldDevice, ...] = ()
    reserved_for: tuple[str, ...] = ()
    """The uids of the pods in ``status.reservedFor``."""

    @property
    def pools(self) -> frozenset[str]:
        return frozenset(h.pool for h in self.held)


# Allocated ResourceClaims.


def claim_record(obj: dict[str, Any]) -> ClaimRecord:
    """The record of a ResourceClaim's JSON. Its requests that do not read become
    ``problem`` (the pod asking for it fits nowhere); an allocation that does not read holds
    nothing it can name (logged by the caller through ``problem`` too)."""
    meta = field(obj, "metadata", dict)
    uid = field(meta, "uid", str, "metadata")
    namespace = str(meta.get("namespace") or "")
    name = str(meta.get("name") or "")
    problems: list[str] = []
    try:
        requests = claim_requests(obj)
    except ContractError as err:
        requests = ()
        problems.append(str(err))
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    try:
        allocated, held = allocation(status)
        reserved = reserved_for(status)
    except ContractError as err:
        return ClaimRecord(uid, namespace, name, requests, str(err), allocated=True)
    problem = "; ".join(problems) or None
    return ClaimRecord(uid, namespace, name, requests, problem, allocated, held, reserved)


def allocation(status: dict[str, Any]) -> tuple[bool, tuple[HeldDevice, ...]]:
    """Whether the claim is allocated, and the driver's results in its allocation."""
    found = field(status, "allocation", dict, "status", default=None)
    if found is None:
        return False, ()
    devices = field(found, "devices", dict, "status.allocation", default={})
    where = "status.allocation.devices"
    held = [
        _held(r, p)
        for r, p in each(devices, "results", dict, where, default=[])
        if r.get("driver") == DRIVER and not r.get("adminAccess")
    ]
    return True, tuple(held)


def _held(obj: dict[str, Any], path: str) -> HeldDevice:
    consumed = field(obj, "consumedCapacity", dict, path, default={})
    cpath = join(path, "consumedCapacity")
    memory = _consumed(consumed, CAP_MEMORY, cpath)
    cores = _consumed(consumed, CAP_CORES, cpath)
    if cores is not None and cores > ALL_CORES:
        raise ContractError(join(cpath, CAP_CORES), f"must be at most {ALL_CORES}, got {cores}")
    return HeldDevice(
        request=field(obj, "request", str, path),
        pool=field(obj, "pool", str, path),
        device=field(obj, "device", str, path),
        memory_mib=None if memory is None else -(-memory // MIB),
        cores=cores,
    )


def _consumed(consumed: dict[str, Any], name: str, path: str) -> int | None:
    key = name if name in consumed else f"{DRIVER}/{name}"
    if key not in consumed:
        return None
    return parse_whole_quantity(consumed[key], join(path, key))


def reserved_for(status: dict[str, Any]) -> tuple[str, ...]:
    """The uids of the pods the claim is reserved for (other consumers are not pods)."""
    return tuple(
        field(r, "uid", str, p)
        for r, p in each(status, "reservedFor", dict, "status", default=[])
        if r.get("resource") == "pods" and not r.get("apiGroup")
    )


def holdings(
    claim: ClaimRecord, devices: Mapping[str, DraDevice]
) -> tuple[ContainerAssignment, ...]:
    """What the claim's results hold on a node whose devices are ``devices``, one container
    per result: a MIG instance; a share (memory and cores it consumed); or the GPU whole, when
    it consumed all the memory or the device takes one claim only. A device the slices no
    longer list holds nothing the node offers."""
    found = []
    for at, held in enumerate(claim.held):
        device = devices.get(held.device)
        if device is None:
            continue
        name = f"{claim.namespace}/{claim.name}/{held.request}[{at}]"
        if device.mig is not None:
            found.append(ContainerAssignment(name, mig=device.mig, allocated=True))
            continue
        memory = device.memory_mib if held.memory_mib is None else held.memory_mib
        if not device.shareable or memory >= device.memory_mib:
            whole = AssignedGpu(device.gpu_uuid, device.memory_mib, ALL_CORES)
            found.append(ContainerAssignment(name, gpus=(whole,), allocated=True))
            continue
        share = AssignedGpu(device.gpu_uuid, memory, held.cores or 0)
        found.append(ContainerAssignment(name, gpus=(share,), allocated=True, shared=True))
    return tuple(found)


# What a claim asks for.


def claim_requests(obj: dict[str, Any]) -> tuple[ContainerGpuRequest, ...]:
    """The GPU containers that stand for the claim's requests of the driver's classes, named
    by their request; ContractError names the first request that breaks a rule."""
    spec = field(obj, "spec", dict)
    devices = field(spec, "devices", dict, "spec", default={})
    found: list[ContainerGpuRequest] = []
    for request, path in each(devices, "requests", dict, "spec.devices", default=[]):
        name = field(request, "name", str, path)
        for sub, sub_path in each(request, "firstAvailable", dict, path, default=[]):
            if sub.get("deviceClassName") in CLASSES:
                raise ContractError(
                    join(sub_path, "deviceClassName"),
                    "InferGrid's classes are asked with exactly, not firstAvailable",
                )
        exactly = field(request, "exactly", dict, path, default=None)
        if exactly is not None:
            found += _exactly(name, exactly, join(path, "exactly"))
    return tuple(found)


def _exactly(name: str, obj: dict[str, Any], path: str) -> list[ContainerGpuRequest]:
    klass = field(obj, "deviceClassName", str, path)
    if klass not in CLASSES or obj.get("adminAccess"):
        return []  # another driver's device, or admin access, which holds no capacity
    mode = field(obj, "allocationMode", str, path, default="ExactCount")
    if mode != "ExactCount":
        raise ContractError(join(path, "allocationMode"), f"{mode!r}: ask a count of devices")
    count = integer(obj, "count", path, low=1, high=MAX_VGPU_SLOTS_PER_GPU, default=1)
    memory, cores = _capacity_requests(obj, path)
    if klass == CLASS_MIG:
        profile = _mig_profile(obj, path)
        return [
            ContainerGpuRequest(_name(name, i, count), "mig", mig_profile=profile)
            for i in range(count)
        ]
    if memory is None and klass == CLASS_SHARE:
        raise ContractError(join(join(path, "capacity"), "requests"), f"a share needs {CAP_MEMORY}")
    if memory is None:
        if cores is not None:
            raise ContractError(
                join(join(path, "capacity"), "requests"), f"{CAP_CORES} needs {CAP_MEMORY}"
            )
        return [ContainerGpuRequest(name, "whole", gpus=count)]
    if count != 1:
        raise ContractError(join(path, "count"), "a share is of one GPU; ask count 1")
    return [ContainerGpuRequest(name, "share", gpus=1, memory_mib=memory, cores=cores or 0)]


def _name(request: str, at: int, count: int) -> str:
    return request if count == 1 else f"{request}[{at}]"


def _capacity_requests(obj: dict[str, Any], path: str) -> tuple[int | None, int | None]:
    """The ``memory`` (MiB, rounded up) and ``cores`` (percent) the request asks."""
    capacity = field(obj, "capacity", dict, path, default={})
    asked = field(capacity, "requests", dict, join(path, "capacity"), default={})
    where = join(join(path, "capacity"), "requests")
    values: dict[str, int] = {}
    for key, raw in asked.items():
        short = key.removeprefix(f"{DRIVER}/")
        if short not in (CAP_MEMORY, CAP_CORES):
            raise ContractError(
                join(where, key), f"unknown capacity; known: {CAP_MEMORY}, {CAP_CORES}"
            )
        values[short] = parse_whole_quantity(raw, join(where, key))
    memory = values.get(CAP_MEMORY)
    if memory is not None:
        memory = -(-memory // MIB)
        if memory < 1:
            raise ContractError(join(where, CAP_MEMORY), "must be at least 1Mi")
    cores = values.get(CAP_CORES)
    if cores is not None and not 1 <= cores <= ALL_CORES:
        raise ContractError(join(where, CAP_CORES), f"must be a percent from 1 to 100, got {cores}")
    return memory, cores


def _mig_profile(obj: dict[str, Any], path: str) -> str:
    """The profile a MIG request selects: its CEL selector ``...migProfile == "3g.40gb"``."""
    for selector, sel_path in each(obj, "selectors", dict, path, default=[]):
        cel = field(selector, "cel", dict, sel_path, default={})
        found = _MIG_SELECTOR.search(str(cel.get("expression") or ""))
        if found is not None:
            if not MIG_PROFILE_NAME.fullmatch(found[1]):
                raise ContractError(
                    join(join(sel_path, "cel"), "expression"),
                    f"{found[1]!r} is not a MIG profile name like 1g.10gb",
                )
            return found[1]
    raise ContractError(join(path, "selectors"), f"a MIG request selects its {ATTR_MIG_PROFILE}")


# A pod's claims.


class ClaimMissing(ContractError):
    """A claim the pod names is not (yet) in the cache: the pod waits, as kube-scheduler's
    own DRA plugin makes it wait, rather than fitting nowhere."""


def pod_claims(pod: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(the pod's name for the claim, the ResourceClaim's name or None where it is not
    generated yet) of each entry of ``spec.resourceClaims``."""
    spec = field(pod, "spec", dict)
    status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
    generated = {
        field(s, "name", str, p): s.get("resourceClaimName")
        for s, p in each(status, "resourceClaimStatuses", dict, "status", default=[])
    }
    found = []
    for entry, path in each(spec, "resourceClaims", dict, "spec", default=[]):
        name = field(entry, "name", str, path)
        own = field(entry, "resourceClaimName", str, path, default=None)
        claim = own if own is not None else generated.get(name)
        if claim is not None:
            expect(claim, str, f"status.resourceClaimStatuses[{name}].resourceClaimName")
        found.append((name, claim))
    return found


def pod_claim_containers(
    pod: dict[str, Any], lookup: Callable[[str, str], ClaimRecord | None]
) -> tuple[ContainerGpuRequest, ...]:
    """The GPU containers of the pod's claims not yet allocated, named ``<pod's claim
    name>/<request>`` (stable across a template's pods); an allocated claim already holds its
    devices. ``lookup(namespace, name)`` reads a claim; ClaimMissing where one is missing."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    found: list[ContainerGpuRequest] = []
    for entry, name in pod_claims(pod):
        claim = None if name is None else lookup(namespace, name)
        if claim is None:
            raise ClaimMissing(
                f"spec.resourceClaims[{entry}]",
                f"waiting for its ResourceClaim {name or '(not generated yet)'}",
            )
        if claim.problem is not None:
            raise ContractError(f"ResourceClaim {namespace}/{name}", claim.problem)
        if claim.allocated:
            continue
        found += (_renamed(c, f"{entry}/{c.name}") for c in claim.requests)
    return tuple(found)


def _renamed(container: ContainerGpuRequest, name: str) -> ContainerGpuRequest:
    return ContainerGpuRequest(
        name,
        container.kind,
        container.gpus,
        container.memory_mib,
        container.cores,
        container.mig_profile,
    )
