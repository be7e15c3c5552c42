"""The one interface to the GPUs of a node, and the plain data it returns.

Discovery, health checks and the servicers see GPUs only through
``NvmlBackend``; ``RealNvml`` implements it on NVML and ``FakeNvml`` on a fleet
file, so everything above this seam runs the same with or without a GPU.
"""

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from infergrid.inventory import EccState, GpuLink, MigInstance


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What identifies one GPU and what it has, as NVML reports it."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    sm_count: int
    compute_capability: str
    numa_node: int
    mig_enabled: bool


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical XID error the driver reported for the GPU ``uuid``."""

    uuid: str
    xid: int


class NvmlError(Exception):
    """An NVML call failed; it names the call and the GPU so the log points at the device."""

    def __init__(self, call: str, index: int | None, reason: str) -> None:
        where = call if index is None else f"{call} on GPU {index}"
        super().__init__(f"{where}: {reason}")
        self.call = call
        self.index = index
        self.reason = reason


@runtime_checkable
class NvmlBackend(Protocol):
    """The GPUs of one node, by NVML index; every call may raise NvmlError.

    Implementations are safe to call from several threads, and
    ``wait_for_events`` may block one thread while others read the devices.
    """

    def device_count(self) -> int:
        """How many GPUs NVML sees."""
        ...

    def device_info(self, index: int) -> DeviceInfo:
        """Identity and size of GPU ``index``."""
        ...

    def mig_instances(self, index: int) -> tuple[MigInstance, ...]:
        """The MIG instances of GPU ``index``; empty when MIG is off."""
        ...

    def links(self, index: int) -> tuple[GpuLink, ...]:
        """How GPU ``index`` reaches each other GPU: its closest connection, one per peer."""
        ...

    def memory_used_mib(self, index: int) -> int:
        """Memory in use on GPU ``index`` right now, by anyone."""
        ...

    def utilization_percent(self, index: int) -> int:
        """Percent of recent time GPU ``index`` ran a kernel, 0 to 100."""
        ...

    def ecc_state(self, index: int) -> EccState:
        """GPU ``index``'s double-bit ECC record; None for each value NVML does not support."""
        ...

    def wait_for_events(self, timeout_s: float) -> tuple[XidEvent, ...]:
        """XID events already pending, or the first to come within ``timeout_s``."""
        ...

    def close(self) -> None:
        """Release NVML; wakes a thread blocked in ``wait_for_events`` as soon as it can."""
        ...
