"""The engine's memory budget from its flags and the device plugin's environment."""

from __future__ import annotations

import pytest

from batching_engine.memory_budget import MIB, parse_memory_size, resolve_memory_budget
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
