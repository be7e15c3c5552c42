"""The NvmlBackend on the NVIDIA driver, through pynvml.

It imports cleanly on a machine without a GPU or driver; constructing
``RealNvml`` there raises NvmlError naming ``nvmlInit``. Every pynvml error
becomes an NvmlError naming the NVML function and the GPU index, so callers
handle one error type. The decisions (MIG profile names, link types, PCI
addresses) are small pure functions, tested without a GPU.

What NVML refuses is not taken for a fault where another call answers:

- A MIG-enabled GPU has no core count (``NOT_SUPPORTED``): its SMs are those of
  its full-GPU (7-slice) instance profile, its instances' SMs their own.
- A MIG-enabled GPU's memory is read only by a caller with MIG monitoring
  privileges (``NVIDIA_MIG_MONITOR_DEVICES=all`` and ``CAP_SYS_ADMIN``), else
  ``NO_PERMISSION``. Without them one warning per GPU says so; its size is then
  that of the MIG family whose full-GPU profile it has (or that profile's
  memory, for a GPU the table lacks), and its memory in use the sum of its MIG
  devices'. The GPU stays healthy; it turns unhealthy only on other errors.
- Topology is optional: an NVLink whose far end cannot be read carries nothing,
  and two GPUs whose common ancestor NVML cannot name (VMs, containers that
  see part of the machine) are a ``system`` apart, the farthest level.
- An ECC value the GPU or driver does not have is None: all of them with ECC
  off or on a GPU without ECC, retired pages from Ampere on (rows are remapped
  instead), remapped rows before Ampere.
- A telemetry value NVML withholds is None: not supported on this GPU or driver
  (NVLink on a PCIe card, utilisation in MIG mode), or not to this caller
  (NO_PERMISSION: processes of MIG instances without MIG monitoring privileges).
"""

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import pynvml

from infergrid.constants import (
    LINK_HOST_BRIDGE,
    LINK_NUMA,
    LINK_NVLINK,
    LINK_PCIE_SWITCH,
    LINK_SYSTEM,
)
from infergrid.inventory import EccState, GpuLink, MigInstance
from infergrid.mig import MIG_FAMILIES
from infergrid.nvml.backend import (
    DeviceInfo,
    GpuProcess,
    MigTelemetry,
    NvmlError,
    Telemetry,
    XidEvent,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_MIB: Final = 1024 * 1024
_SYSFS_PCI_DEVICES: Final = Path("/sys/bus/pci/devices")

_LINK_BY_TOPOLOGY_LEVEL: Final = {
    pynvml.NVML_TOPOLOGY_INTERNAL: LINK_PCIE_SWITCH,  # two GPUs on one board
    pynvml.NVML_TOPOLOGY_SINGLE: LINK_PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_MULTIPLE: LINK_PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: LINK_HOST_BRIDGE,
    pynvml.NVML_TOPOLOGY_NODE: LINK_NUMA,
    pynvml.NVML_TOPOLOGY_SYSTEM: LINK_SYSTEM,
}

_CORES_PER_SM_64: Final = frozenset({"6.0", "7.0", "7.2", "7.5", "8.0"})
"""Compute capabilities with 64 CUDA cores per SM; every other one since Pascal has 128."""

_UNSUPPORTED: Final = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)
_WITHHELD: Final = (*_UNSUPPORTED, pynvml.NVMLError_NoPermission)
"""What makes a telemetry value absent rather than a fault of the GPU."""
_UNSUPPORTED_CODES: Final = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NO_PERMISSION,
    }
)
"""The same, as the return codes of single field values."""
_ALL_LINKS: Final = 0xFFFFFFFF
"""The scope of an NVLink throughput field that sums every link (UINT_MAX)."""

_MEMORY_TOLERANCE: Final = 20
"""A full-GPU profile matches a MIG family's when its memory is within 1/20 (5%)."""

MISSING_MIG_PRIVILEGES: Final = (
    "%s: NVML_ERROR_NO_PERMISSION reading memory of a MIG-enabled GPU: run the plugin "
    "with NVIDIA_MIG_MONITOR_DEVICES=all and CAP_SYS_ADMIN (chart: devicePlugin.migMonitoring=true)"
    "; until then its memory use is its MIG devices'"
)
"""The one warning per GPU whose memory NVML withholds; ``%s`` is the GPU's uuid."""


# Pure helpers.


def link_type(topology_level: int) -> str:
    """The contract's link type for an NVML topology level; an unknown level counts as farthest."""
    return _LINK_BY_TOPOLOGY_LEVEL.get(topology_level, LINK_SYSTEM)


def mig_profile_name(
    gpu_slices: int, compute_slices: int, memory_mib: int, gpu_memory_mib: int
) -> str:
    """NVIDIA's name for a MIG instance, like ``3g.40gb``, from what NVML reports of it.

    The memory part is the instance's share of the GPU rounded up to eighths,
    times the GPU's size in whole GB, rounded: an instance of 40192 MiB on an
    80 GB A100 is a ``40gb``, not a ``39gb``. A compute instance smaller than its
    GPU instance gets a ``<c>c.`` prefix, as in ``1c.3g.40gb``.
    """
    eighths = -(-memory_mib * 8 // gpu_memory_mib)
    gpu_gb = -(-gpu_memory_mib // 1024)
    gb = (eighths * gpu_gb + 4) // 8
    name = f"{gpu_slices}g.{gb}gb"
    return name if compute_slices in (0, gpu_slices) else f"{compute_slices}c.{name}"


def mig_gpu_memory_mib(model: str, full_profile_mib: int) -> int:
    """A MIG-enabled GPU's memory when NVML withholds it, from its full-GPU profile's memory.

    The size of the MIG family named in ``model`` whose full-GPU profile has
    about this memory, so MIG profile names come out as with the real size;
    the profile's own memory (a little less) for a GPU the table lacks.
    """
    for family in MIG_FAMILIES:
        full = max(family.profiles.values())
        named = family.matches(model, family.memory_mib)
        if named and abs(full - full_profile_mib) <= full // _MEMORY_TOLERANCE:
            return family.memory_mib
    return full_profile_mib


def sm_count_from_cores(cores: int, compute_capability: str) -> int:
    """SMs from CUDA cores, for GPUs whose driver reports no SM count."""
    return cores // (64 if compute_capability in _CORES_PER_SM_64 else 128)


def pci_address(bus_id: str) -> str:
    """A PCI bus id as Linux writes it: NVML's ``00000000:3B:00.0`` is ``0000:3b:00.0``."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def sysfs_numa_node(bus_id: str, devices: Path = _SYSFS_PCI_DEVICES) -> int:
    """The NUMA node Linux gives a PCI device; 0 when it has none (-1) or cannot be read."""
    try:
        node = int((devices / pci_address(bus_id) / "numa_node").read_text())
    except (OSError, ValueError):
        return 0
    return max(node, 0)


@dataclass(frozen=True, slots=True)
class NvLinkEnds:
    """Where one GPU's active NVLinks lead: other GPUs, by PCI address, and NVSwitches."""

    gpus: dict[str, int] = field(default_factory=dict)
    switch_links: int = 0


def nvlink_count(mine: NvLinkEnds, peer_address: str, peer: NvLinkEnds) -> int:
    """NVLinks between two GPUs: direct ones, plus, on an NVSwitch system, the fewer fabric links.

    On an NVSwitch system every GPU reaches every other through the switches,
    at the bandwidth of the GPU with fewer links into the fabric.
    """
    return mine.gpus.get(peer_address, 0) + min(mine.switch_links, peer.switch_links)


# Calling NVML.


def _call(fn: Callable[..., T], index: int | None, *args: Any) -> T:
    """``fn(*args)``, with an NVML failure raised as NvmlError naming ``fn`` and the GPU."""
    try:
        return fn(*args)
    except pynvml.NVMLError as error:
        raise NvmlError(fn.__name__, index, str(error)) from error


def _optional(
    fn: Callable[..., T], index: int | None, *args: Any, absent: tuple[type, ...] = _UNSUPPORTED
) -> T | None:
    """``fn(*args)``, or None where NVML answers one of ``absent`` (by default: unsupported)."""
    try:
        return fn(*args)
    except absent:
        return None
    except pynvml.NVMLError as error:
        raise NvmlError(fn.__name__, index, str(error)) from error


def _offered(fn: Callable[..., T], index: int, *args: Any) -> T | None:
    """A telemetry value: ``fn(*args)``, or None where NVML withholds it here."""
    return _optional(fn, index, *args, absent=_WITHHELD)


def _first_offered(index: int, *calls: tuple[Any, ...]) -> Any | None:
    """The first value offered of ``calls`` (function, args...): a newer call, then its old name."""
    for fn, *args in calls:
        value = _offered(fn, index, *args)
        if value is not None:
            return value
    return None


class RealNvml:
    """An ``NvmlBackend`` on the driver; NVML itself is thread-safe.

    Construction initialises NVML and subscribes to critical XID events of
    every GPU that supports them; a GPU that does not is still probed by the
    health monitor. ``close`` waits for a running ``wait_for_events`` to return
    before it frees the event set, so it takes up to that call's timeout;
    afterwards every call raises NvmlError, as on a shut-down NVML.
    """

    def __init__(self) -> None:
        _call(pynvml.nvmlInit, None)
        self._closed = threading.Event()
        self._withheld_lock = threading.Lock()
        self._withheld: set[str] = set()  # GPUs whose memory NVML withholds, warned about once
        self._event_lock = threading.Lock()
        try:
            self._event_set = self._watch_xids()
        except NvmlError:
            _call(pynvml.nvmlShutdown, None)
            raise

    def device_count(self) -> int:
        return _call(pynvml.nvmlDeviceGetCount, None)

    def device_info(self, index: int) -> DeviceInfo:
        handle = _handle(index)
        major, minor = _call(pynvml.nvmlDeviceGetCudaComputeCapability, index, handle)
        capability = f"{major}.{minor}"
        mig_enabled = _mig_enabled(handle, index)
        full_profile = _full_gpu_profile(handle, index) if mig_enabled else None
        if full_profile is not None:
            sm_count = full_profile.multiprocessorCount
        else:
            sm_count = _sm_count(handle, index, capability)
        return DeviceInfo(
            index=index,
            uuid=_call(pynvml.nvmlDeviceGetUUID, index, handle),
            model=_call(pynvml.nvmlDeviceGetName, index, handle),
            memory_mib=self._total_mib(handle, index, full_profile),
            sm_count=sm_count,
            compute_capability=capability,
            numa_node=_numa_node(handle, index),
            mig_enabled=mig_enabled,
        )

    def mig_instances(self, index: int) -> tuple[MigInstance, ...]:
        handle = _handle(index)
        if not _mig_enabled(handle, index):
            return ()
        gpu_mib = self._total_mib(handle, index, _full_gpu_profile(handle, index))
        return tuple(_mig_instance(mig, index, gpu_mib) for mig in _mig_devices(handle, index))

    def links(self, index: int) -> tuple[GpuLink, ...]:
        handle = _handle(index)
        mine = _nvlink_ends(handle, index)
        peers = (peer for peer in range(self.device_count()) if peer != index)
        return tuple(_link(handle, index, mine, peer) for peer in peers)

    def memory_used_mib(self, index: int) -> int:
        """A MIG-enabled GPU's aggregate needs privileges; without them, its MIG devices' sum."""
        handle = _handle(index)
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(handle).used // _MIB
        except pynvml.NVMLError_NoPermission as error:
            if not _mig_enabled(handle, index):
                raise NvmlError("nvmlDeviceGetMemoryInfo", index, str(error)) from error
            self._warn_withheld(handle, index)
        except pynvml.NVMLError as error:
            raise NvmlError("nvmlDeviceGetMemoryInfo", index, str(error)) from error
        used = (
            _call(pynvml.nvmlDeviceGetMemoryInfo, index, mig).used
            for mig in _mig_devices(handle, index)
        )
        return sum(used) // _MIB

    def utilization_percent(self, index: int) -> int:
        """0 for a GPU in MIG mode, where NVML does not measure utilisation."""
        rates = _optional(pynvml.nvmlDeviceGetUtilizationRates, index, _handle(index))
        return rates.gpu if rates is not None else 0

    def telemetry(self, index: int) -> Telemetry:
        """What NVML offers of GPU ``index`` now; each value it withholds here is None.

        Memory in use is read as ``memory_used_mib`` reads it. A GPU in MIG mode has no
        utilisation, and its processes are read per instance, where the driver keeps them.
        """
        handle = _handle(index)
        rates = _offered(pynvml.nvmlDeviceGetUtilizationRates, index, handle)
        mig_enabled = _mig_enabled(handle, index)
        migs = _mig_devices(handle, index) if mig_enabled else []
        nvlink_tx, nvlink_rx = _nvlink_bytes(handle, index)
        return Telemetry(
            utilization_percent=None if rates is None else rates.gpu,
            memory_bandwidth_percent=None if rates is None else rates.memory,
            memory_used_mib=self.memory_used_mib(index),
            power_watts=_watts(_offered(pynvml.nvmlDeviceGetPowerUsage, index, handle)),
            power_limit_watts=_watts(
                _offered(pynvml.nvmlDeviceGetEnforcedPowerLimit, index, handle)
            ),
            temperature_celsius=_first_offered(
                index,
                (pynvml.nvmlDeviceGetTemperatureV, handle, pynvml.NVML_TEMPERATURE_GPU),
                (pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            ),
            sm_clock_mhz=_clock_mhz(handle, index, pynvml.NVML_CLOCK_SM),
            memory_clock_mhz=_clock_mhz(handle, index, pynvml.NVML_CLOCK_MEM),
            throttle_reasons=_first_offered(
                index,
                (pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle),
                (pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle),
            ),
            pcie_tx_bytes_per_second=_pcie_bytes(handle, index, pynvml.NVML_PCIE_UTIL_TX_BYTES),
            pcie_rx_bytes_per_second=_pcie_bytes(handle, index, pynvml.NVML_PCIE_UTIL_RX_BYTES),
            nvlink_tx_bytes=nvlink_tx,
            nvlink_rx_bytes=nvlink_rx,
            processes=None if mig_enabled else _processes(handle, index),
            mig=tuple(_mig_telemetry(mig, index) for mig in migs),
        )

    def ecc_state(self, index: int) -> EccState:
        """Nothing with ECC off; retired pages before Ampere, remapped rows from Ampere on."""
        handle = _handle(index)
        modes = _optional(pynvml.nvmlDeviceGetEccMode, index, handle)
        if modes is None or modes[0] != pynvml.NVML_FEATURE_ENABLED:
            return EccState()
        retired = _optional(
            pynvml.nvmlDeviceGetRetiredPages,
            index,
            handle,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        pending = _optional(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, index, handle)
        rows = _optional(pynvml.nvmlDeviceGetRemappedRows, index, handle)
        _, uncorrectable, remap_pending, remap_failed = rows or (None, None, None, None)
        return EccState(
            volatile_double_bit=_double_bit_errors(handle, index, pynvml.NVML_VOLATILE_ECC),
            aggregate_double_bit=_double_bit_errors(handle, index, pynvml.NVML_AGGREGATE_ECC),
            retired_pages_double_bit=None if retired is None else len(retired),
            retired_pages_pending=_flag(pending),
            remapped_rows_uncorrectable=uncorrectable,
            remap_pending=_flag(remap_pending),
            remap_failed=_flag(remap_failed),
        )

    def wait_for_events(self, timeout_s: float) -> tuple[XidEvent, ...]:
        if self._closed.is_set():
            raise NvmlError("nvmlEventSetWait_v2", None, "NVML is shut down")
        if self._event_set is None:
            self._closed.wait(timeout_s)  # no GPU sends events; only close ends the wait early
            return ()
        with self._event_lock:
            return self._drain_events(timeout_s)

    def close(self) -> None:
        """Free the event set and shut NVML down; a second call does nothing."""
        with self._event_lock:
            if self._closed.is_set():
                return
            self._closed.set()
            if self._event_set is not None:
                _call(pynvml.nvmlEventSetFree, None, self._event_set)
                self._event_set = None
            _call(pynvml.nvmlShutdown, None)

    def _total_mib(self, handle: Any, index: int, full_profile: Any | None) -> int:
        """The GPU's memory; for a MIG-enabled GPU without privileges, from its full profile."""
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(handle).total // _MIB
        except pynvml.NVMLError_NoPermission as error:
            if full_profile is None:
                raise NvmlError("nvmlDeviceGetMemoryInfo", index, str(error)) from error
            self._warn_withheld(handle, index)
        except pynvml.NVMLError as error:
            raise NvmlError("nvmlDeviceGetMemoryInfo", index, str(error)) from error
        model = _call(pynvml.nvmlDeviceGetName, index, handle)
        return mig_gpu_memory_mib(model, full_profile.memorySizeMB)

    def _warn_withheld(self, handle: Any, index: int) -> None:
        """Say once per GPU that NVML withholds its memory, and what would give it."""
        uuid = _call(pynvml.nvmlDeviceGetUUID, index, handle)
        with self._withheld_lock:
            if uuid in self._withheld:
                return
            self._withheld.add(uuid)
        log.warning(MISSING_MIG_PRIVILEGES, uuid)

    def _watch_xids(self) -> Any:
        """An event set with every GPU that supports XID events, or None when none does."""
        count = self.device_count()
        try:
            event_set = _call(pynvml.nvmlEventSetCreate, None)
        except NvmlError as error:
            log.warning("no XID events; health relies on probes alone: %s", error)
            return None
        if any([self._register(event_set, index) for index in range(count)]):
            return event_set
        _call(pynvml.nvmlEventSetFree, None, event_set)
        return None

    def _register(self, event_set: Any, index: int) -> bool:
        try:
            _call(
                pynvml.nvmlDeviceRegisterEvents,
                index,
                _handle(index),
                pynvml.nvmlEventTypeXidCriticalError,
                event_set,
            )
        except NvmlError as error:
            log.warning("GPU %d reports no XID events: %s", index, error)
            return False
        return True

    def _drain_events(self, timeout_s: float) -> tuple[XidEvent, ...]:
        """The first event within ``timeout_s`` and all queued behind it; the event lock is held."""
        if self._event_set is None:  # closed while this call waited for the lock
            return ()
        events: list[XidEvent] = []
        wait_ms = max(round(timeout_s * 1000), 0)
        while (event := self._next_event(wait_ms)) is not None:
            events.append(event)
            wait_ms = 0
        return tuple(events)

    def _next_event(self, timeout_ms: int) -> XidEvent | None:
        """The next XID event within ``timeout_ms``, or None; the event lock is held."""
        try:
            data = pynvml.nvmlEventSetWait_v2(self._event_set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return None
        except pynvml.NVMLError as error:
            raise NvmlError("nvmlEventSetWait_v2", None, str(error)) from error
        return XidEvent(_call(pynvml.nvmlDeviceGetUUID, None, data.device), int(data.eventData))


# Reading one GPU.


def _handle(index: int) -> Any:
    return _call(pynvml.nvmlDeviceGetHandleByIndex, index, index)


def _sm_count(handle: Any, index: int, capability: str) -> int:
    """SMs from the device attributes where the driver gives them for a whole GPU, else cores."""
    try:
        return pynvml.nvmlDeviceGetAttributes_v2(handle).multiprocessorCount
    except pynvml.NVMLError:
        cores = _call(pynvml.nvmlDeviceGetNumGpuCores, index, handle)
        return sm_count_from_cores(cores, capability)


def _numa_node(handle: Any, index: int) -> int:
    """NVML's NUMA node where the driver has it, else the one Linux gives the PCI device."""
    node = _optional(pynvml.nvmlDeviceGetNumaNodeId, index, handle)
    if node is not None:
        return max(node, 0)
    return sysfs_numa_node(_bus_id(handle, index))


def _double_bit_errors(handle: Any, index: int, counter: int) -> int | None:
    """Uncorrected (double-bit) ECC errors on one counter, volatile or aggregate."""
    return _optional(
        pynvml.nvmlDeviceGetTotalEccErrors,
        index,
        handle,
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        counter,
    )


def _flag(value: int | None) -> bool | None:
    """An NVML yes-or-no (an enable state, or 0 or 1) as a bool; None where unsupported."""
    return None if value is None else bool(value)


def _bus_id(handle: Any, index: int) -> str:
    return _call(pynvml.nvmlDeviceGetPciInfo, index, handle).busId


def _mig_enabled(handle: Any, index: int) -> bool:
    modes = _optional(pynvml.nvmlDeviceGetMigMode, index, handle)
    return modes is not None and modes[0] == pynvml.NVML_DEVICE_MIG_ENABLE


def _full_gpu_profile(handle: Any, index: int) -> Any | None:
    """The 7-slice GPU instance profile of a MIG-enabled GPU: its SMs and memory in MIG mode.

    The v2 call where the driver has it, else v1; None where neither is supported.
    """
    for version in (2, 1):
        info = _optional(
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo,
            index,
            handle,
            pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
            version,
        )
        if info is not None:
            return info
    return None


def _mig_devices(handle: Any, index: int) -> list[Any]:
    """Handles of the MIG devices of GPU ``index``, skipping empty slots."""
    devices = []
    for slot in range(_call(pynvml.nvmlDeviceGetMaxMigDeviceCount, index, handle)):
        try:
            devices.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
        except pynvml.NVMLError_NotFound:
            continue
        except pynvml.NVMLError as error:
            raise NvmlError("nvmlDeviceGetMigDeviceHandleByIndex", index, str(error)) from error
    return devices


def _mig_instance(mig: Any, index: int, gpu_mib: int) -> MigInstance:
    """The MIG device ``mig`` of GPU ``index``; its SMs and memory are its own attributes."""
    attributes = _call(pynvml.nvmlDeviceGetAttributes_v2, index, mig)
    return MigInstance(
        profile=mig_profile_name(
            attributes.gpuInstanceSliceCount,
            attributes.computeInstanceSliceCount,
            attributes.memorySizeMB,
            gpu_mib,
        ),
        uuid=_call(pynvml.nvmlDeviceGetUUID, index, mig),
        memory_mib=attributes.memorySizeMB,
        sm_count=attributes.multiprocessorCount,
    )


# Telemetry of one GPU.


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def _clock_mhz(handle: Any, index: int, clock: int) -> int | None:
    return _offered(pynvml.nvmlDeviceGetClockInfo, index, handle, clock)


def _pcie_bytes(handle: Any, index: int, counter: int) -> int | None:
    """Bytes per second over PCIe in one direction; NVML counts KiB/s over its last 20 ms."""
    kib = _offered(pynvml.nvmlDeviceGetPcieThroughput, index, handle, counter)
    return None if kib is None else kib * 1024


def _nvlink_bytes(handle: Any, index: int) -> tuple[int | None, int | None]:
    """Bytes sent and received over every NVLink since the driver loaded; None without NVLink."""
    if not _active_nvlinks(handle):
        return None, None
    fields = [
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
    ]
    values = _offered(pynvml.nvmlDeviceGetFieldValues, index, handle, fields)
    if values is None:
        return None, None
    tx, rx = (_field_kib(value, index) for value in values)
    return tx, rx


def _field_kib(value: Any, index: int) -> int | None:
    """One field value counted in KiB, as bytes; None where the driver withholds it."""
    if value.nvmlReturn in _UNSUPPORTED_CODES:
        return None
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        error = pynvml.NVMLError(value.nvmlReturn)
        raise NvmlError("nvmlDeviceGetFieldValues", index, str(error))
    return int(value.value.ullVal) * 1024


def _processes(handle: Any, index: int) -> tuple[GpuProcess, ...] | None:
    """The compute processes on a GPU or MIG device, with the memory the driver says each holds."""
    found = _offered(pynvml.nvmlDeviceGetComputeRunningProcesses, index, handle)
    if found is None:
        return None
    return tuple(
        GpuProcess(p.pid, p.usedGpuMemory // _MIB) for p in found if p.usedGpuMemory is not None
    )


def _mig_telemetry(mig: Any, index: int) -> MigTelemetry:
    """The MIG device ``mig`` of GPU ``index``: its memory in use and its processes."""
    return MigTelemetry(
        uuid=_call(pynvml.nvmlDeviceGetUUID, index, mig),
        memory_used_mib=_call(pynvml.nvmlDeviceGetMemoryInfo, index, mig).used // _MIB,
        processes=_processes(mig, index),
    )


def _nvlink_ends(handle: Any, index: int) -> NvLinkEnds:
    """Where the active NVLinks of GPU ``index`` lead.

    A link whose far end NVML cannot name (its remote device type or PCI info
    fails) carries nothing: an optional fact, not a fault of this GPU.
    """
    gpus: Counter[str] = Counter()
    switch_links = 0
    for link in _active_nvlinks(handle):
        try:
            kind = _optional(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, index, handle, link)
            if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switch_links += 1
            else:
                remote = _call(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, index, handle, link)
                gpus[pci_address(remote.busId)] += 1
        except NvmlError as error:
            log.debug("GPU %d: NVLink %d leads nowhere known: %s", index, link, error)
    return NvLinkEnds(dict(gpus), switch_links)


def _active_nvlinks(handle: Any) -> list[int]:
    """The links that are up; a link NVML cannot read (absent, unsupported) carries nothing."""
    active = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                active.append(link)
        except pynvml.NVMLError:
            continue
    return active


def _link(handle: Any, index: int, mine: NvLinkEnds, peer: int) -> GpuLink:
    """The closest connection from GPU ``index`` to GPU ``peer``: NVLink, else the PCIe topology."""
    peer_handle = _handle(peer)
    peer_ends = _nvlink_ends(peer_handle, peer) if mine.switch_links else NvLinkEnds()
    count = nvlink_count(mine, pci_address(_bus_id(peer_handle, peer)), peer_ends)
    if count:
        return GpuLink(peer, LINK_NVLINK, count)
    # NOT_SUPPORTED in VMs and containers that see part of the machine: the farthest level.
    level = _optional(pynvml.nvmlDeviceGetTopologyCommonAncestor, index, handle, peer_handle)
    return GpuLink(peer, LINK_SYSTEM if level is None else link_type(level))
