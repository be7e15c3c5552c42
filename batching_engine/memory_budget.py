"""How much memory the engine may use, from its flags and the device plugin's environment.

On a GPU the budget covers everything the engine allocates (weights, activations, KV cache):
the share the device plugin granted (`INFERGRID_GPU_MEMORY_MIB`), or the whole card when the
pod has whole GPUs, times `--gpu-memory-utilization` to leave room for the CUDA context and
the allocator's slack. On a CPU the weights live in ordinary memory and `--kv-cache-memory`
sizes the KV cache alone. These are pure functions: the caller passes the environment and the
card's size, so they are tested without a GPU.

What part of the budget torch's allocator may take is decided later, once the engine has
started: own_memory.py measures what its process holds outside torch (CUDA context, cuBLAS
workspaces, Triton modules), which can be most of a small MPS share or a 1g MIG slice.
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
    needed on a GPU when the device plugin set no share. On a CPU `gpu_memory_utilization`
    is ignored: every serving file carries the CRD's default, CPU engines' too."""
    if device.split(":")[0] == "cuda":
        return _gpu_budget(environ, gpu_memory_utilization, kv_cache_memory, device_total_bytes)
    if device != "cpu":
        raise ContractError("device", f"expected cpu, cuda or cuda:N, got {device!r}")
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
