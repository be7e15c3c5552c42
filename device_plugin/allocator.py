"""Allocate, decided: which assignments a kubelet request may honour, and what the container gets.

Pure over plain data. The kubelet names devices, not pods, so a request is
matched to the unhonoured assignments on this node with the same kind and the
same GPUs, oldest first (tie: pod name, then container order). When several
match, the kubelet may be admitting any of them: the ledger charges the largest
and the container is limited to the smallest memory, so neither the GPU nor
the pod is over-committed whichever it is, until PodResources says (see
ledger.py). The charge is re-checked against the ledger by the placement core,
so no annotation can make the plugin hand out more of a GPU than it has.

A pod that reached the node past the extender (created with `spec.nodeName`)
carries no assignment, so it is never granted one; but while it waits, a request
for as many of the same resource as it asks may be its, not the assigned pod's.
The request does not say, the kubelet's PodResources does: it lists a pod from
the moment it starts admitting it and drops it once rejected, and admits one pod
at a time. So of the waiting pods, the one it lists is the one asking. Only the
assigned pods listed: the grant is theirs. An unassigned one listed: refused,
naming it. None listed, or no PodResources: refused, naming both, and the kubelet
fails whichever it was admitting; the intruder never holds another pod's GPUs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from device_plugin.config import PluginConfig
from device_plugin.devices import Device, resource_of
from device_plugin.ledger import Ledger, Pending, explains, pending_on, unassigned_on, widest
from device_plugin.mps import default_cores
from device_plugin.visibility import visibility
from infergrid.placement import recheck
from infergrid.records import PodRecord
from infergrid.share_edits import Mount, share_edits


class AllocationError(Exception):
    """A request the plugin must refuse; the message says what is missing."""


@dataclass(frozen=True, slots=True)
class Grant:
    """One container's allocation: the assignment it honours and what the container sees.

    `pending` is the plugin's guess at the holder; `candidates` every assignment
    the kubelet might be admitting (the guess among them).
    """

    pending: Pending
    envs: dict[str, str]
    cdi_devices: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    device_ids: tuple[str, ...] = ()
    candidates: tuple[Pending, ...] = field(default=())


def _devices(ids: Iterable[str], known: dict[str, Device]) -> list[Device]:
    ids = list(ids)
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise AllocationError(f"unknown device IDs: {', '.join(unknown)}")
    if not ids:
        raise AllocationError("the request names no devices")
    devices = [known[i] for i in ids]
    if len({d.kind for d in devices}) > 1:
        raise AllocationError("one request mixes whole GPUs, shares and MIG devices")
    if devices[0].kind == "share" and len(devices) > 1:
        raise AllocationError(f"a container gets one share slot, not {len(devices)}")
    gpus = Counter(d.target for d in devices)
    twice = sorted(t for t, n in gpus.items() if n > 1)
    if twice:
        raise AllocationError(
            f"a container gets one time slice of each GPU; the request names {', '.join(twice)} "
            "more than once"
        )
    return devices


def match(
    devices: list[Device], node: str, pods: Iterable[PodRecord], ledger: Ledger, scheduler: str
) -> list[Pending]:
    """Unhonoured assignments on `node` for these GPUs, of pods `scheduler` bound, oldest first.

    A pod another scheduler bound is passed over, so it never stands in front of
    one of ours; when only such pods match, the refusal names one of them.
    """
    pods = list(pods)
    kind = devices[0].kind
    targets = sorted({d.target for d in devices})
    pending = pending_on(node, pods, ledger)
    found = [item for item in pending if explains(item.container, kind, targets)]
    ours = [item for item in found if item.pod.scheduler_name == scheduler]
    if ours and ledger.all_taken(ours):
        raise AllocationError(
            f"every {kind} assignment on node {node} for {', '.join(targets)} is already granted "
            f"({', '.join(f'{p.pod.key}/{p.container.name}' for p in ours)})"
        )
    if ours:
        return ours
    if found:
        raise AllocationError(
            f"pod {found[0].pod.key} was not scheduled by {scheduler}; it gets no GPU"
        )
    raise AllocationError(_no_match(kind, targets, node, pods, pending))


def _no_match(
    kind: str, targets: list[str], node: str, pods: list[PodRecord], pending: list[Pending]
) -> str:
    """Why nothing matched: what is waiting here, and every assignment that does not decode.

    The kubelet shows this message in the pod's events, so a pod whose own
    annotation is malformed learns which field is wrong.
    """
    waiting = ", ".join(f"{p.pod.key}/{p.container.name}" for p in pending) or "none"
    message = (
        f"no unallocated {kind} assignment on node {node} for {', '.join(targets)} "
        f"(unallocated assignments here: {waiting})"
    )
    unreadable = [f"{p.key}: {p.problem}" for p in pods if p.problem and p.node_name == node]
    if unreadable:
        message += f"; assignments that do not decode: {'; '.join(unreadable)}"
    return message


def _check_unambiguous(
    devices: list[Device],
    candidates: list[Pending],
    node: str,
    pods: list[PodRecord],
    ledger: Ledger,
    config: PluginConfig,
    listed: set[tuple[str, str]] | None,
) -> None:
    """Refuses a request that a container without an assignment may be making.

    The kubelet asks for `len(devices)` of one resource; a waiting container that
    asks for that many of it, with no assignment, may be the one being admitted,
    and a grant would hand it a candidate's GPUs. `listed` (the pods the kubelet's
    PodResources lists; None when it cannot say) tells which of them it is.
    """
    resource, count = resource_of(devices[0], config), len(devices)
    rivals = [
        u
        for u in unassigned_on(node, pods, ledger)
        if (u.request.resource, u.request.count) == (resource, count)
    ]
    if not rivals:
        return
    admitting = set() if listed is None else listed
    asking = [u for u in rivals if (u.pod.namespace, u.pod.name) in admitting]
    assigned_asking = any((p.pod.namespace, p.pod.name) in admitting for p in candidates)
    if assigned_asking and not asking:
        return
    if asking and not assigned_asking:
        who = ", ".join(f"{u.pod.key}/{u.request.container}" for u in asking)
        raise AllocationError(
            f"{count} {resource} on node {node} is asked for by {who}, which the kubelet is "
            f"admitting with no GPU assignment (a pod gets GPUs through "
            f"{config.scheduler_name}, not by setting spec.nodeName)"
        )
    unassigned = ", ".join(f"{u.pod.key}/{u.request.container}" for u in rivals)
    assigned = ", ".join(f"{p.pod.key}/{p.container.name}" for p in candidates)
    raise AllocationError(
        f"{count} {resource} on node {node} may be for {unassigned}, which has no GPU "
        f"assignment, or for {assigned}, which is assigned these devices: the kubelet "
        "names devices, not pods, and its PodResources does not tell them apart, so neither "
        f"is granted while both wait (pods get GPUs through {config.scheduler_name}, not by "
        "setting spec.nodeName)"
    )


def _check_fit(
    devices: list[Device], candidates: list[Pending], ledger: Ledger, config: PluginConfig
) -> None:
    """Refuses what would over-commit a GPU, given what was already granted.

    The placement core judges, by the rules the extender placed with, so the
    gate and the scheduler never disagree about what fits: no more shares than
    share slots, no more whole-GPU holders than time slices (one without
    time-slicing), and never both on one GPU. With several candidates the
    largest is judged.
    """
    gpus = {d.gpu.uuid: d.gpu for d in devices}.values()
    charge = widest([p.container for p in candidates])
    holding = ledger.holding(gpus, config.vgpu_slots_per_gpu, config.gpu_replicas)
    shortfalls = recheck(holding, charge)
    if shortfalls:
        reasons = "; ".join(s.message for s in shortfalls)
        who = " or ".join(p.pod.key for p in candidates)
        raise AllocationError(
            f"pod {who} does not fit beside the containers already granted: {reasons}"
        )


def _memory(devices: list[Device], candidates: list[Pending], config: PluginConfig) -> int:
    """The MiB the container may use, so no pod gets more than its own.

    A MIG instance has its own memory. A time slice gets the card's memory split by
    the GPU's time slices, so that all of them fit, though each sees the whole GPU.
    Otherwise the assignment's memory; of several candidates, the smallest.
    """
    first = candidates[0].container
    if first.mig is not None:
        mig = first.mig.uuid
        return next(m.memory_mib for m in devices[0].gpu.mig_instances if m.uuid == mig)
    if devices[0].kind == "whole":
        return min(d.gpu.memory_mib for d in devices) // config.gpu_replicas
    return min(g.memory_mib for p in candidates for g in p.container.gpus)


def _cores(candidates: list[Pending], config: PluginConfig) -> int:
    """The share's thread percentage, the default where it set none; of several, the smallest."""
    return min(p.container.gpus[0].cores or default_cores(config) for p in candidates)


def _limits(
    devices: list[Device], candidates: list[Pending], config: PluginConfig
) -> tuple[dict[str, str], tuple[Mount, ...]]:
    """The container's memory budget, and on an MPS GPU its daemon and the limits that hold it."""
    memory = _memory(devices, candidates, config)
    mps = config.mps_root if config.mps and devices[0].kind == "share" else None
    cores = _cores(candidates, config) if mps else 0
    return share_edits(memory, mps, devices[0].gpu.uuid, cores)


def grant(
    device_ids: Iterable[str],
    known: dict[str, Device],
    node: str,
    pods: Iterable[PodRecord],
    ledger: Ledger,
    config: PluginConfig,
    listed: set[tuple[str, str]] | None = None,
) -> Grant:
    """Decides one container request; records it in `ledger` only when it succeeds.

    `listed`: the pods the kubelet's PodResources lists now, None when it cannot say.
    """
    pods, device_ids = list(pods), tuple(device_ids)
    devices = _devices(device_ids, known)
    candidates = match(devices, node, pods, ledger, config.scheduler_name)
    _check_unambiguous(devices, candidates, node, pods, ledger, config, listed)
    _check_fit(devices, candidates, ledger, config)
    guess = ledger.guess(candidates)
    ledger.honour(device_ids, candidates)
    seen = visibility([d.target for d in devices], config.device_list_strategy)
    envs, mounts = _limits(devices, candidates, config)
    return Grant(
        guess,
        {**seen.envs, **envs},
        seen.cdi_devices,
        seen.mounts + mounts,
        device_ids,
        tuple(candidates),
    )
