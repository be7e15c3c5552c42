"""Fused residual-add + RMSNorm: one read of x and the residual, one write of each result.

A Llama block runs `residual = x + residual; x = rmsnorm(residual)` twice per layer; fused, the
sum never makes a round trip through memory. The kernel rounds where Hugging Face's LlamaRMSNorm
rounds (the sum, the normalised value, the product with the weight, all in the input dtype), so
both paths give the same greedy tokens.
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
    check_dim,
    check_dtype,
    check_inner_contiguous,
    check_ndim,
    next_power_of_2,
    require,
)

MAX_HIDDEN = 65536


@triton.jit
def _fused_add_rmsnorm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    hidden,
    eps,
    stride_x,
    stride_residual,
    stride_out,
    stride_residual_out,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    dtype = out_ptr.dtype.element_ty
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        h = (h + r.to(tl.float32)).to(dtype).to(tl.float32)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, h.to(dtype), mask=mask)
    rstd = tl.rsqrt(tl.sum(h * h, axis=0) / hidden + eps)
    normed = (h * rstd).to(dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (normed * w).to(dtype), mask=mask)


def fused_add_rmsnorm_reference(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch path: `(rmsnorm(x + residual), x + residual)`, or `(rmsnorm(x), x)`. In
    float32 that is torch's one fused `rms_norm`, bitwise the formula below (tested), instead of
    eight ops per norm and two norms a layer."""
    if residual is not None:
        x = x + residual
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps), x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * h.to(x.dtype)).to(x.dtype), x


def _check(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    out: torch.Tensor,
    residual_out: torch.Tensor | None,
) -> None:
    check_ndim("x", x, 2, "[num_tokens, hidden]")
    check_dtype("x", x, FLOAT_DTYPES)
    check_dtype("weight", weight, FLOAT_DTYPES)
    hidden = x.shape[1]
    require(hidden <= MAX_HIDDEN, f"x: hidden size {hidden} exceeds {MAX_HIDDEN}")
    check_ndim("weight", weight, 1, "[hidden]")
    check_dim("weight", weight, 0, hidden, "the hidden size of x")
    named = {"x": x, "out": out, "residual": residual, "residual_out": residual_out}
    for name, t in named.items():
        if t is None:
            continue
        require(
            tuple(t.shape) == tuple(x.shape) and t.dtype == x.dtype,
            f"{name}: shape {tuple(t.shape)} {t.dtype}, expected {tuple(x.shape)} {x.dtype}",
        )
        check_inner_contiguous(name, t)
    check_inner_contiguous("weight", weight)


def fused_add_rmsnorm_plan(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    residual_out: torch.Tensor | None,
) -> Launch:
    block = next_power_of_2(x.shape[1])
    has_residual = residual is not None
    # Without a residual the kernel never touches these pointers; any tensor will do.
    residual = residual if has_residual else x
    residual_out = residual_out if has_residual else out
    return Launch(
        grid=(x.shape[0],),
        args=(
            x,
            residual,
            weight,
            out,
            residual_out,
            x.shape[1],
            float(eps),
            x.stride(0),
            residual.stride(0),
            out.stride(0),
            residual_out.stride(0),
        ),
        constexprs={"HAS_RESIDUAL": has_residual, "BLOCK": block},
        num_warps=min(16, max(1, block // 512)),
        num_stages=1,
    )


def fused_add_rmsnorm_triton(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton path; returns `(normed, new_residual)`, into `out`/`residual_out` if given.

    Passing `residual_out=residual` updates the residual in place (each row is read before it is
    written, by the same program).
    """
    out = torch.empty_like(x) if out is None else out
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x)
    _check(x, residual, weight, out, residual_out)
    tensors = {"x": x, "weight": weight, "out": out}
    if residual is not None:
        tensors |= {"residual": residual, "residual_out": residual_out}
    check_device(_fused_add_rmsnorm_kernel, tensors)
    if x.shape[0] > 0:
        plan = fused_add_rmsnorm_plan(x, residual, weight, eps, out, residual_out)
        plan.run(_fused_add_rmsnorm_kernel)
    return out, (residual_out if residual is not None else x)
