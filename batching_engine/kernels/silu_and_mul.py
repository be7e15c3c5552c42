"""SiLU-and-mul, the gate of a Llama MLP: `[..., 2*d]` (gate | up) -> silu(gate) * up.

Fusing the two halves saves writing and re-reading the `[..., d]` activation. The kernel rounds
silu(gate) to the input dtype before the product, as torch (and so Hugging Face) does, so the
Triton path and the torch path agree to the last bit on a GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._launch import (
    FLOAT_DTYPES,
    Launch,
    check_device,
    check_dtype,
    check_inner_contiguous,
    next_power_of_2,
    require,
)

_MAX_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    d,
    stride_x_row,
    stride_out_row,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    x_row = x_ptr + row * stride_x_row
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + d + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32)
    out = (act * up).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out_row + cols, out, mask=mask)


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """The torch path: what Hugging Face's LlamaMLP computes between its projections."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def _check(x: torch.Tensor, out: torch.Tensor) -> None:
    check_dtype("x", x, FLOAT_DTYPES)
    require(x.dim() >= 1 and x.shape[-1] % 2 == 0, f"x: last dimension must be even, got {x.shape}")
    expected = (*x.shape[:-1], x.shape[-1] // 2)
    require(tuple(out.shape) == expected, f"out: shape {tuple(out.shape)}, expected {expected}")
    require(out.dtype == x.dtype, f"out: dtype {out.dtype}, expected {x.dtype}")
    check_inner_contiguous("x", x)
    check_inner_contiguous("out", out)
    require(out.dim() <= 2 or out.is_contiguous(), "out: must be contiguous when it has >2 dims")


def silu_and_mul_plan(x2d: torch.Tensor, out2d: torch.Tensor) -> Launch:
    d = out2d.shape[1]
    block = min(_MAX_BLOCK, next_power_of_2(d))
    return Launch(
        grid=(x2d.shape[0], triton.cdiv(d, block)),
        args=(x2d, out2d, d, x2d.stride(0), out2d.stride(0)),
        constexprs={"BLOCK": block},
        num_warps=4,
    )


def silu_and_mul_triton(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton path. `out` may be given (e.g. a preallocated buffer); it is returned."""
    if out is None:
        out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    _check(x, out)
    check_device(_silu_and_mul_kernel, {"x": x, "out": out})
    if out.numel() == 0:
        return out
    x2d = x.reshape(-1, x.shape[-1])
    out2d = out.view(-1, out.shape[-1])
    silu_and_mul_plan(x2d, out2d).run(_silu_and_mul_kernel)
    return out
