"""MPS decided on plain data: which GPUs get a daemon, its folders and environment, and what a
share holder on an MPS GPU is given; and how much memory a time slice may use."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from device_plugin.allocator import grant
from device_plugin.config import MAX_MPS_ROOT_CHARS, PluginConfig, parse_config
from device_plugin.devices import by_id, resource_devices
from device_plugin.ledger import Ledger
from device_plugin.mps import daemon_env, default_cores, mps_gpus
from device_plugin.visibility import MOUNT_DIR
from infergrid.errors import ContractError
from infergrid.share_edits import SHM_MOUNT, Mount, gpu_paths, mps_client, shm_dir
from tests.device_plugin.conftest import pod, share, whole
from tests.device_plugin.test_allocator import INVENTORY, UUIDS
from tests.placement.builders import gpu, inventory

ROOT = Path("/run/infergrid/mps")
CONFIG = PluginConfig(node_name="n", vgpu_slots_per_gpu=4, mps=True, mps_root=ROOT)
A, B = UUIDS
MIB = 1000  # the fleet's GPUs
MIXED = inventory(gpu(0, mig=("3g.40gb",)), gpu(1), gpu(2))


def granted(config: PluginConfig, ids: list[str], *assigned, held=()):
    """Allocate's answer for the first of ``assigned`` (pods by age), beside ``held`` grants."""
    devices = by_id(resource_devices(INVENTORY, config, lambda uuid: True))
    pods = [pod(f"p{i}", "n", c, age_s=i) for i, c in enumerate(assigned)]
    ledger = Ledger({(f"uid-held-{i}", c.name): c for i, c in enumerate(held)})
    return grant(ids, devices, "n", pods, ledger, config)


def test_each_gpu_has_its_own_pipe_and_log_folders_and_all_share_one_shm():
    assert gpu_paths(ROOT, "GPU-a").pipe == ROOT / "GPU-a" / "pipe"
    assert gpu_paths(ROOT, "GPU-a").log == ROOT / "GPU-a" / "log"
    assert gpu_paths(ROOT, "GPU-a").pid_file == ROOT / "GPU-a/pipe/nvidia-cuda-mps-control.pid"
    assert gpu_paths(ROOT, "GPU-a").control_socket == ROOT / "GPU-a/pipe/control"
    assert shm_dir(ROOT) == ROOT / "shm"


def test_a_daemon_is_shown_only_its_gpu_and_its_own_folders():
    env = daemon_env({"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "all"}, ROOT, "GPU-a")
    assert env == {
        "PATH": "/usr/bin",
        "CUDA_VISIBLE_DEVICES": "GPU-a",
        "CUDA_MPS_PIPE_DIRECTORY": "/run/infergrid/mps/GPU-a/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/run/infergrid/mps/GPU-a/log",
    }


@pytest.mark.parametrize(
    ("strategy", "daemons"),
    [
        ("mixed", ["GPU-1", "GPU-2"]),
        ("single", ["GPU-1", "GPU-2"]),
        ("none", ["GPU-0", "GPU-1", "GPU-2"]),
    ],
)
def test_every_gpu_that_offers_share_slots_gets_a_daemon_and_no_other(strategy, daemons):
    config = replace(CONFIG, mig_strategy=strategy)
    assert [g.uuid for g in mps_gpus(MIXED, config)] == daemons
    slots = resource_devices(MIXED, config, lambda uuid: True)["infergrid.io/vgpu"]
    assert sorted({d.gpu.uuid for d in slots}) == daemons


def test_with_mps_off_no_gpu_gets_a_daemon():
    assert mps_gpus(MIXED, replace(CONFIG, mps=False)) == ()


@given(st.integers(1, 128))
def test_the_default_core_share_is_one_slots_part_of_the_gpu(slots):
    cores = default_cores(replace(CONFIG, vgpu_slots_per_gpu=slots))
    assert 1 <= cores <= 100 and (cores == 1 or cores * slots <= 100 < (cores + 1) * slots)


def test_a_set_default_core_share_wins():
    assert default_cores(CONFIG) == 25
    assert default_cores(replace(CONFIG, mps_default_cores=40)) == 40


def test_a_holder_gets_its_gpus_daemon_the_shared_memory_and_its_own_limits():
    client = mps_client(ROOT, "GPU-a", 4096, 30)
    assert client.envs == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/infergrid/mps/GPU-a/pipe",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }
    assert client.mounts == (
        Mount("/run/infergrid/mps/GPU-a/pipe", "/run/infergrid/mps/GPU-a/pipe", read_only=False),
        Mount(SHM_MOUNT, "/run/infergrid/mps/shm", read_only=False),
    )


def test_allocate_gives_a_share_on_an_mps_gpu_its_daemon_and_limits():
    answer = granted(CONFIG, [f"{A}::vgpu-0"], share("c", A, 400, cores=30))
    pipe = f"/run/infergrid/mps/{A}/pipe"
    assert answer.envs == {
        "NVIDIA_VISIBLE_DEVICES": MOUNT_DIR,
        "INFERGRID_GPU_MEMORY_MIB": "400",
        "CUDA_MPS_PIPE_DIRECTORY": pipe,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=400M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }
    assert answer.mounts == (
        Mount(f"{MOUNT_DIR}/{A}", "/dev/null"),
        Mount(pipe, pipe, read_only=False),
        Mount("/dev/shm", "/run/infergrid/mps/shm", read_only=False),
    )


def test_a_share_without_gpu_cores_runs_at_the_default_core_share_never_unlimited():
    answer = granted(CONFIG, [f"{A}::vgpu-0"], share("c", A, 400, cores=0))
    assert answer.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"  # 100 / 4 slots
    config = replace(CONFIG, mps_default_cores=60)
    answer = granted(config, [f"{A}::vgpu-0"], share("c", A, 400, cores=0))
    assert answer.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60"


def test_of_several_possible_holders_the_container_gets_the_smallest_limits():
    """The kubelet may be admitting either pod, so the container gets what both may have."""
    both = share("c", A, 400, cores=50), share("c", A, 300, cores=0)
    answer = granted(CONFIG, [f"{A}::vgpu-0"], *both)
    assert answer.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=300M"
    assert answer.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


@pytest.mark.parametrize("mps", [True, False])
def test_whole_gpus_never_get_mps(mps):
    answer = granted(replace(CONFIG, mps=mps), [A, B], whole("c", A, B, memory=MIB))
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": MOUNT_DIR, "INFERGRID_GPU_MEMORY_MIB": "1000"}
    assert [m.host_path for m in answer.mounts] == ["/dev/null", "/dev/null"]


def test_without_mps_a_share_gets_only_its_memory_budget():
    answer = granted(replace(CONFIG, mps=False), [f"{A}::vgpu-0"], share("c", A, 400))
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": MOUNT_DIR, "INFERGRID_GPU_MEMORY_MIB": "400"}


@given(st.integers(1, 64))
def test_time_slices_of_a_gpu_split_its_memory_so_all_of_them_fit(replicas):
    config = replace(CONFIG, gpu_replicas=replicas)
    slices = [whole("c", A, memory=MIB) for _ in range(replicas)]
    answer = granted(config, [f"{A}::0" if replicas > 1 else A], *slices)
    budget = int(answer.envs["INFERGRID_GPU_MEMORY_MIB"])
    assert budget * replicas <= MIB < (budget + 1) * replicas
    assert "CUDA_MPS_PIPE_DIRECTORY" not in answer.envs


def test_the_mps_settings_are_read_and_checked():
    doc = {"version": "v1", "mpsRoot": "/var/run/mps", "mpsControl": "/opt/mps-control"}
    assert parse_config({**doc, "mpsDefaultCores": 20}) == {
        "mps_root": Path("/var/run/mps"),
        "mps_control": "/opt/mps-control",
        "mps_default_cores": 20,
    }
    assert (
        PluginConfig().mps_root == ROOT and PluginConfig().mps_control == "nvidia-cuda-mps-control"
    )


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"mpsRoot": "run/mps"}, "mpsRoot: must be an absolute path, got 'run/mps'"),
        (
            {"mpsRoot": "/" + "m" * MAX_MPS_ROOT_CHARS},
            f"mpsRoot: is {MAX_MPS_ROOT_CHARS + 1} characters; at most {MAX_MPS_ROOT_CHARS}",
        ),
        ({"mpsDefaultCores": 0}, "mpsDefaultCores"),
        ({"mpsDefaultCores": 101}, "mpsDefaultCores"),
        ({"mpsControl": 5}, "mpsControl"),
    ],
)
def test_a_bad_mps_setting_names_the_field(value, reason):
    with pytest.raises(ContractError) as bad:
        parse_config({"version": "v1", **value})
    assert str(bad.value).startswith(reason)


def test_the_longest_socket_under_the_longest_root_still_binds():
    root = "/" + "m" * (MAX_MPS_ROOT_CHARS - 1)
    parse_config({"version": "v1", "mpsRoot": root})
    longest = f"{root}/{'GPU-' + '0' * 36}/pipe/control_privileged"
    assert len(longest) <= 107
