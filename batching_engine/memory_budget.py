"""How much memory the engine may use, from its flags and the device plugin's environment.

On a GPU the budget covers everything the engine allocates (weights, activations, KV cache):
the share the device plugin granted (`INFERGRID_GPU_MEMORY_MIB`), or the whole card when the
pod has whole GPUs, times `--gpu-memory-utilization` to leave room for the CUDA context and
the allocator's slack. On a CPU the weights live in ordinary memory and `--kv-cache-memory`
sizes the KV cache alone. These are pure functions: the caller passes the environment and the
card's size, so they are tested without a GPU.

Once the engine has started (weights loaded, a step profiled), part of the device is held
outside torch's allocator: the CUDA context, cuBLAS workspaces, loaded Triton modules. That
can be most of a small MPS share or a 1g MIG slice, so the runner reads the device's numbers
(`DeviceMemory`) and gives torch only what is left (`torch_budget_bytes`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from infergrid.errors import ContractError

GPU_MEMORY_ENV = "INFERGRID_GPU_MEMORY_MIB"
UTILIZATION_FLAG = "--gpu-memory-utilization"
KV_CACHE_FLAG = "--kv-cache-memory"
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_CPU_KV_CACHE_MEMORY = "1GiB"
MIB = 1 << 20

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "ki": 1 << 10, "kib": 1 << 10,
    "m": 10**6, "mb": 10**6, "mi": 1 << 20, "mib": 1 << 20,
    "g": 10**9, "gb": 10**9, "gi": 1 << 30, "gib": 1 << 30,
    "t": 10**12, "tb": 10**12, "ti": 1 << 40, "tib": 1 << 40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """What the runner may allocate. `total_bytes` bounds weights + activations + KV cache;
    `kv_cache_bytes` sizes the KV cache directly. At least one is set; `source` says where
    the numbers came from, for the startup log."""

    total_bytes: int | None
    kv_cache_bytes: int | None
    source: str


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """A device's memory as seen after start-up, in bytes: `free` and `total` from
    `torch.cuda.mem_get_info()` (under an MPS share, within the client's pinned memory
    limit; on a MIG instance, the instance's), `reserved` from `torch.cuda.memory_reserved()`
    (everything torch's caching allocator holds)."""

    free: int
    total: int
    reserved: int

    @property
    def outside_torch(self) -> int:
        """In use on the device but not by torch's allocator: the CUDA context, cuBLAS
        workspaces, Triton's modules."""
        return max(0, self.total - self.free - self.reserved)


def read_device_memory(cuda: object, device: object) -> DeviceMemory:
    """The numbers of `device` from `cuda`: torch.cuda, or a fake with the same two calls."""
    free, total = cuda.mem_get_info(device)
    return DeviceMemory(free=free, total=total, reserved=cuda.memory_reserved(device))


def torch_budget_bytes(budget_bytes: int, memory: DeviceMemory) -> int:
    """What torch's allocator may hold in all (weights, activations, KV cache): the budget
    less what is held outside torch, and never more than torch holds now plus what is free."""
    return min(budget_bytes - memory.outside_torch, memory.reserved + memory.free)


def parse_memory_size(text: str, field: str) -> int:
    """Bytes in "512MiB", "2GiB", "1.5G", "750MB" or "1048576"; binary units are powers of 2."""
    match = _SIZE.match(text) if isinstance(text, str) else None
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ContractError(field, f"expected a size such as 512MiB or 2GiB, got {text!r}")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ContractError(field, f"must be more than 0 bytes, got {text!r}")
    return size


def resolve_memory_budget(
    *,
    device: str,
    environ: Mapping[str, str],
    gpu_memory_utilization: float | None = None,
    kv_cache_memory: str | None = None,
    device_total_bytes: int | None = None,
) -> MemoryBudget:
    """The budget for `device` ("cpu" or "cuda[:N]"); `device_total_bytes` is the card's size,
    needed on a GPU when the device plugin set no share."""
    if device.split(":")[0] == "cuda":
        return _gpu_budget(environ, gpu_memory_utilization, kv_cache_memory, device_total_bytes)
    if device != "cpu":
        raise ContractError("device", f"expected cpu, cuda or cuda:N, got {device!r}")
    if gpu_memory_utilization is not None:
        raise ContractError(UTILIZATION_FLAG, f"applies to GPUs only; on CPU use {KV_CACHE_FLAG}")
    text = kv_cache_memory or DEFAULT_CPU_KV_CACHE_MEMORY
    return MemoryBudget(None, parse_memory_size(text, KV_CACHE_FLAG), f"{KV_CACHE_FLAG} {text}")


def _gpu_budget(
    environ: Mapping[str, str],
    utilization: float | None,
    kv_cache_memory: str | None,
    device_total_bytes: int | None,
) -> MemoryBudget:
    utilization = DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None else utilization
    if isinstance(utilization, bool) or not isinstance(utilization, int | float):
        raise ContractError(UTILIZATION_FLAG, f"expected a fraction, got {utilization!r}")
    if not 0.0 < utilization <= 1.0:
        raise ContractError(UTILIZATION_FLAG, f"must be in (0, 1], got {utilization}")
    share = environ.get(GPU_MEMORY_ENV)
    if share is not None:
        base, where = _share_bytes(share), f"{GPU_MEMORY_ENV}={share.strip()}"
    elif device_total_bytes is not None and device_total_bytes > 0:
        base, where = device_total_bytes, f"the whole GPU ({device_total_bytes // MIB} MiB)"
    else:
        raise ContractError(GPU_MEMORY_ENV, "is not set and the GPU's size is unknown")
    kv_bytes = (
        None if kv_cache_memory is None else parse_memory_size(kv_cache_memory, KV_CACHE_FLAG)
    )
    total = int(base * utilization)
    source = f"{where} x {UTILIZATION_FLAG} {utilization}"
    if kv_bytes is not None and kv_bytes >= total:
        raise ContractError(KV_CACHE_FLAG, f"{kv_cache_memory} does not fit in {source}")
    return MemoryBudget(total, kv_bytes, source)


def _share_bytes(value: str) -> int:
    text = value.strip()
    if not text.isdigit() or int(text) <= 0:
        raise ContractError(
            GPU_MEMORY_ENV, f"expected a positive whole number of MiB, got {value!r}"
        )
    return int(text) * MIB
