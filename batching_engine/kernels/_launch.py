"""What every kernel launcher shares: input checks with clear errors, and the launch plan.

A launcher is split in two so each half can be checked without a GPU: a pure *plan* (grid,
arguments, compile-time constants, warps) computed from shapes, dtypes and strides only, and
the launch itself. The ahead-of-time compile test compiles exactly the plan a launcher would run
on a GPU; the interpreter tests run it on CPU tensors.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


class KernelInputError(ValueError):
    """A kernel was called with tensors it cannot take; the message names the argument."""


def require(ok: bool, message: str) -> None:
    if not ok:
        raise KernelInputError(message)


def check_dtype(name: str, tensor: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
    require(tensor.dtype in allowed, f"{name}: dtype {tensor.dtype} is not one of {names}")


def check_ndim(name: str, tensor: torch.Tensor, ndim: int, layout: str) -> None:
    require(tensor.dim() == ndim, f"{name}: expected {layout}, got shape {tuple(tensor.shape)}")


def check_dim(name: str, tensor: torch.Tensor, dim: int, size: int, what: str) -> None:
    require(
        tensor.shape[dim] == size,
        f"{name}: dimension {dim} is {tensor.shape[dim]}, expected {size} ({what})",
    )


def check_inner_contiguous(name: str, tensor: torch.Tensor) -> None:
    """Kernels address the last dimension as contiguous; any other stride is passed in."""
    require(
        tensor.shape[-1] <= 1 or tensor.stride(-1) == 1,
        f"{name}: the last dimension must be contiguous (stride 1), got strides {tensor.stride()}",
    )


def check_device(kernel: object, names_and_tensors: dict[str, torch.Tensor]) -> None:
    """All tensors on one device, and a CUDA one unless the kernel runs in Triton's interpreter."""
    devices = {name: t.device for name, t in names_and_tensors.items()}
    require(len(set(devices.values())) == 1, f"tensors must be on one device: {devices}")
    device = next(iter(devices.values()))
    require(
        device.type == "cuda" or is_interpreted(kernel),
        f"Triton kernels need CUDA tensors, got {device}; "
        "use the torch path (INFERGRID_KERNELS=torch or auto) on this device",
    )


def is_interpreted(kernel: object) -> bool:
    return isinstance(kernel, InterpretedFunction)


def next_power_of_2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


@functools.lru_cache(maxsize=16)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors to fill; a small stand-in off the GPU (the interpreter)."""
    if device.type != "cuda":
        return 4
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


@dataclass(frozen=True)
class Launch:
    """One kernel launch, fully decided on the host: what the AOT test compiles and `run` runs."""

    grid: tuple[int, ...]
    args: tuple[Any, ...]
    constexprs: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2

    def run(self, kernel: Any) -> None:
        kernel[self.grid](
            *self.args, **self.constexprs, num_warps=self.num_warps, num_stages=self.num_stages
        )
