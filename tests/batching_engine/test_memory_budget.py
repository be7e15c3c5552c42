"""The engine's memory budget from its flags and the device plugin's environment, and the
runner's KV cache on a simulated GPU shared with other processes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batching_engine.memory_budget import MIB, parse_memory_size, resolve_memory_budget
from batching_engine.model.activation_profile import ActivationPeaks
from batching_engine.model_runner import ModelRunner
from harness.simulated_engine import SMOLLM2, EngineShape, start_engine
from harness.simulated_gpu import CONTEXT_BYTES, DRIVER_RESERVED_BYTES, SimulatedGpu
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
    """gpuMemoryUtilization has a default in every serving file, CPU engines' too: ignored."""
    budget = resolve_memory_budget(
        device="cpu", environ={}, kv_cache_memory="512MiB", gpu_memory_utilization=0.5
    )
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
        ({"device": "tpu", "environ": {}}, "^device: expected cpu, cuda or cuda:N, got 'tpu'"),
    ],
)
def test_bad_settings_name_the_flag_or_variable(kwargs, message):
    with pytest.raises(ContractError, match=message):
        resolve_memory_budget(**kwargs)


# The runner's budget on a simulated GPU: its real code, CUDA's and NVML's numbers from the fake.
SHARE_BUDGET = int(4 * GIB * 0.9)
SHAPE = SMOLLM2  # 270 MiB of weights, activation peaks 400 + 60 MiB
OWN_OUTSIDE = CONTEXT_BYTES + SHAPE.kernels_bytes  # the context, cuBLAS and Triton
OWN_KV = SHARE_BUDGET - SHAPE.weight_bytes - 460 * MIB - OWN_OUTSIDE


@pytest.mark.parametrize(
    "options",
    [{}, {"host_pids": True}, {"per_process_memory": False}],
    ids=["own-pid", "host-pids", "not-available"],
)
def test_two_engines_on_one_gpu_each_get_their_share_less_their_own_memory(options):
    """Two 4 GiB shares of an 80 GiB card; the second starts once the first holds its cache.
    NVML finds each engine by its pid, or (host pids, no per-process figure) each measures
    the device's rise since before its own context."""
    gpu = SimulatedGpu.create(80 * GIB, **options)
    first = start_engine(gpu.client(101), SHARE_BUDGET, SHAPE)
    second = start_engine(gpu.client(102), SHARE_BUDGET, SHAPE)
    assert first.kv_bytes == second.kv_bytes == OWN_KV
    assert first.outside_torch == second.outside_torch == OWN_OUTSIDE
    assert first.held_bytes == second.held_bytes <= SHARE_BUDGET
    expected = "NVML's used memory of pid 102" if not options else "since before"
    assert expected in second.method


@settings(max_examples=50, deadline=None)
@given(
    neighbours=st.lists(st.integers(1, 12 * GIB), max_size=6).filter(lambda n: sum(n) < 70 * GIB),
    options=st.fixed_dictionaries(
        {"host_pids": st.booleans(), "per_process_memory": st.booleans()}
    ),
)
def test_an_engines_kv_plan_never_depends_on_its_neighbours(neighbours, options):
    """Whatever the neighbours hold on a device with room, and whatever NVML lists."""
    gpu = SimulatedGpu.create(80 * GIB, **options)
    for pid, nbytes in enumerate(neighbours, start=10):
        gpu.client(pid).allocate(nbytes, outside_torch=pid % 2 == 0)
    assert start_engine(gpu.client(1), SHARE_BUDGET, SHAPE).kv_bytes == OWN_KV


def test_under_mps_each_engine_measures_within_its_pinned_limit():
    gpu = SimulatedGpu.create(80 * GIB, host_pids=True)
    gpu.set_mps_server(True)
    gpu.client(7).allocate(50 * GIB)  # a neighbour outside MPS's limits
    pinned = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}
    started = [start_engine(gpu.client(pid, pinned), SHARE_BUDGET, SHAPE) for pid in (1, 2)]
    assert [s.kv_bytes for s in started] == [OWN_KV, OWN_KV]
    assert all("an MPS client within its pinned limit of 4096 MiB" in s.method for s in started)


def test_the_runner_sizes_the_kv_cache_so_everything_fits_on_a_1g_mig_slice():
    """A 10 GiB instance of an 80 GiB card: CUDA's view is the instance's, whatever NVML lists."""
    gpu = SimulatedGpu.create(10 * GIB, mig_card_bytes=80 * GIB, host_pids=True)
    budget = int(10 * GIB * 0.9)
    started = start_engine(gpu.client(1), budget, SHAPE)
    assert started.kv_bytes == budget - SHAPE.weight_bytes - 460 * MIB - OWN_OUTSIDE
    assert started.method == "isolated view: a MIG instance of 10240 MiB"
    assert gpu.used() + 460 * MIB <= 10 * GIB


def test_an_over_committed_gpu_is_refused_naming_the_numbers_not_served_smaller():
    """Someone holds 77 GiB of the 80: a 4 GiB share cannot be had."""
    gpu = SimulatedGpu.create(80 * GIB)
    gpu.client(7).allocate(77 * GIB)
    with pytest.raises(ContractError) as refused:
        start_engine(gpu.client(1), SHARE_BUDGET, SHAPE)
    held = SHAPE.weight_bytes + OWN_OUTSIDE
    assert str(refused.value) == (
        "memory_budget_bytes: the device cannot give this engine its budget of 3686 MiB: it"
        f" still needs {(SHARE_BUDGET - held) // MIB} MiB on top of the {held // MIB} MiB it"
        f" holds, but {(3 * GIB - held) // MIB} MiB are free and other processes hold 78848 MiB"
        " (an over-committed GPU, or a share larger than the MPS pinned limit)"
    )


def test_a_share_larger_than_its_mps_pinned_limit_is_refused_not_shrunk_to_fit():
    gpu = SimulatedGpu.create(80 * GIB)
    gpu.set_mps_server(True)
    client = gpu.client(1, {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"})
    with pytest.raises(ContractError, match="its budget of 7372 MiB: it still needs 6738 MiB"):
        start_engine(client, int(8 * GIB * 0.9), SHAPE)


def test_a_share_that_cannot_hold_the_memory_outside_torch_is_refused_naming_it():
    gpu = SimulatedGpu.create(GIB, mig_card_bytes=80 * GIB)
    small = EngineShape(64 * MIB, ActivationPeaks(step=100 * MIB, decode_forward=50 * MIB),
                        kernels_bytes=500 * MIB)  # fmt: skip
    with pytest.raises(ContractError, match=r"memory outside torch \(800 MiB\)"):
        start_engine(gpu.client(1), int(GIB * 0.9), small)


def test_the_runners_memory_meter_reads_its_baseline_on_a_gpu_only():
    """The baseline is NVML's used memory before the context: it holds none of ours."""
    gpu = SimulatedGpu.create(80 * GIB, host_pids=True)
    gpu.client(7).allocate(5 * GIB)
    runner = object.__new__(ModelRunner)
    runner.device = torch.device("cuda:0")
    client = gpu.client(1)
    runner.cuda_memory, runner.nvml_memory = client, client.nvml
    meter = runner._open_memory_meter()
    assert meter.baseline_used == 5 * GIB + DRIVER_RESERVED_BYTES and meter.missing == ""
    cpu = object.__new__(ModelRunner)
    cpu.device = torch.device("cpu")
    assert cpu._open_memory_meter() is None
