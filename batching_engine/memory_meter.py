"""The engine's readings of its own GPU memory: torch.cuda's numbers, NVML's, and its baseline.

`MemoryMeter` is opened for the runner's device before the process creates its CUDA context,
reading NVML's used memory of the device then (NVML needs no context); after the profile it
reads CUDA's and NVML's numbers again and hands them to own_memory.py, which decides. NVML
comes in through `ProcessNvml`: `SYSTEM_NVML` (pynvml, for this process's pid and environment)
or a test's fake (harness/simulated_gpu.py). Where NVML cannot answer (no driver library, no
nvidia-ml-py, a device it cannot find) the meter says why and the measurement falls back to
CUDA's device-wide numbers, neighbours included; the runner logs that as a warning.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol

from batching_engine.own_memory import (
    MPS_LIMIT_ENV,
    VISIBLE_ENV,
    DeviceMemory,
    NvmlReading,
    OwnMemory,
    mps_pinned_limit,
    nvml_device_key,
    own_memory,
)


class NvmlUnavailable(Exception):
    """NVML cannot answer for this device; the message says why, for the start-up log."""


class ProcessNvml(Protocol):
    """NVML as one process sees it: its pid and environment say which entry and which device
    are its own. Each call opens and closes NVML, so nothing is held between them."""

    @property
    def pid(self) -> int: ...

    @property
    def environ(self) -> Mapping[str, str]: ...

    def read(self, cuda_index: int) -> NvmlReading:
        """CUDA device `cuda_index` as NVML shows it; raises NvmlUnavailable."""
        ...


def read_device_memory(cuda: Any, device: object) -> DeviceMemory:
    """The numbers of `device` from `cuda`: torch.cuda, or a fake with the same two calls."""
    free, total = cuda.mem_get_info(device)
    return DeviceMemory(free=free, total=total, reserved=cuda.memory_reserved(device))


class MemoryMeter:
    """This process's memory on CUDA device `index` (torch's "cuda" is device 0 for the
    engine's loader). Open it before the process's CUDA context exists: the baseline is read
    then. The TP workers' ranks open theirs after, so theirs includes their context."""

    def __init__(self, index: int, cuda: Any, nvml: ProcessNvml) -> None:
        self.index, self.cuda, self.nvml = index, cuda, nvml
        self.baseline_used: int | None = None
        self.missing = ""
        try:
            self.baseline_used = nvml.read(index).used
        except NvmlUnavailable as err:
            self.missing = str(err)

    def measure(self, device: object) -> tuple[DeviceMemory, OwnMemory]:
        """CUDA's numbers for `device` (the same device, as torch names it) and what the
        process holds outside torch."""
        memory = read_device_memory(self.cuda, device)
        reading, missing = None, self.missing
        if not missing:
            try:
                reading = self.nvml.read(self.index)
            except NvmlUnavailable as err:
                missing = str(err)
        limit = mps_pinned_limit(self.nvml.environ.get(MPS_LIMIT_ENV), self.index)
        own = own_memory(memory, reading, pid=self.nvml.pid, baseline_used=self.baseline_used,
                         mps_limit=limit, nvml_missing=missing)  # fmt: skip
        return memory, own


class SystemNvml:
    """The driver's NVML through pynvml, for this process."""

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def environ(self) -> Mapping[str, str]:
        return os.environ

    def read(self, cuda_index: int) -> NvmlReading:
        key = nvml_device_key(self.environ.get(VISIBLE_ENV), cuda_index)
        if key is None:
            raise NvmlUnavailable(
                f"{VISIBLE_ENV}={self.environ.get(VISIBLE_ENV)!r} names CUDA device {cuda_index}"
                " in a form NVML cannot look up"
            )
        try:
            import pynvml
        except ImportError:
            raise NvmlUnavailable("nvidia-ml-py (pynvml) is not installed") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise NvmlUnavailable(f"nvmlInit: {err}") from None
        try:
            return _reading(pynvml, key)
        except pynvml.NVMLError as err:
            raise NvmlUnavailable(f"NVML device {key} (CUDA device {cuda_index}): {err}") from None
        finally:
            pynvml.nvmlShutdown()


def _reading(pynvml: Any, key: int | str) -> NvmlReading:
    if isinstance(key, int):
        handle = pynvml.nvmlDeviceGetHandleByIndex(key)
    else:
        handle = pynvml.nvmlDeviceGetHandleByUUID(key)
    card, is_mig = handle, bool(pynvml.nvmlDeviceIsMigDeviceHandle(handle))
    if is_mig:
        card = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    else:  # CUDA never runs on a MIG-enabled card itself, only on its instances
        is_mig = _mig_enabled(pynvml, handle)
    if is_mig:  # CUDA's own view is the instance's; a MIG-enabled card withholds the rest
        return NvmlReading(_card_total(pynvml, card), True, used=0, processes={})
    processes = {
        p.pid: _known(pynvml, p.usedGpuMemory)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    }
    return NvmlReading(
        card_total=_card_total(pynvml, card),
        is_mig=False,
        used=pynvml.nvmlDeviceGetMemoryInfo(handle).used,
        processes=processes,
    )


def _mig_enabled(pynvml: Any, handle: Any) -> bool:
    try:
        current, _ = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:  # not MIG-capable
        return False
    return current == pynvml.NVML_DEVICE_MIG_ENABLE


def _card_total(pynvml: Any, card: Any) -> int | None:
    """A MIG-enabled card's memory needs MIG monitoring privileges; without them, None."""
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(card).total
    except pynvml.NVMLError:
        return None


def _known(pynvml: Any, used: int | None) -> int | None:
    return None if used in (None, pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value) else used


SYSTEM_NVML = SystemNvml()
