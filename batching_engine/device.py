"""Which device the engine runs on: `auto` (the default) takes the GPU the pod was given.

The device plugin's Allocate makes the granted GPU, share or MIG instance the only one the
container sees (NVIDIA_VISIBLE_DEVICES, or CDI), so "a CUDA device is visible" is exactly
"the scheduler placed this pod on a GPU". Without one the engine still serves, on the CPU,
and says so once in its log: a pod that should have a GPU and runs on the CPU is a
misconfiguration someone must be able to find.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from infergrid.errors import ContractError

if TYPE_CHECKING:
    import torch

AUTO: Final = "auto"
DEVICE_FLAG: Final = "--device"
VISIBLE_ENVS: Final = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


@dataclass(frozen=True, slots=True)
class DeviceChoice:
    """The torch device, its default dtype, and why it was chosen (for the start-up log)."""

    device: str
    dtype: str
    reason: str

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


def check_device(asked: str) -> None:
    if not _DEVICE.fullmatch(asked):
        raise ContractError(DEVICE_FLAG, f"expected auto, cpu, cuda or cuda:N, got {asked!r}")


def choose_device(asked: str, cuda_devices: int, environ: Mapping[str, str]) -> DeviceChoice:
    """`asked` resolved against what is visible: `cuda_devices` is torch's count (0 without
    CUDA). bfloat16 on a GPU (every GPU the plugin advertises has it), float32 on a CPU."""
    check_device(asked)
    visible = ", ".join(f"{k}={environ[k]}" for k in VISIBLE_ENVS if k in environ) or "unset"
    if asked.startswith("cuda"):
        index = int(asked.partition(":")[2] or 0)
        if index >= cuda_devices:
            raise ContractError(
                DEVICE_FLAG, f"{asked} asked for, but {cuda_devices} CUDA device(s) are visible"
                f" ({visible})",
            )  # fmt: skip
        return DeviceChoice(asked, "bfloat16", f"{DEVICE_FLAG} {asked}")
    if asked == "cpu":
        return DeviceChoice("cpu", "float32", f"{DEVICE_FLAG} cpu")
    if cuda_devices > 0:
        return DeviceChoice(
            "cuda", "bfloat16", f"{cuda_devices} CUDA device(s) visible ({visible})"
        )
    return DeviceChoice(
        "cpu", "float32", f"no CUDA device is visible ({visible}); serving on the CPU"
    )


def use_device(device: str | torch.device | None) -> None:
    """Make `device` the calling thread's current CUDA device; nothing for the CPU (or None).

    Triton launches, `torch.cuda.Stream()` and CUDA-graph capture go to the thread's current
    device, not to their tensors' device, and each thread starts on device 0: every thread
    that touches the model (the loader, the engine's worker) calls this first, or a model on
    `cuda:1` has its kernels launched on `cuda:0`. A bare "cuda" is device 0, where such a
    thread's tensors go.
    """
    import torch  # here, not at the top: choosing a device must not need torch

    if device is None:
        return
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)
