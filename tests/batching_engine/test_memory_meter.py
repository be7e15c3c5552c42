"""The budget's NVML edge over a fake pynvml (the neighbour across the seam), and the meter's
fallback where NVML cannot answer."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from batching_engine.memory_meter import SYSTEM_NVML, MemoryMeter, NvmlUnavailable
from batching_engine.own_memory import NvmlReading
from harness.simulated_gpu import SimulatedGpu

MIB = 1 << 20
GIB = 1 << 30
NOT_AVAILABLE = (1 << 64) - 1


class FakePynvml:
    """The pynvml calls the edge makes, over a card (index 0, "GPU-aaaa") with one MIG
    instance ("MIG-bbbb"); `mig_mode` turns the card's MIG mode on."""

    NVML_DEVICE_MIG_ENABLE = 1
    NVML_VALUE_NOT_AVAILABLE_ulonglong = SimpleNamespace(value=NOT_AVAILABLE)

    class NVMLError(Exception):
        pass

    def __init__(self, *, mig_mode: bool = False, init_error: str | None = None) -> None:
        self.mig_mode, self.init_error = mig_mode, init_error
        self.open = 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.NVMLError(self.init_error)
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.open -= 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        if index != 0:
            raise self.NVMLError("Invalid Argument")
        return "card"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return {"GPU-aaaa": "card", "MIG-bbbb": "mig"}[uuid]

    def nvmlDeviceIsMigDeviceHandle(self, handle: str) -> bool:
        return handle == "mig"

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: str) -> str:
        return "card"

    def nvmlDeviceGetMigMode(self, handle: str) -> tuple[int, int]:
        return (int(self.mig_mode), int(self.mig_mode))

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        if handle == "card" and self.mig_mode:
            raise self.NVMLError("Insufficient Permissions")
        return SimpleNamespace(total=80 * GIB if handle == "card" else 10 * GIB, used=9 * GIB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=11, usedGpuMemory=4 * GIB),
                SimpleNamespace(pid=12, usedGpuMemory=None),
                SimpleNamespace(pid=13, usedGpuMemory=NOT_AVAILABLE)]  # fmt: skip


@pytest.fixture
def pynvml(monkeypatch):
    fake = FakePynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def test_a_card_is_read_with_each_processes_memory_and_nvml_closed_after(pynvml):
    reading = SYSTEM_NVML.read(0)
    assert reading == NvmlReading(80 * GIB, False, 9 * GIB, {11: 4 * GIB, 12: None, 13: None})
    assert pynvml.open == 0


@pytest.mark.parametrize(("visible", "mig"), [("GPU-aaaa", False), ("MIG-bbbb", True)])
def test_cuda_visible_devices_uuids_pick_the_device(pynvml, monkeypatch, visible, mig):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    reading = SYSTEM_NVML.read(0)
    assert (reading.is_mig, reading.card_total) == (mig, 80 * GIB)


def test_a_mig_enabled_card_is_a_mig_instance_even_where_its_memory_is_withheld(pynvml):
    pynvml.mig_mode = True
    assert SYSTEM_NVML.read(0) == NvmlReading(None, True, 0, {})
    assert pynvml.open == 0


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda fake, env: setattr(fake, "init_error", "Driver Not Loaded"), "nvmlInit: Driver"),
        (
            lambda fake, env: env.setenv("CUDA_VISIBLE_DEVICES", "1,0"),
            r"NVML device 1 \(CUDA device 0\): Invalid",
        ),
        (lambda fake, env: env.setenv("CUDA_VISIBLE_DEVICES", "MIG-GPU-aaaa/1/0"), "in a form"),
        (lambda fake, env: env.setitem(sys.modules, "pynvml", None), "is not installed"),
    ],
)
def test_where_nvml_cannot_answer_it_says_why(pynvml, monkeypatch, setup, message):
    setup(pynvml, monkeypatch)
    with pytest.raises(NvmlUnavailable, match=message):
        SYSTEM_NVML.read(0)
    assert pynvml.open == 0


class NoNvml:
    """A process whose NVML never answers."""

    pid, environ = 5, {}

    def read(self, cuda_index: int) -> NvmlReading:
        raise NvmlUnavailable("nvmlInit: Driver Not Loaded")


def test_without_nvml_the_meter_falls_back_to_the_device_wide_view_and_says_why():
    gpu = SimulatedGpu.create(16 * GIB)
    gpu.client(7).allocate(2 * GIB)
    ours = gpu.client(5)
    ours.create_context(300 * MIB)
    ours.allocate(GIB)
    meter = MemoryMeter(0, ours, NoNvml())
    memory, own = meter.measure("cuda:0")
    assert memory.reserved == GIB and own.outside_torch == 2 * GIB + 300 * MIB
    assert own.neighbours_included
    assert own.method.endswith("NVML is unavailable (nvmlInit: Driver Not Loaded)")
