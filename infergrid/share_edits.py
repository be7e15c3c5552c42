"""What a GPU holder's container is given beside its devices: its memory budget, and on an
MPS GPU the daemon's folders and the limits MPS enforces.

The device plugin's Allocate and the DRA driver's CDI specs hand out the same edits, so an
engine on a share sees the same environment whichever way its node offers GPUs.
The MPS folders are the same paths on the host, in the daemons' container and in a
holder's container: the chart mounts the root at its own path, and the edits do the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

GPU_MEMORY_ENV: Final = "INFERGRID_GPU_MEMORY_MIB"
"""The MiB the holder may use; the engine sizes its memory budget by it."""
PID_FILE: Final = "nvidia-cuda-mps-control.pid"
"""What a control daemon writes into its pipe folder, its pid inside, and removes on ``quit``."""
CONTROL_SOCKET: Final = "control"
"""The control daemon's socket in its pipe folder; left behind when the daemon is killed."""
SHM_MOUNT: Final = "/dev/shm"
ALL_CORES: Final = 100


@dataclass(frozen=True, slots=True)
class MpsPaths:
    """One GPU's control daemon folders: ``pipe`` (CUDA_MPS_PIPE_DIRECTORY) and ``log``."""

    pipe: Path
    log: Path

    @property
    def pid_file(self) -> Path:
        return self.pipe / PID_FILE

    @property
    def control_socket(self) -> Path:
        return self.pipe / CONTROL_SOCKET


def gpu_paths(root: Path, uuid: str) -> MpsPaths:
    return MpsPaths(root / uuid / "pipe", root / uuid / "log")


def shm_dir(root: Path) -> Path:
    """The host folder every MPS process on the node uses as ``/dev/shm``."""
    return root / "shm"


@dataclass(frozen=True, slots=True)
class Mount:
    """A mount made in the container."""

    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class MpsClient:
    """What a share holder on an MPS GPU is given beside its GPU: the daemon and its limits."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...]


def mps_client(root: Path, uuid: str, memory_mib: int, cores: int) -> MpsClient:
    """GPU ``uuid``'s daemon (pipe folder and shared memory) and limits of ``memory_mib`` and
    ``cores`` percent; the holder sees one GPU, device 0, so the memory limit names 0."""
    pipe = gpu_paths(root, uuid).pipe
    return MpsClient(
        envs={
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory_mib}M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(cores),
        },
        mounts=(
            Mount(str(pipe), str(pipe), read_only=False),
            Mount(SHM_MOUNT, str(shm_dir(root)), read_only=False),
        ),
    )


def share_edits(
    memory_mib: int, mps_root: Path | None, uuid: str, cores: int
) -> tuple[dict[str, str], tuple[Mount, ...]]:
    """The holder's memory budget, and with ``mps_root`` (an MPS GPU) its daemon and limits."""
    envs = {GPU_MEMORY_ENV: str(memory_mib)}
    if mps_root is None:
        return envs, ()
    client = mps_client(mps_root, uuid, memory_mib, cores)
    return {**envs, **client.envs}, client.mounts
