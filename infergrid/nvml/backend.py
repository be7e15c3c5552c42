"""The one interface to the GPUs of a node, and the plain data it returns.

Discovery, health checks and the servicers see GPUs only through
``NvmlBackend``; ``RealNvml`` implements it on NVML and ``FakeNvml`` on a fleet
file, so everything above this seam runs the same with or without a GPU.
"""

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from infergrid.inventory import EccState, Gpu, GpuLink, MigInstance


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

    def published(
        self,
        healthy: bool,
        mig_instances: tuple[MigInstance, ...],
        links: tuple[GpuLink, ...],
        ecc: EccState | None = None,
    ) -> Gpu:
        """The GPU as a node agent offers it (device plugin inventory, DRA slices): MIG
        instances only where MIG is on."""
        return Gpu(
            uuid=self.uuid,
            index=self.index,
            model=self.model,
            memory_mib=self.memory_mib,
            sm_count=self.sm_count,
            compute_capability=self.compute_capability,
            numa_node=self.numa_node,
            healthy=healthy,
            mig_enabled=self.mig_enabled,
            mig_instances=mig_instances if self.mig_enabled else (),
            links=links,
            ecc=ecc,
        )


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical XID error the driver reported for the GPU ``uuid``."""

    uuid: str
    xid: int


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process with memory on a GPU or MIG instance, by its PID as the driver sees it (host)."""

    pid: int
    used_mib: int


@dataclass(frozen=True, slots=True)
class MigTelemetry:
    """One MIG instance's reading; None where NVML does not offer the value on it.

    Power, temperature, clocks and links belong to the GPU, so an instance has only its own
    memory and processes.
    """

    uuid: str
    memory_used_mib: int | None = None
    processes: tuple[GpuProcess, ...] | None = None


@dataclass(frozen=True, slots=True)
class Telemetry:
    """One reading of a GPU; None for each value NVML does not offer on it (NOT_SUPPORTED).

    Unsupported is no fault: a PCIe card has no NVLink, a GPU in MIG mode no utilisation,
    and a caller without MIG monitoring privileges no processes of MIG instances.
    ``throttle_reasons`` is NVML's clocks-event bitmask (``nvmlClocksEventReason*``), the
    NVLink values are the driver's byte counters since it loaded, summed over the links, and
    a MIG-enabled GPU's processes are its instances' (in ``mig``).
    """

    utilization_percent: int | None = None
    memory_bandwidth_percent: int | None = None
    memory_used_mib: int | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    temperature_celsius: int | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    throttle_reasons: int | None = None
    pcie_tx_bytes_per_second: int | None = None
    pcie_rx_bytes_per_second: int | None = None
    nvlink_tx_bytes: int | None = None
    nvlink_rx_bytes: int | None = None
    processes: tuple[GpuProcess, ...] | None = None
    mig: tuple[MigTelemetry, ...] = ()


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

    def telemetry(self, index: int) -> Telemetry:
        """GPU ``index``'s power, heat, clocks, links and processes now, and its MIG instances'."""
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
