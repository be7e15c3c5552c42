"""The engine's memory budget from its flags and the device plugin's environment."""

from __future__ import annotations

import pytest
import torch

from batching_engine.memory_budget import (
    MIB,
    DeviceMemory,
    parse_memory_size,
    read_device_memory,
    resolve_memory_budget,
    torch_budget_bytes,
)
from batching_engine.model.activation_profile import ActivationPeaks
from batching_engine.model_runner import ModelRunner
from infergrid.errors import ContractError

GIB = 1 << 30


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512MiB", 512 * MIB),
        ("2GiB", 2 * GIB),
        ("1.5GiB", 3 * GIB // 2),
        ("512Mi", 512 * MIB),
        ("750MB", 750_000_000),
        ("1G", 1_000_000_000),
        ("4096", 4096),
        (" 64 kib ", 64 * 1024),
    ],
)
def test_sizes_read_binary_and_decimal_units(text, size):
    assert parse_memory_size(text, "--kv-cache-memory") == size


@pytest.mark.parametrize("text", ["", "lots", "12 parsecs", "-1GiB", "0MiB", "1e9"])
def test_unreadable_sizes_name_the_flag(text):
    with pytest.raises(ContractError, match="^--kv-cache-memory: "):
        parse_memory_size(text, "--kv-cache-memory")


def test_a_gpu_share_from_the_device_plugin_is_the_budget_times_utilization():
    budget = resolve_memory_budget(
        device="cuda", environ={"INFERGRID_GPU_MEMORY_MIB": "8192"}, device_total_bytes=80 * GIB
    )
    assert budget.total_bytes == int(8 * GIB * 0.9) and budget.kv_cache_bytes is None
    assert "INFERGRID_GPU_MEMORY_MIB=8192" in budget.source


def test_on_a_mig_instance_the_budget_is_the_instance_not_the_card():
    """Allocate grants a 3g.40gb instance's 40 GiB; torch may still report the parent card."""
    budget = resolve_memory_budget(
        device="cuda", environ={"INFERGRID_GPU_MEMORY_MIB": "40960"}, device_total_bytes=80 * GIB
    )
    assert budget.total_bytes == int(40 * GIB * 0.9)


def test_without_a_share_the_whole_gpu_is_the_base():
    budget = resolve_memory_budget(
        device="cuda:1", environ={}, gpu_memory_utilization=0.5, device_total_bytes=16 * GIB
    )
    assert budget.total_bytes == 8 * GIB


def test_an_explicit_kv_cache_size_on_a_gpu_must_fit_inside_the_budget():
    share = {"INFERGRID_GPU_MEMORY_MIB": "4096"}
    budget = resolve_memory_budget(device="cuda", environ=share, kv_cache_memory="1GiB")
    assert budget.kv_cache_bytes == GIB and budget.total_bytes == int(4 * GIB * 0.9)
    with pytest.raises(ContractError, match="^--kv-cache-memory: 4GiB does not fit"):
        resolve_memory_budget(device="cuda", environ=share, kv_cache_memory="4GiB")


def test_on_a_cpu_the_flag_sizes_the_kv_cache_alone():
    budget = resolve_memory_budget(device="cpu", environ={}, kv_cache_memory="512MiB")
    assert budget.kv_cache_bytes == 512 * MIB and budget.total_bytes is None
    assert resolve_memory_budget(device="cpu", environ={}).kv_cache_bytes == GIB


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"device": "cuda", "environ": {"INFERGRID_GPU_MEMORY_MIB": "8GiB"}},
            "^INFERGRID_GPU_MEMORY_MIB: expected a positive whole number of MiB, got '8GiB'",
        ),
        (
            {"device": "cuda", "environ": {"INFERGRID_GPU_MEMORY_MIB": "0"}},
            "^INFERGRID_GPU_MEMORY_MIB: ",
        ),
        (
            {"device": "cuda", "environ": {}},
            "^INFERGRID_GPU_MEMORY_MIB: is not set and the GPU's size",
        ),
        (
            {
                "device": "cuda",
                "environ": {"INFERGRID_GPU_MEMORY_MIB": "1024"},
                "gpu_memory_utilization": 1.5,
            },
            r"^--gpu-memory-utilization: must be in \(0, 1\], got 1.5",
        ),
        (
            {
                "device": "cuda",
                "environ": {"INFERGRID_GPU_MEMORY_MIB": "1024"},
                "gpu_memory_utilization": 0,
            },
            "^--gpu-memory-utilization: ",
        ),
        (
            {"device": "cpu", "environ": {}, "gpu_memory_utilization": 0.9},
            "^--gpu-memory-utilization: applies to GPUs only",
        ),
        ({"device": "tpu", "environ": {}}, "^device: expected cpu, cuda or cuda:N, got 'tpu'"),
    ],
)
def test_bad_settings_name_the_flag_or_variable(kwargs, message):
    with pytest.raises(ContractError, match=message):
        resolve_memory_budget(**kwargs)


class FakeAllocator:
    """torch.cuda's two memory calls, answering with a device's numbers after start-up: the
    process holds `outside` bytes the allocator did not reserve (context, cuBLAS, Triton)."""

    def __init__(self, total: int, reserved: int, outside: int, others: int = 0) -> None:
        self.total, self.reserved = total, reserved
        self.free = total - reserved - outside - others
        self.asked: list[object] = []

    def mem_get_info(self, device=None) -> tuple[int, int]:
        self.asked.append(device)
        return self.free, self.total

    def memory_reserved(self, device=None) -> int:
        self.asked.append(device)
        return self.reserved


def test_memory_outside_torch_is_what_the_device_uses_beyond_the_allocators_reserve():
    fake = FakeAllocator(total=10 * GIB, reserved=3 * GIB, outside=700 * MIB)
    memory = read_device_memory(fake, "cuda:1")
    assert memory == DeviceMemory(
        free=10 * GIB - 3 * GIB - 700 * MIB, total=10 * GIB, reserved=3 * GIB
    )
    assert memory.outside_torch == 700 * MIB
    assert fake.asked == ["cuda:1", "cuda:1"]
    assert DeviceMemory(free=GIB, total=2 * GIB, reserved=GIB + MIB).outside_torch == 0


def test_torch_gets_the_budget_less_what_is_held_outside_it():
    """A 2 GiB MPS share: 0.9 of it leaves 205 MiB, less than a CUDA context; the measured
    context, cuBLAS and Triton memory comes off the budget instead."""
    budget = int(2 * GIB * 0.9)
    memory = read_device_memory(FakeAllocator(2 * GIB, reserved=GIB, outside=400 * MIB), "cuda")
    assert torch_budget_bytes(budget, memory) == budget - 400 * MIB


def test_torch_never_gets_more_than_it_holds_plus_what_is_free():
    """A budget that overstates the device (a share larger than the card) is cut to what the
    allocator holds plus what is free."""
    fake = FakeAllocator(8 * GIB, reserved=GIB, outside=300 * MIB)
    memory = read_device_memory(fake, "cuda")
    assert torch_budget_bytes(12 * GIB, memory) == GIB + fake.free == 8 * GIB - 300 * MIB


def test_other_processes_on_an_unlimited_device_count_as_outside_torch():
    fake = FakeAllocator(8 * GIB, reserved=GIB, outside=300 * MIB, others=5 * GIB)
    memory = read_device_memory(fake, "cuda")
    assert (
        torch_budget_bytes(int(8 * GIB * 0.9), memory) == int(8 * GIB * 0.9) - 5 * GIB - 300 * MIB
    )


def runner_on_a_fake_gpu(allocator: FakeAllocator, peaks: ActivationPeaks) -> ModelRunner:
    """The runner's budget arithmetic alone: a 64 MiB "model" on cuda:1, no GPU touched."""
    runner = object.__new__(ModelRunner)
    runner.device = torch.device("cuda:1")
    runner.model = torch.nn.Linear(4096, 4096, bias=False)  # 64 MiB of float32
    runner._activation_peaks = lambda: peaks
    runner.cuda_memory = allocator
    return runner


def test_the_runner_sizes_the_kv_cache_so_everything_fits_on_a_1g_mig_slice():
    total = 10 * GIB  # a 1g MIG instance
    outside = 600 * MIB  # CUDA context, cuBLAS workspaces, Triton modules
    peaks = ActivationPeaks(step=300 * MIB, decode_forward=100 * MIB)
    allocator = FakeAllocator(total, reserved=64 * MIB, outside=outside)
    runner = runner_on_a_fake_gpu(allocator, peaks)
    assert runner.weight_bytes == 64 * MIB
    budget = int(total * 0.9)
    kv = runner._kv_cache_bytes(None, budget, graphs=True)
    assert kv == budget - outside - 64 * MIB - 400 * MIB
    assert outside + 64 * MIB + 400 * MIB + kv <= total
    assert allocator.asked == [torch.device("cuda:1")] * 2


def test_a_share_that_cannot_hold_the_memory_outside_torch_is_refused_naming_it():
    peaks = ActivationPeaks(step=100 * MIB, decode_forward=50 * MIB)
    runner = runner_on_a_fake_gpu(FakeAllocator(GIB, 64 * MIB, outside=800 * MIB), peaks)
    with pytest.raises(ContractError, match=r"memory outside torch \(800 MiB\)"):
        runner._kv_cache_bytes(None, int(GIB * 0.9), graphs=True)
