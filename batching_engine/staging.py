"""Host tensors onto the device without a host sync: one pinned staging buffer, one copy.

A copy from pageable host memory makes the host wait for the stream, and a step used to make
several (its token ids, positions, slots, block tables, lengths, the rows to sample). On CUDA
`stage` packs them all into one pinned buffer and copies it with `non_blocking=True`, so the
host queues the step's kernels right behind the copy; the one `.tolist()` of the sampled
tokens is then the step's only sync. torch's pinned-memory cache keeps the buffer until its
copy is done, even once freed here. On any other device the tensors are moved as they are.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

_ALIGN = 16  # every tensor starts at a multiple of this many bytes, so it can be viewed


def stage(host: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """`host`'s tensors (on the CPU) on `device`, same names, dtypes and shapes."""
    device = torch.device(device)
    if device.type != "cuda":
        return {name: tensor.to(device) for name, tensor in host.items()}
    offsets, size = {}, 0
    for name, tensor in host.items():
        offsets[name] = size
        size += -(-_nbytes(tensor) // _ALIGN) * _ALIGN
    staging = pinned_buffer(size)
    for name, tensor in host.items():
        flat = tensor.contiguous().reshape(-1).view(torch.uint8)
        staging[offsets[name] : offsets[name] + flat.numel()].copy_(flat)
    on_device = staging.to(device, non_blocking=True)
    return {
        name: on_device[offsets[name] : offsets[name] + _nbytes(tensor)]
        .view(tensor.dtype)
        .view(tensor.shape)
        for name, tensor in host.items()
    }


def pinned_buffer(num_bytes: int) -> torch.Tensor:
    """Page-locked host memory, which a non-blocking copy reads without the host waiting."""
    return torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
