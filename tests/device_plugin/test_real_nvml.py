"""The NVML backend: its pure helpers here, the driver itself only where a GPU is present."""

import logging
from collections import deque
from datetime import UTC, datetime
from types import SimpleNamespace

import pynvml
import pytest

from device_plugin.discovery import discover, sample_usage
from device_plugin.health import HealthTracker
from infergrid.inventory import (
    EccState,
    GpuLink,
    MigInstance,
    decode_inventory,
    encode_inventory,
)
from infergrid.mig import MIG_FAMILIES, MigProfile
from infergrid.nvml.backend import (
    GpuProcess,
    MigTelemetry,
    NvmlBackend,
    NvmlError,
    Telemetry,
    XidEvent,
)
from infergrid.nvml.real import (
    NvLinkEnds,
    RealNvml,
    link_type,
    mig_gpu_memory_mib,
    mig_profile_name,
    nvlink_count,
    pci_address,
    sm_count_from_cores,
    sysfs_numa_node,
)


def nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


NVML_WORKS = nvml_works()
needs_gpu = pytest.mark.skipif(not NVML_WORKS, reason="NVML cannot initialise: no GPU or driver")


@pytest.mark.skipif(NVML_WORKS, reason="NVML works on this machine")
def test_without_a_driver_construction_raises_an_nvml_error():
    with pytest.raises(NvmlError) as caught:
        RealNvml()
    assert (caught.value.call, caught.value.index) == ("nvmlInit", None)


def test_it_has_every_call_of_the_backend():
    calls = [name for name in vars(NvmlBackend) if not name.startswith("_")]
    assert {"device_info", "wait_for_events", "close"} <= set(calls)
    assert all(callable(getattr(RealNvml, name, None)) for name in calls)


@pytest.mark.parametrize(
    ("family", "profile"),
    [
        (family, MigProfile(name, mib))
        for family in MIG_FAMILIES
        for name, mib in family.profiles.items()
    ],
    ids=lambda value: getattr(value, "name", ""),
)
def test_mig_profile_names_match_nvidias_table(family, profile):
    name = mig_profile_name(profile.slices, profile.slices, profile.memory_mib, family.memory_mib)
    assert name == profile.name


def test_a_compute_instance_smaller_than_its_gpu_instance_is_prefixed():
    assert mig_profile_name(3, 1, 40192, 81920) == "1c.3g.40gb"
    assert mig_profile_name(3, 0, 40192, 81920) == "3g.40gb"


@pytest.mark.parametrize(
    ("level", "link"),
    [
        (pynvml.NVML_TOPOLOGY_INTERNAL, "pcie-switch"),
        (pynvml.NVML_TOPOLOGY_SINGLE, "pcie-switch"),
        (pynvml.NVML_TOPOLOGY_MULTIPLE, "pcie-switch"),
        (pynvml.NVML_TOPOLOGY_HOSTBRIDGE, "host-bridge"),
        (pynvml.NVML_TOPOLOGY_NODE, "numa"),
        (pynvml.NVML_TOPOLOGY_SYSTEM, "system"),
        (999, "system"),
    ],
)
def test_topology_levels_map_to_link_types(level, link):
    assert link_type(level) == link


def test_nvlinks_count_direct_links_or_the_shared_switch_fabric():
    pairs = NvLinkEnds({"0000:3b:00.0": 4})
    assert nvlink_count(pairs, "0000:3b:00.0", NvLinkEnds()) == 4
    assert nvlink_count(pairs, "0000:5e:00.0", NvLinkEnds()) == 0
    assert nvlink_count(NvLinkEnds(switch_links=12), "x", NvLinkEnds(switch_links=6)) == 6
    assert nvlink_count(NvLinkEnds(switch_links=12), "x", NvLinkEnds()) == 0


def test_pci_addresses_are_written_as_linux_does():
    assert pci_address("00000000:3B:00.0") == "0000:3b:00.0"
    assert pci_address("0000:3B:00.0") == "0000:3b:00.0"


def test_numa_node_comes_from_sysfs_when_nvml_lacks_it(tmp_path):
    for address, text in (("0000:3b:00.0", "1\n"), ("0000:5e:00.0", "-1\n")):
        (tmp_path / address).mkdir()
        (tmp_path / address / "numa_node").write_text(text)
    assert sysfs_numa_node("00000000:3B:00.0", tmp_path) == 1
    assert sysfs_numa_node("00000000:5E:00.0", tmp_path) == 0
    assert sysfs_numa_node("00000000:AF:00.0", tmp_path) == 0


@pytest.mark.parametrize(
    ("cores", "capability", "sms"),
    [(6912, "8.0", 108), (7424, "8.9", 58), (16896, "9.0", 132), (5120, "7.0", 80)],
)
def test_sm_count_from_cores_knows_cores_per_sm(cores, capability, sms):
    assert sm_count_from_cores(cores, capability) == sms


@pytest.fixture
def nvml():
    backend = RealNvml()
    yield backend
    backend.close()


@needs_gpu
def test_discovery_on_the_real_gpus_round_trips(nvml):
    inventory = discover(nvml, "this-node", None)
    assert len(inventory.gpus) == nvml.device_count() > 0
    assert all(gpu.healthy and gpu.sm_count > 0 for gpu in inventory.gpus)
    assert decode_inventory(encode_inventory(inventory)) == inventory


@needs_gpu
def test_usage_and_events_on_the_real_gpus(nvml):
    usage = sample_usage(nvml, "this-node", datetime.now(UTC))
    assert len(usage.gpus) == nvml.device_count()
    assert all(0 <= s.utilization_percent <= 100 for s in usage.gpus)
    assert nvml.wait_for_events(0.01) == ()


@needs_gpu
def test_close_twice_is_harmless():
    backend = RealNvml()
    backend.close()
    backend.close()
    with pytest.raises(NvmlError):
        backend.device_count()


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class Driver:
    """A three-GPU machine as pynvml shows it, patched over pynvml's functions.

    GPUs 0 and 1 are joined by four NVLinks; GPU 2 is on PCIe, in MIG mode,
    with a 3g.40gb and a 4g.40gb instance. Whole-GPU handles are indexes, MIG
    handles are (GPU, slot) pairs. Each method is named after the NVML function
    it stands in for, as RealNvml names failed calls after the function.

    It refuses what the driver refuses: core counts and device attributes of a
    MIG-enabled GPU (NOT_SUPPORTED), and that GPU's memory to a caller without
    MIG monitoring privileges (NO_PERMISSION) unless ``privileged``. Tests
    switch on the refusals of partly visible machines: ``remote_pci_errors``
    (GPU → error code of its NVLinks' remote PCI info) and
    ``common_ancestor_error`` (error code of every topology query).

    ECC is on, with nothing wrong; as on an A100, rows are remapped and pages
    never retired (NOT_SUPPORTED). Tests set ``ecc_mode`` (GPU → enable state, or
    an error code), ``double_bit`` ((GPU, counter type) → count), ``remapped``
    (GPU → NVML's four row values), and ``retired`` (GPU → its retired pages; such
    a GPU retires pages, as before Ampere, and has no row remapping).

    Telemetry: every GPU reads 250.5 W of 400, SM and memory clocks, PCIe traffic
    and a power-cap reason; GPUs 0 and 1 count NVLink bytes, and each runs one
    process (and one whose memory the driver does not give). ``old_driver`` GPUs
    lack the newer temperature and clocks-event calls (FUNCTION_NOT_FOUND);
    ``nvlink_field_return`` (GPU → return code of its NVLink fields) and
    ``withheld`` (NVML function names answering NO_PERMISSION) switch on refusals.
    """

    BUS = ("00000000:07:00.0", "00000000:0F:00.0", "00000000:87:00.0")
    MIG_GPU = 2
    MIG = {0: (3, 40192, 42, 1000), 2: (4, 40192, 56, 2000)}
    """slot: (GPU instance slices, MiB, SMs, MiB used)."""
    FULL_PROFILE = (7, 80384, 98)
    """The 7-slice GPU instance profile of an A100 80GB: slices, MiB, SMs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: deque[SimpleNamespace] = deque()
        self.lost: set[int] = set()
        self.privileged = False
        self.remote_pci_errors: dict[int, int] = {}
        self.common_ancestor_error: int | None = None
        self.ecc_mode: dict[int, int] = {}
        self.double_bit: dict[tuple[int, int], int] = {}
        self.remapped: dict[int, tuple[int, int, int, int]] = {}
        self.retired: dict[int, list[int]] = {}
        self.retirement_pending: set[int] = set()
        self.old_driver: set[int] = set()
        self.nvlink_field_return: dict[int, int] = {}
        self.withheld: set[str] = set()
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    def nvmlInit(self):
        return None

    def nvmlShutdown(self):
        return None

    def nvmlDeviceGetCount(self):
        return 3

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUUID(self, handle):
        return f"MIG-{handle[0]}-{handle[1]}" if isinstance(handle, tuple) else f"GPU-{handle}"

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return (8, 0)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        mib = 1024 * 1024
        if isinstance(handle, tuple):
            _, total, _, used = self.MIG[handle[1]]
            return pynvml.c_nvmlMemory_t(total=total * mib, free=0, used=used * mib)
        if handle in self.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if handle == self.MIG_GPU and not self.privileged:
            raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        return pynvml.c_nvmlMemory_t(total=81920 * mib, free=0, used=(handle + 1) * 1000 * mib)

    def nvmlDeviceGetAttributes_v2(self, handle):
        if not isinstance(handle, tuple):  # NVML gives attributes of MIG devices only
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        slices, mib, sms, _ = self.MIG[handle[1]]
        return pynvml.c_nvmlDeviceAttributes(
            multiprocessorCount=sms,
            gpuInstanceSliceCount=slices,
            computeInstanceSliceCount=slices,
            memorySizeMB=mib,
        )

    def nvmlDeviceGetNumGpuCores(self, handle):
        if isinstance(handle, tuple) or handle == self.MIG_GPU:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 6912

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle, profile, version=2):
        if handle != self.MIG_GPU:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if profile != pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.sliceCount, info.memorySizeMB, info.multiprocessorCount = self.FULL_PROFILE
        info.name = b"MIG 7g.80gb"
        return info

    def nvmlDeviceGetNumaNodeId(self, handle):
        return (0, 0, 1)[handle]

    def nvmlDeviceGetPciInfo(self, handle):
        return pynvml.nvmlPciInfo_t(busId=self.BUS[handle].encode())

    def nvmlDeviceGetMigMode(self, handle):
        if handle != 2:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, slot):
        if slot not in self.MIG:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return (handle, slot)

    def nvmlDeviceGetNvLinkState(self, handle, link):
        if handle == 2:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_FEATURE_ENABLED if link < 4 else 0

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link):
        return pynvml.NVML_NVLINK_DEVICE_TYPE_GPU

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle, link):
        if handle in self.remote_pci_errors:
            raise nvml_error(self.remote_pci_errors[handle])
        return pynvml.nvmlPciInfo_t(busId=self.BUS[1 - handle].lower().encode())

    def nvmlDeviceGetTopologyCommonAncestor(self, first, second):
        if self.common_ancestor_error is not None:
            raise nvml_error(self.common_ancestor_error)
        return pynvml.NVML_TOPOLOGY_SYSTEM if 0 in (first, second) else pynvml.NVML_TOPOLOGY_NODE

    def nvmlDeviceGetUtilizationRates(self, handle):
        if handle == 2:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlUtilization_t(gpu=30, memory=0)

    def nvmlDeviceGetEccMode(self, handle):
        mode = self.ecc_mode.get(handle, pynvml.NVML_FEATURE_ENABLED)
        if mode not in (pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_DISABLED):
            raise nvml_error(mode)
        return [mode, mode]

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter):
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return self.double_bit.get((handle, counter), 0)

    def nvmlDeviceGetRetiredPages(self, handle, cause):
        assert cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        if handle not in self.retired:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.retired[handle]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle):
        if handle not in self.retired:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        pending = handle in self.retirement_pending
        return pynvml.NVML_FEATURE_ENABLED if pending else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, handle):
        if handle in self.retired:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.remapped.get(handle, (0, 0, 0, 0))

    def nvmlDeviceGetPowerUsage(self, handle):
        return 250_500  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 400_000

    def nvmlDeviceGetTemperatureV(self, handle, sensor, version=None):
        if handle in self.old_driver:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 61

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 58

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return {pynvml.NVML_CLOCK_SM: 1410, pynvml.NVML_CLOCK_MEM: 1593}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        if handle in self.old_driver:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return pynvml.nvmlClocksEventReasonSwPowerCap

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return pynvml.nvmlClocksThrottleReasonGpuIdle

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        return {pynvml.NVML_PCIE_UTIL_TX_BYTES: 1000, pynvml.NVML_PCIE_UTIL_RX_BYTES: 3000}[counter]

    def nvmlDeviceGetFieldValues(self, handle, ids):
        kib = {
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 5,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 7,
        }
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for value, (field_id, scope) in zip(values, ids, strict=True):
            assert scope == 0xFFFFFFFF  # every link, summed
            value.fieldId, value.scopeId = field_id, scope
            value.nvmlReturn = self.nvlink_field_return.get(handle, pynvml.NVML_SUCCESS)
            value.value.ullVal = kib[field_id]
        return values

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if "nvmlDeviceGetComputeRunningProcesses" in self.withheld:
            raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        mib = 1024 * 1024
        gpu, slot = handle if isinstance(handle, tuple) else (handle, 9)
        return [
            SimpleNamespace(pid=1000 + 10 * gpu + slot, usedGpuMemory=(gpu + 1) * 512 * mib),
            SimpleNamespace(pid=2000, usedGpuMemory=None),  # the driver does not say
        ]

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle, event_types, event_set):
        if handle == 2:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if not self.events:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.popleft()

    def nvmlEventSetFree(self, event_set):
        return None


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Driver:
    return Driver(monkeypatch)


def test_a_simulated_driver_is_read_into_the_inventory(driver):
    nvml = RealNvml()
    inventory = discover(nvml, "node", None)
    gpu0, gpu1, gpu2 = inventory.gpus
    assert (gpu0.uuid, gpu0.sm_count, gpu0.memory_mib, gpu0.compute_capability) == (
        "GPU-0",
        108,
        81920,
        "8.0",
    )
    assert gpu0.links == (GpuLink(1, "nvlink", 4), GpuLink(2, "system"))
    assert gpu1.links == (GpuLink(0, "nvlink", 4), GpuLink(2, "numa"))
    assert (gpu2.numa_node, gpu2.mig_enabled, gpu0.mig_enabled) == (1, True, False)
    assert (gpu2.healthy, gpu2.sm_count, gpu2.memory_mib) == (True, 98, 81920)
    assert gpu2.mig_instances == (
        MigInstance("3g.40gb", "MIG-2-0", 40192, 42),
        MigInstance("4g.40gb", "MIG-2-2", 40192, 56),
    )
    assert decode_inventory(encode_inventory(inventory)) == inventory
    nvml.close()


def test_a_simulated_driver_is_sampled_and_its_errors_named(driver):
    nvml = RealNvml()
    usage = sample_usage(nvml, "node", datetime.now(UTC))
    assert [(s.used_mib, s.utilization_percent) for s in usage.gpus] == [
        (1000, 30),
        (2000, 30),
        (3000, 0),
    ]
    driver.lost.add(1)
    with pytest.raises(NvmlError) as caught:
        nvml.memory_used_mib(1)
    assert str(caught.value) == "nvmlDeviceGetMemoryInfo on GPU 1: GPU is lost"
    nvml.close()


def test_a_simulated_driver_delivers_every_queued_xid(driver):
    nvml = RealNvml()
    driver.events += [
        SimpleNamespace(device=1, eventData=79),
        SimpleNamespace(device=0, eventData=48),
    ]
    assert nvml.wait_for_events(0.01) == (XidEvent("GPU-1", 79), XidEvent("GPU-0", 48))
    assert nvml.wait_for_events(0.01) == ()
    nvml.close()
    nvml.close()
    with pytest.raises(NvmlError, match="shut down"):
        nvml.wait_for_events(5)


# What the driver refuses: MIG parents, MIG monitoring without privileges, topology.

MISSING_PRIVILEGES = (
    "GPU-2: NVML_ERROR_NO_PERMISSION reading memory of a MIG-enabled GPU: run the plugin "
    "with NVIDIA_MIG_MONITOR_DEVICES=all and CAP_SYS_ADMIN (chart: devicePlugin.migMonitoring=true)"
)


def mig_gpu(inventory):
    return next(gpu for gpu in inventory.gpus if gpu.uuid == "GPU-2")


@pytest.mark.parametrize("privileged", [True, False])
def test_a_mig_enabled_gpu_is_read_from_its_full_gpu_profile_and_instances(driver, privileged):
    driver.privileged = privileged
    nvml = RealNvml()
    inventory = discover(nvml, "node", HealthTracker(60))
    assert [gpu.uuid for gpu in inventory.gpus] == ["GPU-0", "GPU-1", "GPU-2"]
    gpu = mig_gpu(inventory)
    assert (gpu.healthy, gpu.mig_enabled, gpu.sm_count, gpu.memory_mib) == (True, True, 98, 81920)
    assert [(m.profile, m.sm_count, m.memory_mib) for m in gpu.mig_instances] == [
        ("3g.40gb", 42, 40192),
        ("4g.40gb", 56, 40192),
    ]
    assert decode_inventory(encode_inventory(inventory)) == inventory
    nvml.close()


def test_without_mig_monitoring_privileges_one_line_says_what_is_missing(driver, caplog):
    nvml = RealNvml()
    health = HealthTracker(60)
    with caplog.at_level(logging.INFO, logger="device_plugin"):
        for _ in range(3):
            discover(nvml, "node", health)
            sample_usage(nvml, "node", datetime.now(UTC))
    notes = [r for r in caplog.records if "NO_PERMISSION" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in notes] == [
        (logging.WARNING, f"{MISSING_PRIVILEGES}; until then its memory use is its MIG devices'")
    ]
    assert health.is_healthy("GPU-2")
    nvml.close()


def test_without_mig_monitoring_privileges_memory_in_use_is_the_instances_sum(driver):
    nvml = RealNvml()
    assert nvml.memory_used_mib(2) == 1000 + 2000
    assert nvml.device_info(2).memory_mib == 81920  # the A100 80GB whose full profile this is
    driver.privileged = True
    assert nvml.memory_used_mib(2) == 3000  # (the driver's aggregate: the same here)
    nvml.close()


def test_a_lost_mig_gpu_is_still_unhealthy_without_privileges(driver):
    driver.lost.add(2)
    nvml = RealNvml()
    with pytest.raises(NvmlError, match="GPU is lost"):
        nvml.memory_used_mib(2)
    inventory = discover(nvml, "node", None)  # lost: left out, as a lost whole GPU is
    assert "GPU-2" not in [gpu.uuid for gpu in inventory.gpus if gpu.healthy]
    nvml.close()


@pytest.mark.parametrize(
    "error",
    [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_NO_DATA],
    ids=["not-supported", "unknown", "no-data"],
)
def test_an_nvlink_whose_far_end_cannot_be_read_carries_nothing(driver, error):
    driver.remote_pci_errors[0] = error
    nvml = RealNvml()
    inventory = discover(nvml, "node", HealthTracker(60))
    gpu0, gpu1, gpu2 = inventory.gpus
    assert gpu0.links == (GpuLink(1, "system"), GpuLink(2, "system"))
    assert gpu1.links == (GpuLink(0, "nvlink", 4), GpuLink(2, "numa"))
    assert all(gpu.healthy for gpu in inventory.gpus)
    nvml.close()


@pytest.mark.parametrize(
    "error",
    [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND],
    ids=["not-supported", "function-not-found"],
)
def test_without_a_topology_gpus_are_a_system_apart(driver, error):
    driver.common_ancestor_error = error
    nvml = RealNvml()
    inventory = discover(nvml, "node", HealthTracker(60))
    gpu0, gpu1, gpu2 = inventory.gpus
    assert gpu0.links == (GpuLink(1, "nvlink", 4), GpuLink(2, "system"))
    assert gpu1.links == (GpuLink(0, "nvlink", 4), GpuLink(2, "system"))
    assert gpu2.links == (GpuLink(0, "system"), GpuLink(1, "system"))
    assert all(gpu.healthy for gpu in inventory.gpus)
    nvml.close()


def test_both_topology_refusals_together_leave_every_gpu_healthy_and_a_system_apart(driver):
    driver.remote_pci_errors.update({0: pynvml.NVML_ERROR_UNKNOWN, 1: pynvml.NVML_ERROR_UNKNOWN})
    driver.common_ancestor_error = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml = RealNvml()
    inventory = discover(nvml, "node", HealthTracker(60))
    assert len(inventory.gpus) == 3 and all(gpu.healthy for gpu in inventory.gpus)
    assert {link.type for gpu in inventory.gpus for link in gpu.links} == {"system"}
    nvml.close()


@pytest.mark.parametrize("family", MIG_FAMILIES, ids=lambda family: family.name)
def test_a_mig_gpus_memory_comes_from_its_family_when_nvml_withholds_it(family):
    full_profile = max(family.profiles.values())
    product = {"A100": "NVIDIA A100-SXM4", "H100": "NVIDIA H100 80GB HBM3"}
    model = product.get(family.product, f"NVIDIA {family.product}")
    assert mig_gpu_memory_mib(model, full_profile) == family.memory_mib


def test_an_unknown_mig_gpus_memory_is_its_full_profiles():
    assert mig_gpu_memory_mib("NVIDIA B200", 183000) == 183000
    assert mig_gpu_memory_mib("NVIDIA A100-SXM4-80GB", 60000) == 60000


# ECC: what each generation reports, and what it does not.

CLEAN_REMAPPING = EccState(0, 0, None, None, 0, False, False)
"""An A100's record with nothing wrong: no page retirement, rows remapped instead."""


def test_a_simulated_driver_reads_double_bit_counts_and_remapped_rows(driver):
    driver.double_bit[(0, pynvml.NVML_VOLATILE_ECC)] = 1
    driver.double_bit[(0, pynvml.NVML_AGGREGATE_ECC)] = 3
    driver.remapped[1] = (5, 2, 1, 1)  # correctable, uncorrectable, pending, failure
    nvml = RealNvml()
    assert nvml.ecc_state(0) == EccState(1, 3, None, None, 0, False, False)
    assert nvml.ecc_state(1) == EccState(0, 0, None, None, 2, True, True)
    assert nvml.ecc_state(2) == CLEAN_REMAPPING  # MIG-enabled: the parent GPU's record
    nvml.close()


def test_a_gpu_that_retires_pages_reports_them_and_no_remapped_rows(driver):
    driver.retired[0] = [0x1000, 0x2000]
    driver.retirement_pending.add(0)
    driver.retired[1] = []
    nvml = RealNvml()
    assert nvml.ecc_state(0) == EccState(0, 0, 2, True, None, None, None)
    assert nvml.ecc_state(1) == EccState(0, 0, 0, False, None, None, None)
    nvml.close()


@pytest.mark.parametrize(
    "mode",
    [pynvml.NVML_FEATURE_DISABLED, pynvml.NVML_ERROR_NOT_SUPPORTED],
    ids=["ecc-off", "no-ecc"],
)
def test_a_gpu_without_ecc_reports_nothing_and_stays_healthy(driver, mode):
    driver.ecc_mode[1] = mode
    driver.double_bit[(1, pynvml.NVML_VOLATILE_ECC)] = 7  # counted, but ECC does not apply
    nvml = RealNvml()
    assert nvml.ecc_state(1) == EccState()
    inventory = discover(nvml, "node", HealthTracker(60))
    assert inventory.gpus[1].ecc == EccState() and inventory.gpus[1].healthy
    assert decode_inventory(encode_inventory(inventory)) == inventory
    nvml.close()


def test_an_ecc_read_that_fails_names_the_call_and_the_gpu(driver):
    driver.ecc_mode[0] = pynvml.NVML_ERROR_GPU_IS_LOST
    nvml = RealNvml()
    with pytest.raises(NvmlError) as caught:
        nvml.ecc_state(0)
    assert str(caught.value) == "nvmlDeviceGetEccMode on GPU 0: GPU is lost"
    nvml.close()


def test_a_simulated_double_bit_error_is_published_and_holds_the_gpu(driver):
    nvml = RealNvml()
    health = HealthTracker(60)
    assert [gpu.ecc for gpu in discover(nvml, "node", health).gpus] == [CLEAN_REMAPPING] * 3
    driver.double_bit[(2, pynvml.NVML_VOLATILE_ECC)] = 1
    inventory = discover(nvml, "node", health)
    assert [gpu.healthy for gpu in inventory.gpus] == [True, True, False]
    assert inventory.gpus[2].ecc.volatile_double_bit == 1
    reason = "ECC volatileDoubleBit is 1 (double-bit errors since the driver loaded)"
    assert health.unhealthy() == {"GPU-2": f"{reason}: needs a GPU reset"}
    nvml.close()


# Telemetry: what NVML offers, in the units the metrics carry, and what it withholds.


def test_a_simulated_driver_is_read_into_telemetry_in_the_metrics_units(driver):
    nvml = RealNvml()
    reading = nvml.telemetry(0)
    assert reading == Telemetry(
        utilization_percent=30,
        memory_bandwidth_percent=0,
        memory_used_mib=1000,
        power_watts=250.5,
        power_limit_watts=400.0,
        temperature_celsius=61,
        sm_clock_mhz=1410,
        memory_clock_mhz=1593,
        throttle_reasons=pynvml.nvmlClocksEventReasonSwPowerCap,
        pcie_tx_bytes_per_second=1000 * 1024,
        pcie_rx_bytes_per_second=3000 * 1024,
        nvlink_tx_bytes=5 * 1024,
        nvlink_rx_bytes=7 * 1024,
        processes=(GpuProcess(1009, 512),),
    )
    nvml.close()


def test_an_older_driver_answers_through_the_older_calls(driver):
    driver.old_driver.add(1)
    nvml = RealNvml()
    reading = nvml.telemetry(1)
    assert (reading.temperature_celsius, reading.throttle_reasons) == (58, 0x1)
    nvml.close()


def test_a_mig_gpu_has_no_utilisation_or_nvlink_and_its_instances_their_own_readings(driver):
    nvml = RealNvml()
    reading = nvml.telemetry(2)
    assert (reading.utilization_percent, reading.memory_bandwidth_percent) == (None, None)
    assert (reading.nvlink_tx_bytes, reading.processes) == (None, None)
    assert (reading.power_watts, reading.memory_used_mib) == (250.5, 3000)
    assert reading.mig == (
        MigTelemetry("MIG-2-0", 1000, (GpuProcess(1020, 1536),)),
        MigTelemetry("MIG-2-2", 2000, (GpuProcess(1022, 1536),)),
    )
    nvml.close()


@pytest.mark.parametrize(
    "code",
    [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION],
    ids=["not-supported", "no-permission"],
)
def test_what_nvml_withholds_is_none_not_a_fault(driver, code):
    driver.nvlink_field_return[0] = code
    driver.withheld.add("nvmlDeviceGetComputeRunningProcesses")
    nvml = RealNvml()
    reading = nvml.telemetry(0)
    assert (reading.nvlink_tx_bytes, reading.nvlink_rx_bytes, reading.processes) == (None,) * 3
    assert [m.processes for m in nvml.telemetry(2).mig] == [None, None]
    nvml.close()


def test_a_telemetry_read_that_fails_names_the_call_and_the_gpu(driver):
    driver.nvlink_field_return[1] = pynvml.NVML_ERROR_UNKNOWN
    driver.lost.add(0)
    nvml = RealNvml()
    with pytest.raises(NvmlError) as caught:
        nvml.telemetry(1)
    assert str(caught.value) == "nvmlDeviceGetFieldValues on GPU 1: Unknown Error"
    with pytest.raises(NvmlError, match="nvmlDeviceGetMemoryInfo on GPU 0: GPU is lost"):
        nvml.telemetry(0)
    nvml.close()
