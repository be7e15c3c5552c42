"""The NVML backend: its pure helpers here, the driver itself only where a GPU is present."""

from collections import deque
from datetime import UTC, datetime
from types import SimpleNamespace

import pynvml
import pytest

from device_plugin.discovery import discover, sample_usage
from device_plugin.nvml.backend import NvmlBackend, NvmlError, XidEvent
from device_plugin.nvml.real import (
    NvLinkEnds,
    RealNvml,
    link_type,
    mig_profile_name,
    nvlink_count,
    pci_address,
    sm_count_from_cores,
    sysfs_numa_node,
)
from infergrid.inventory import GpuLink, MigInstance, decode_inventory, encode_inventory
from infergrid.mig import MIG_FAMILIES, MigProfile


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
    """

    BUS = ("00000000:07:00.0", "00000000:0F:00.0", "00000000:87:00.0")
    MIG = {0: (3, 40192, 42), 2: (4, 40192, 56)}

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: deque[SimpleNamespace] = deque()
        self.lost: set[int] = set()
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

    def nvmlDeviceGetMemoryInfo(self, handle):
        if handle in self.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        mib = 1024 * 1024
        return pynvml.c_nvmlMemory_t(total=81920 * mib, free=0, used=(handle + 1) * 1000 * mib)

    def nvmlDeviceGetAttributes_v2(self, handle):
        if not isinstance(handle, tuple):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        slices, mib, sms = self.MIG[handle[1]]
        return pynvml.c_nvmlDeviceAttributes(
            multiprocessorCount=sms,
            gpuInstanceSliceCount=slices,
            computeInstanceSliceCount=slices,
            memorySizeMB=mib,
        )

    def nvmlDeviceGetNumGpuCores(self, handle):
        return 6912

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
        return pynvml.nvmlPciInfo_t(busId=self.BUS[1 - handle].lower().encode())

    def nvmlDeviceGetTopologyCommonAncestor(self, first, second):
        return pynvml.NVML_TOPOLOGY_SYSTEM if 0 in (first, second) else pynvml.NVML_TOPOLOGY_NODE

    def nvmlDeviceGetUtilizationRates(self, handle):
        if handle == 2:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlUtilization_t(gpu=30, memory=0)

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
