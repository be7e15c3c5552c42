"""Allocate, decided: which assignment a kubelet request honours, and what the container gets.

Pure over plain data. The kubelet names devices, not pods, so a request is
matched to the oldest unhonoured assignment on this node with the same kind
and the same GPUs (tie: pod name, then container order). The match is then
re-checked against the ledger by the placement core, so no annotation can make
the plugin hand out more of a GPU than it has.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from device_plugin.config import PluginConfig
from device_plugin.devices import Device
from device_plugin.ledger import Ledger, Pending, pending_on
from infergrid.placement import recheck
from infergrid.records import PodRecord


class AllocationError(Exception):
    """A request the plugin must refuse; the message says what is missing."""


@dataclass(frozen=True, slots=True)
class Grant:
    """One container's allocation: the assignment it honours and what the container sees."""

    pending: Pending
    envs: dict[str, str]
    cdi_devices: tuple[str, ...] = field(default=())


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
    return devices


def _matches(pending: Pending, kind: str, targets: list[str]) -> bool:
    c = pending.container
    if c.kind != kind:
        return False
    if kind == "mig":
        return c.mig is not None and [c.mig.uuid] == targets
    return sorted(g.uuid for g in c.gpus) == targets


def match(
    devices: list[Device], node: str, pods: Iterable[PodRecord], ledger: Ledger, scheduler: str
) -> Pending:
    """The oldest unhonoured assignment on `node` for these GPUs, of a pod `scheduler` bound.

    A pod another scheduler bound is passed over, so it never stands in front of
    one of ours; when only such pods match, the refusal names one of them.
    """
    pods = list(pods)
    kind = devices[0].kind
    targets = sorted({d.target for d in devices})
    pending = pending_on(node, pods, ledger)
    found = [item for item in pending if _matches(item, kind, targets)]
    ours = [item for item in found if item.pod.scheduler_name == scheduler]
    if ours:
        return ours[0]
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


def _check_fit(devices: list[Device], pending: Pending, ledger: Ledger, slots: int) -> None:
    """Refuses what would over-commit a GPU, given what was already honoured.

    The placement core judges, by the rules the extender placed with, so the
    gate and the scheduler never disagree about what fits.
    """
    gpus = {d.gpu.uuid: d.gpu for d in devices}.values()
    shortfalls = recheck(ledger.holding(gpus, slots), pending.container)
    if shortfalls:
        reasons = "; ".join(s.message for s in shortfalls)
        raise AllocationError(
            f"pod {pending.pod.key} does not fit beside the containers already granted: {reasons}"
        )


def _envs(devices: list[Device], pending: Pending, config: PluginConfig) -> dict[str, str]:
    c = pending.container
    targets = sorted({d.target for d in devices})
    if c.mig is not None:
        memory = next(m.memory_mib for m in devices[0].gpu.mig_instances if m.uuid == c.mig.uuid)
    else:
        memory = min(g.memory_mib for g in c.gpus)
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(targets), "INFERGRID_GPU_MEMORY_MIB": str(memory)}
    if config.mps and c.kind == "share":
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory}M"
        if c.gpus[0].cores:
            envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(c.gpus[0].cores)
    return envs


def grant(
    device_ids: Iterable[str],
    known: dict[str, Device],
    node: str,
    pods: Iterable[PodRecord],
    ledger: Ledger,
    config: PluginConfig,
) -> Grant:
    """Decides one container request; honours it in `ledger` only when it succeeds."""
    pods = list(pods)
    devices = _devices(device_ids, known)
    pending = match(devices, node, pods, ledger, config.scheduler_name)
    _check_fit(devices, pending, ledger, config.vgpu_slots_per_gpu)
    ledger.honour(pending)
    cdi = tuple(f"nvidia.com/gpu={t}" for t in sorted({d.target for d in devices}))
    return Grant(pending, _envs(devices, pending, config), cdi if config.cdi else ())
