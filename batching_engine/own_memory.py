"""What this engine holds on its GPU outside torch's allocator, measured for its own process.

The KV cache gets what the budget leaves after weights, activations and what the process holds
outside torch (CUDA context, cuBLAS workspaces, Triton modules). CUDA's `mem_get_info` cannot
say the last on its own: on a GPU without MPS it is device-wide, so total - free - reserved
counts every neighbour's memory as ours, and an engine started next to another finds no room
for a cache. The measurement is chosen by what the device lets this process see, best first:

1. an isolated view: on a MIG instance, or as an MPS client whose pinned memory limit is in
   force, CUDA reports this process's slice alone, and total - free - reserved is ours;
2. NVML's used memory of our pid (everything the process holds, torch's reserve included).
   Inside a container NVML usually lists host pids, so ours is often not there;
3. the rise of the device's used memory (NVML, which needs no CUDA context) since a baseline
   read before this process created its context. A neighbour that allocated meanwhile makes
   it an over-estimate: this engine starts smaller, which is safe. One that freed meanwhile
   makes it an under-estimate, clamped so that the process holds at least what torch
   reserved (outside torch is then 0): the budget's utilisation margin absorbs a context;
4. without NVML or a baseline, the device-wide arithmetic, neighbours included: on a shared
   GPU the engine may then refuse to start, but never outgrows its share. It is flagged
   (`neighbours_included`) so the start-up log says so.

Whatever the measurement, the device must still have free what torch is about to allocate;
a GPU someone over-committed is refused with its numbers (`check_device_room`) rather than
served by a smaller engine. Everything here is arithmetic over plain numbers; the readings
come from torch.cuda and NVML through memory_meter.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from infergrid.errors import ContractError

MIB = 1 << 20
MPS_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
# CUDA reports a few hundred MiB less than NVML for a whole card (the driver's reserve), so
# only a view at least 5% smaller than the card counts as a slice. An MPS limit that large is
# hardly sharing, and the per-process and baseline measurements are right there too.
ISOLATED_FRACTION = 0.95
# How close CUDA's total must be to an MPS client's pinned limit for the limit to be in force.
MPS_LIMIT_TOLERANCE = 0.01
_MPS_SIZE = re.compile(r"(\d+)([MG])", re.IGNORECASE)
_MPS_UNITS = {"m": MIB, "g": 1 << 30}


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """A device as CUDA shows it to this process, in bytes: `free` and `total` from
    `torch.cuda.mem_get_info()` (device-wide on a plain GPU; within the pinned limit for an
    MPS client; the instance's on MIG), `reserved` from `torch.cuda.memory_reserved()`
    (everything torch's caching allocator holds)."""

    free: int
    total: int
    reserved: int

    @property
    def used(self) -> int:
        return self.total - self.free


@dataclass(frozen=True, slots=True)
class NvmlReading:
    """The same device as NVML shows it, in bytes: the whole card's size (the parent's on a
    MIG instance; None where NVML withholds it), whether CUDA's device is a MIG instance, the
    device's used memory, and each process's used memory by the pid NVML knows it by (None
    where NVML cannot say, NVML_VALUE_NOT_AVAILABLE)."""

    card_total: int | None
    is_mig: bool
    used: int
    processes: Mapping[int, int | None]


@dataclass(frozen=True, slots=True)
class OwnMemory:
    """What this process holds outside torch's allocator, and how that was measured."""

    outside_torch: int
    method: str
    neighbours_included: bool = False


def own_memory(
    memory: DeviceMemory,
    nvml: NvmlReading | None,
    *,
    pid: int,
    baseline_used: int | None,
    mps_limit: int | None,
    nvml_missing: str = "",
) -> OwnMemory:
    """The first measurement of the module's list that the readings allow. `nvml` is None
    where NVML is unavailable (`nvml_missing` says why); `baseline_used` is NVML's used
    memory of the device before this process's CUDA context, None where none was read."""
    isolated = isolated_view(memory.total, nvml, mps_limit)
    if isolated is not None:
        return _outside(memory, memory.used, f"isolated view: {isolated}")
    if nvml is None:
        return _device_wide(memory, f"NVML is unavailable ({nvml_missing or 'no reason given'})")
    listed = nvml.processes.get(pid)
    if listed is not None:
        return _outside(memory, listed, f"NVML's used memory of pid {pid}")
    why = f"pid {pid} {'has no memory figure' if pid in nvml.processes else 'is not listed'}"
    if baseline_used is None:
        return _device_wide(memory, f"{why}, no baseline")
    rise = nvml.used - baseline_used
    return _outside(memory, rise, f"device use since before this process's context ({why})")


def isolated_view(cuda_total: int, nvml: NvmlReading | None, mps_limit: int | None) -> str | None:
    """Why CUDA's numbers are this process's alone, or None when they may be the device's."""
    if nvml is not None and nvml.is_mig:
        return f"a MIG instance of {cuda_total // MIB} MiB"
    if mps_limit is not None and abs(cuda_total - mps_limit) <= mps_limit * MPS_LIMIT_TOLERANCE:
        return f"an MPS client within its pinned limit of {mps_limit // MIB} MiB"
    card = nvml.card_total if nvml is not None else None
    if card is not None and cuda_total < card * ISOLATED_FRACTION:
        return f"CUDA reports {cuda_total // MIB} MiB of the card's {card // MIB} MiB"
    return None


def _outside(memory: DeviceMemory, held: int, method: str) -> OwnMemory:
    """`held` is all the process holds; it holds at least what torch reserved."""
    return OwnMemory(max(held, memory.reserved) - memory.reserved, method)


def _device_wide(memory: DeviceMemory, why: str) -> OwnMemory:
    method = f"device-wide, neighbours included: {why}"
    return OwnMemory(max(0, memory.used - memory.reserved), method, neighbours_included=True)


def check_device_room(
    budget_bytes: int, torch_bytes: int, memory: DeviceMemory, own: OwnMemory
) -> None:
    """Refuses, with every number, a device whose free memory is less than torch still has to
    allocate to hold `torch_bytes` in all (weights, activations, KV cache): someone
    over-committed the GPU. Starting smaller would only hide it until the neighbour grows."""
    needs = torch_bytes - memory.reserved
    if needs <= memory.free:
        return
    held = memory.reserved + own.outside_torch
    others = max(0, memory.used - held)
    raise ContractError(
        "memory_budget_bytes",
        f"the device cannot give this engine its budget of {budget_bytes // MIB} MiB: it"
        f" still needs {needs // MIB} MiB on top of the {held // MIB} MiB it holds, but"
        f" {memory.free // MIB} MiB are free and other processes hold {others // MIB} MiB"
        " (an over-committed GPU, or a share larger than the MPS pinned limit)",
    )


def mps_pinned_limit(value: str | None, device_index: int) -> int | None:
    """Bytes of the MPS pinned memory limit for CUDA device `device_index`, from
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: "0=4096M,1=2G" (per device), or "4096M" (every
    device); M is MiB, G GiB. None where it sets none for this device."""
    if value is None or not value.strip():
        return None
    found = None
    for entry in value.split(","):
        index, _, size = entry.strip().rpartition("=")
        match = _MPS_SIZE.fullmatch(size.strip())
        if match is None or (index and not index.strip().isdigit()):
            raise ContractError(
                MPS_LIMIT_ENV, f"expected entries such as 0=4096M or 2G, got {value!r}"
            )
        if not index or int(index) == device_index:
            found = int(match.group(1)) * _MPS_UNITS[match.group(2).lower()]
    return found


def nvml_device_key(visible: str | None, cuda_index: int) -> int | str | None:
    """Which device NVML knows CUDA's device `cuda_index` as: an index, a "GPU-…" or
    "MIG-…" UUID, or None where CUDA_VISIBLE_DEVICES names it some other way. CUDA numbers
    the entries of CUDA_VISIBLE_DEVICES in order; an index entry is CUDA's index, which is
    NVML's (PCI order) on a machine of one GPU model, or with CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    if visible is None or not visible.strip():
        return cuda_index
    entries = [entry.strip() for entry in visible.split(",")]
    if cuda_index >= len(entries):
        return None
    entry = entries[cuda_index]
    if entry.isdigit():
        return int(entry)
    return entry if entry.startswith(("GPU-", "MIG-")) and "/" not in entry else None
