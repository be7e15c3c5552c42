"""The simulated GPU answers as the real driver does: what the budget's tests stand on."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from harness.simulated_gpu import DRIVER_RESERVED_BYTES, HOST_PID_OFFSET, SimulatedGpu

MIB = 1 << 20
GIB = 1 << 30
PINNED = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}


def test_without_mps_every_client_sees_the_whole_device():
    gpu = SimulatedGpu.create(80 * GIB)
    a, b = gpu.client(1), gpu.client(2)
    a.create_context(300 * MIB)
    a.allocate(3 * GIB)
    b.allocate(GIB)
    assert b.mem_get_info("cuda:0") == (80 * GIB - 4 * GIB - 300 * MIB, 80 * GIB)
    assert (a.memory_reserved(torch.device("cuda:0")), b.memory_reserved(0)) == (3 * GIB, GIB)


def test_a_pinned_limit_without_a_running_mps_server_does_nothing():
    gpu = SimulatedGpu.create(80 * GIB)
    client = gpu.client(1, PINNED)
    client.allocate(6 * GIB)
    assert client.mem_get_info() == (74 * GIB, 80 * GIB)


def test_under_mps_a_client_sees_its_limit_and_its_own_use_only():
    gpu = SimulatedGpu.create(80 * GIB)
    gpu.set_mps_server(True)
    limited, neighbour = gpu.client(1, PINNED), gpu.client(2)
    neighbour.allocate(30 * GIB)
    limited.create_context(300 * MIB)
    limited.allocate(GIB)
    assert limited.mem_get_info() == (4 * GIB - GIB - 300 * MIB, 4 * GIB)
    assert neighbour.mem_get_info() == (80 * GIB - 31 * GIB - 300 * MIB, 80 * GIB)


def test_an_allocation_past_the_pinned_limit_fails_in_that_client_only():
    gpu = SimulatedGpu.create(80 * GIB)
    gpu.set_mps_server(True)
    limited, other = gpu.client(1, PINNED), gpu.client(2, PINNED)
    limited.allocate(3 * GIB)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="Tried to allocate 2048 MiB"):
        limited.allocate(2 * GIB)
    assert limited.held() == 3 * GIB
    other.allocate(3 * GIB)
    other.allocate(GIB)
    assert other.held() == 4 * GIB


def test_an_allocation_past_the_devices_free_memory_fails():
    gpu = SimulatedGpu.create(8 * GIB)
    gpu.client(1).allocate(7 * GIB)
    late = gpu.client(2)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="of which 1024 MiB is free"):
        late.allocate(2 * GIB)
    late.allocate(GIB)


def test_a_client_that_exits_gives_back_what_it_held():
    gpu = SimulatedGpu.create(8 * GIB)
    client = gpu.client(1)
    client.create_context()
    client.allocate(GIB)
    client.free(GIB)
    assert gpu.used() == 300 * MIB
    client.exit()
    assert gpu.used() == 0


@pytest.mark.parametrize(
    ("options", "listed"),
    [
        ({}, {7: GIB, 8: 2 * GIB}),
        ({"host_pids": True}, {7 + HOST_PID_OFFSET: GIB, 8 + HOST_PID_OFFSET: 2 * GIB}),
        ({"per_process_memory": False}, {7: None, 8: None}),
    ],
)
def test_nvml_lists_each_process_as_configured(options, listed):
    gpu = SimulatedGpu.create(80 * GIB, **options)
    gpu.client(7).allocate(GIB)
    gpu.client(8).allocate(2 * GIB)
    reading = gpu.client(9).nvml.read(0)
    assert reading.processes == listed  # 9 holds nothing: no context, not listed
    assert reading.used == 3 * GIB + DRIVER_RESERVED_BYTES
    assert reading.card_total == 80 * GIB + DRIVER_RESERVED_BYTES and not reading.is_mig


def test_a_mig_instance_is_seen_whole_by_cuda_and_as_part_of_its_card_by_nvml():
    gpu = SimulatedGpu.create(10 * GIB, mig_card_bytes=80 * GIB)
    client = gpu.client(1)
    assert client.mem_get_info() == (10 * GIB, 10 * GIB)
    reading = client.nvml.read(0)
    assert reading.is_mig and reading.card_total == 80 * GIB


def test_processes_share_one_gpu_through_its_file(tmp_path):
    state = tmp_path / "gpu.json"
    gpu = SimulatedGpu.create(16 * GIB, path=state)
    gpu.client(1).allocate(5 * GIB)
    other_process = (
        "from harness.simulated_gpu import SimulatedGpu\n"
        f"SimulatedGpu.attach({str(state)!r}).client(2).allocate({3 * GIB})\n"
    )
    subprocess.run([sys.executable, "-c", other_process], check=True, timeout=60)
    assert gpu.client(3).mem_get_info() == (8 * GIB, 16 * GIB)
