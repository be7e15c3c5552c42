"""What a prepared claim gives its containers: pure over the claim as the API server has it.

Each of the claim's results for this driver and this node's pool becomes one CDI device,
``<claim uid>-<n>``, whose edits show the container its GPU or MIG instance and hand it the
same environment a device-plugin holder gets (infergrid/share_edits.py): the memory budget
and, for a share on an MPS node, the daemon and its limits. Any result that cannot be
mapped fails the whole claim with an error naming it, so the kubelet retries and the pod
never starts with part of its GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dra_driver.slices import NodeDevice
from infergrid import dra
from infergrid.errors import ContractError
from infergrid.quantity import parse_whole_quantity
from infergrid.share_edits import ALL_CORES, Mount, share_edits

VISIBLE_DEVICES_ENV: Final = "NVIDIA_VISIBLE_DEVICES"
MIB: Final = 1 << 20
SHOWN_CHARS: Final = 80
"""How much of a name from a request an error repeats: enough to find it, never a flood."""


class PrepareError(Exception):
    """A claim that cannot be prepared; the message is the claim's error for the kubelet."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"ResourceClaim {shown(self.namespace)}/{shown(self.name)} ({shown(self.uid)})"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One allocated device: the kubelet's answer for it and its CDI device's edits."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_name: str
    share_id: str | None
    envs: dict[str, str]
    mounts: tuple[Mount, ...]


def shown(value: str) -> str:
    """``value`` quoted for a message: escaped (a lone surrogate cannot reach the wire) and cut."""
    text = repr(value[: SHOWN_CHARS + 1])
    return text if len(value) <= SHOWN_CHARS else f"{text}..."


def prepare_claim(
    ref: ClaimRef,
    claim: Mapping[str, Any],
    node: str,
    devices: Mapping[str, NodeDevice],
    mps_root: Path | None,
) -> list[PreparedDevice]:
    """The devices of ``claim`` on this node; raises PrepareError naming what is wrong.

    ``mps_root`` is the MPS root on an MPS node, else None.
    """
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise PrepareError(f"{ref}: the API server has uid {shown(str(uid))}, a different claim")
    results = [r for r in _results(claim, ref) if _ours(r, node)]
    visible = _visible_by_request(results, devices)
    return [
        _prepared(ref, n, result, devices, visible, mps_root) for n, result in enumerate(results)
    ]


def _results(claim: Mapping[str, Any], ref: ClaimRef) -> list[dict]:
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise PrepareError(f"{ref} is not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        raise PrepareError(f"{ref}: status.allocation.devices.results is not a list of results")
    return results


def _ours(result: Mapping[str, Any], node: str) -> bool:
    return result.get("driver") == dra.DRIVER and result.get("pool") == node


def _visible_by_request(results: list[dict], devices: Mapping[str, NodeDevice]) -> dict[str, str]:
    """Request -> the UUIDs its devices show: a container gets one request's devices, so each
    device's edits name all of them and whichever edit applies last, the container sees all."""
    uuids: dict[str, list[str]] = {}
    for result in results:
        device = devices.get(result.get("device", ""))
        if device is not None:
            uuids.setdefault(str(result.get("request", "")), []).append(device.uuid)
    return {request: ",".join(dict.fromkeys(found)) for request, found in uuids.items()}


def _prepared(
    ref: ClaimRef,
    n: int,
    result: Mapping[str, Any],
    devices: Mapping[str, NodeDevice],
    visible: Mapping[str, str],
    mps_root: Path | None,
) -> PreparedDevice:
    name = str(result.get("device", ""))
    device = devices.get(name)
    if device is None:
        raise PrepareError(f"{ref}: device {shown(name)} is not a device of this node")
    request = str(result.get("request", ""))
    share_id = result.get("shareID")
    memory_mib, cores, share = _budget(ref, result, device, mps_root is not None)
    envs, mounts = share_edits(memory_mib, mps_root if share else None, device.uuid, cores)
    return PreparedDevice(
        request_names=_request_names(request),
        pool=str(result["pool"]),
        device=name,
        cdi_name=f"{ref.uid}-{n}",
        share_id=str(share_id) if share_id else None,
        envs={VISIBLE_DEVICES_ENV: visible[request], **envs},
        mounts=mounts,
    )


def _request_names(request: str) -> tuple[str, ...]:
    """The request, and for a subrequest (``main/sub``) its main request too: a container
    names the main one in ``resources.claims[].request``."""
    main = request.split("/", 1)[0]
    return (request,) if main == request else (main, request)


def _budget(
    ref: ClaimRef, result: Mapping[str, Any], device: NodeDevice, mps: bool
) -> tuple[int, int, bool]:
    """(memory MiB, cores percent, whether it is a share of the GPU).

    A share is a result on a shared GPU that consumed less than all its memory. Its cores
    are what it consumed; where that is 0 on an MPS node, its memory's part of the GPU
    (rounded up), so a share of a quarter of the memory runs on a quarter of the SMs.
    """
    consumed = result.get("consumedCapacity") or {}
    memory = _consumed(ref, consumed, dra.CAP_MEMORY)
    cores = _consumed(ref, consumed, dra.CAP_CORES)
    memory_mib = device.memory_mib if memory is None else memory // MIB
    if device.mig or memory_mib >= device.memory_mib:
        return device.memory_mib, ALL_CORES, False
    if memory_mib <= 0:
        raise PrepareError(f"{ref}: device {shown(device.name)} has less than 1Mi of memory")
    if not cores and mps:
        cores = math.ceil(ALL_CORES * memory_mib / device.memory_mib)
    return memory_mib, min(cores or ALL_CORES, ALL_CORES), True


def _consumed(ref: ClaimRef, consumed: Mapping[str, Any], capacity: str) -> int | None:
    """A consumed capacity, by its name or qualified by the driver; None when absent."""
    raw = consumed.get(capacity, consumed.get(f"{dra.DRIVER}/{capacity}"))
    if raw is None:
        return None
    try:
        return parse_whole_quantity(raw, f"consumedCapacity.{capacity}")
    except ContractError as err:
        raise PrepareError(f"{ref}: {err}") from None
