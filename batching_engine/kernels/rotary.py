"""Rotary position embedding for q and k in one launch, Hugging Face Llama's `rotate_half` layout.

For head vector x with rotary part r = x[:rotary_dim] split into halves (x1, x2):
`r' = r * cos[pos] + cat(-x2, x1) * sin[pos]`; dimensions past `rotary_dim` pass through.
The cos/sin caches are `[max_pos, rotary_dim]` (HF's `cat(freqs, freqs)` layout; both halves
are read, so any table works). Like HF, cos and sin are rounded to the input dtype and each
product is rounded before the sum, so the Triton path matches the torch path bit for bit on a GPU.
"""

from __future__ import annotations

import torch
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


@triton.jit
def _rotate_heads(
    x_ptr,
    out_ptr,
    token,
    num_heads,
    stride_x_token,
    stride_x_head,
    stride_out_token,
    stride_out_head,
    cos1,
    cos2,
    sin1,
    sin2,
    HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_HALF)
    head_mask = heads < num_heads
    mask = head_mask[:, None] & (dims < HALF)[None, :]
    x_row = x_ptr + token * stride_x_token + heads[:, None] * stride_x_head
    out_row = out_ptr + token * stride_out_token + heads[:, None] * stride_out_head
    dtype = out_ptr.dtype.element_ty
    x1 = tl.load(x_row + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + HALF + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    c1, c2, s1, s2 = cos1[None, :], cos2[None, :], sin1[None, :], sin2[None, :]
    first = (x1 * c1).to(dtype).to(tl.float32) - (x2 * s1).to(dtype).to(tl.float32)
    second = (x2 * c2).to(dtype).to(tl.float32) + (x1 * s2).to(dtype).to(tl.float32)
    tl.store(out_row + dims[None, :], first.to(dtype), mask=mask)
    tl.store(out_row + HALF + dims[None, :], second.to(dtype), mask=mask)
    if HEAD_DIM > 2 * HALF:
        rest = 2 * HALF + tl.arange(0, BLOCK_PASS)
        rest_mask = head_mask[:, None] & (rest < HEAD_DIM)[None, :]
        passed = tl.load(x_row + rest[None, :], mask=rest_mask, other=0.0)
        tl.store(out_row + rest[None, :], passed, mask=rest_mask)


@triton.jit
def _rotary_kernel(
    positions_ptr,
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    cos_ptr,
    sin_ptr,
    num_heads,
    num_kv_heads,
    stride_q_token,
    stride_q_head,
    stride_k_token,
    stride_k_head,
    stride_q_out_token,
    stride_q_out_head,
    stride_k_out_token,
    stride_k_out_head,
    stride_cos,
    stride_sin,
    HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, BLOCK_HALF)
    dim_mask = dims < HALF
    dtype = q_out_ptr.dtype.element_ty
    cos_row = cos_ptr + pos * stride_cos
    sin_row = sin_ptr + pos * stride_sin
    # HF rounds cos and sin to the input dtype first.
    cos1 = tl.load(cos_row + dims, mask=dim_mask, other=0.0).to(dtype).to(tl.float32)
    cos2 = tl.load(cos_row + HALF + dims, mask=dim_mask, other=0.0).to(dtype).to(tl.float32)
    sin1 = tl.load(sin_row + dims, mask=dim_mask, other=0.0).to(dtype).to(tl.float32)
    sin2 = tl.load(sin_row + HALF + dims, mask=dim_mask, other=0.0).to(dtype).to(tl.float32)
    _rotate_heads(
        q_ptr, q_out_ptr, token, num_heads,
        stride_q_token, stride_q_head, stride_q_out_token, stride_q_out_head,
        cos1, cos2, sin1, sin2, HALF, HEAD_DIM, BLOCK_H, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip
    _rotate_heads(
        k_ptr, k_out_ptr, token, num_kv_heads,
        stride_k_token, stride_k_head, stride_k_out_token, stride_k_out_head,
        cos1, cos2, sin1, sin2, HALF, HEAD_DIM, BLOCK_H, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip


def rotary_embedding_reference(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch path: Hugging Face's `apply_rotary_pos_emb`, with partial rotary support.
    The positions' cos and sin are looked up once for q and k."""
    rotary_dim = cos.shape[-1]
    c = cos[positions].to(q.dtype)[:, None, :]
    s = sin[positions].to(q.dtype)[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        r = x[..., :rotary_dim]
        x1, x2 = r.chunk(2, dim=-1)
        rotated = r * c + torch.cat((-x2, x1), dim=-1) * s
        if rotary_dim == x.shape[-1]:
            return rotated
        return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)

    return rotate(q), rotate(k)


def _check(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
) -> None:
    check_ndim("positions", positions, 1, "[num_tokens]")
    check_dtype("positions", positions, (torch.int64, torch.int32))
    check_ndim("q", q, 3, "[num_tokens, num_heads, head_dim]")
    check_ndim("k", k, 3, "[num_tokens, num_kv_heads, head_dim]")
    check_ndim("cos", cos, 2, "[max_position, rotary_dim]")
    check_dtype("q", q, FLOAT_DTYPES)
    check_dtype("cos", cos, FLOAT_DTYPES)
    check_dtype("sin", sin, FLOAT_DTYPES)
    num_tokens, _, head_dim = q.shape
    check_dim("q", q, 0, positions.shape[0], "one row per position")
    check_dim("k", k, 0, num_tokens, "as many tokens as q")
    check_dim("k", k, 2, head_dim, "the head_dim of q")
    require(k.dtype == q.dtype, f"k: dtype {k.dtype}, expected {q.dtype} (the dtype of q)")
    require(tuple(sin.shape) == tuple(cos.shape), f"sin: shape {sin.shape} != cos {cos.shape}")
    rotary_dim = cos.shape[1]
    require(
        rotary_dim % 2 == 0 and 0 < rotary_dim <= head_dim,
        f"cos: rotary_dim {rotary_dim} must be even and within head_dim {head_dim}",
    )
    for name, out, like in (("q_out", q_out, q), ("k_out", k_out, k)):
        require(
            out.shape == like.shape and out.dtype == like.dtype,
            f"{name}: shape {tuple(out.shape)} {out.dtype}, "
            f"expected {tuple(like.shape)} {like.dtype}",
        )
    for name, t in {"q": q, "k": k, "cos": cos, "sin": sin, "q_out": q_out, "k_out": k_out}.items():
        check_inner_contiguous(name, t)


def rotary_plan(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
) -> Launch:
    head_dim = q.shape[2]
    half = cos.shape[1] // 2
    block_h = next_power_of_2(max(q.shape[1], k.shape[1]))
    return Launch(
        grid=(q.shape[0],),
        args=(
            positions,
            q,
            k,
            q_out,
            k_out,
            cos,
            sin,
            q.shape[1],
            k.shape[1],
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            q_out.stride(0),
            q_out.stride(1),
            k_out.stride(0),
            k_out.stride(1),
            cos.stride(0),
            sin.stride(0),
        ),
        constexprs={
            "HALF": half,
            "HEAD_DIM": head_dim,
            "BLOCK_H": block_h,
            "BLOCK_HALF": next_power_of_2(half),
            "BLOCK_PASS": next_power_of_2(head_dim - 2 * half),
        },
        num_warps=4 if block_h * half >= 2048 else 2,
        num_stages=1,
    )


def rotary_embedding_triton(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_out: torch.Tensor | None = None,
    k_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton path; `q_out=q, k_out=k` rotates in place (a program reads before it writes)."""
    q_out = torch.empty_like(q) if q_out is None else q_out
    k_out = torch.empty_like(k) if k_out is None else k_out
    _check(positions, q, k, cos, sin, q_out, k_out)
    tensors = {"positions": positions, "q": q, "k": k, "cos": cos, "sin": sin}
    check_device(_rotary_kernel, tensors | {"q_out": q_out, "k_out": k_out})
    if q.shape[0] > 0:
        rotary_plan(positions, q, k, cos, sin, q_out, k_out).run(_rotary_kernel)
    return q_out, k_out
