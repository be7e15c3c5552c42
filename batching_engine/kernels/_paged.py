"""What the decode and prefill attention files share: input checks for the paged cache, the dot
dtype, and the torch pieces of their references.

The references are the engine's CPU path, so they are batched torch, not per-token loops, and
they attend the way Hugging Face's Llama does by default (`scaled_dot_product_attention` on
model-dtype tensors), which keeps the CPU engine's greedy tokens equal to transformers'.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._launch import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_dim,
    check_dtype,
    check_inner_contiguous,
    check_ndim,
    require,
)

LOG2_E = 1.4426950408889634
# What the Triton kernels get for a layer with no sliding window: wider than any context.
NO_WINDOW = 1 << 30


def softcap_log2(softcap: float | None) -> float:
    """The Triton kernels' cap, in the log2 units their scores are kept in (0: uncapped)."""
    return float(softcap or 0.0) * LOG2_E


@triton.jit
def paged_kv_tile(
    table_row,
    offs_n,
    n_mask,
    kv_head,
    dims,
    d_mask,
    stride_cache_block,
    stride_cache_offset,
    stride_cache_head,
    BLOCK_SIZE: tl.constexpr,
):
    """Offsets and mask of a tile of cached tokens `offs_n` of one KV head, found through the
    sequence's block-table row: what both attention kernels load K and V from."""
    block = tl.load(table_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    rows = (
        block * stride_cache_block
        + (offs_n % BLOCK_SIZE) * stride_cache_offset
        + kv_head * stride_cache_head
    )
    return rows[:, None] + dims[None, :], n_mask[:, None] & d_mask[None, :]


@triton.jit
def _tanh(x):
    """tanh through the sigmoid, which Triton has on every backend (the interpreter too)."""
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def attend_kv_tile(
    q,
    m_i,
    l_i,
    acc,
    k_cache_ptr,
    v_cache_ptr,
    kv_offsets,
    kv_mask,
    visible,
    scale_log2,
    cap_log2,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """One online-softmax step of both attention kernels: fold a tile of K/V into the running
    max `m_i` (log2 units), denominator `l_i` and output `acc` of each query row. A row that sees
    nothing yet keeps m = -inf and adds nothing (exp2 of -inf is 0, never NaN). With SOFTCAP,
    each score s becomes cap * tanh(s / cap) first (Gemma's soft-capping; `cap_log2` is the cap
    in log2 units, and the unit change cancels inside the tanh)."""
    k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
    if SOFTCAP:
        scores = cap_log2 * _tanh(scores / cap_log2)
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(scores - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


def default_scale(q: torch.Tensor) -> float:
    return 1.0 / math.sqrt(q.shape[-1])


def dot_dtype(dtype: torch.dtype, interpreted: bool) -> tuple[tl.dtype, str]:
    """The dtype `tl.dot` runs in, and its fp32 precision.

    16-bit inputs use the tensor cores as they are. fp32 uses exact (IEEE) products so it stays
    the accurate path. bf16 under the interpreter goes through fp32, because the interpreter
    multiplies bf16 matrices as raw 16-bit integers.
    """
    if dtype == torch.float32 or (dtype == torch.bfloat16 and interpreted):
        return tl.float32, "ieee"
    return (tl.float16 if dtype == torch.float16 else tl.bfloat16), "tf32"


def check_paged_cache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    num_seqs: int,
) -> None:
    """q `[*, num_heads, head_dim]` against the cache, the block tables and the lengths."""
    check_ndim("q", q, 3, "[num_tokens, num_heads, head_dim]")
    check_ndim("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    check_ndim("block_tables", block_tables, 2, "[num_seqs, max_blocks]")
    check_ndim("context_lens", context_lens, 1, "[num_seqs]")
    check_dtype("q", q, FLOAT_DTYPES)
    check_dtype("block_tables", block_tables, INDEX_DTYPES)
    check_dtype("context_lens", context_lens, INDEX_DTYPES)
    for name, t in {"k_cache": k_cache, "v_cache": v_cache}.items():
        require(t.dtype == q.dtype, f"{name}: dtype {t.dtype}, expected {q.dtype} (q's)")
    require(
        v_cache.shape == k_cache.shape and v_cache.stride() == k_cache.stride(),
        f"v_cache: shape {tuple(v_cache.shape)} strides {v_cache.stride()} differ from k_cache's",
    )
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    check_dim("q", q, 2, head_dim, "head_dim of the cache")
    require(
        q.shape[1] % num_kv_heads == 0,
        f"q: {q.shape[1]} heads is not a multiple of the cache's {num_kv_heads} kv heads",
    )
    check_dim("block_tables", block_tables, 0, num_seqs, "one row per sequence")
    check_dim("context_lens", context_lens, 0, num_seqs, "one length per sequence")
    for name, t in {"q": q, "k_cache": k_cache}.items():
        check_inner_contiguous(name, t)
    require(
        block_tables.shape[1] <= 1 or block_tables.stride(1) == 1,
        "block_tables: rows must be contiguous",
    )


def context_slots(
    block_tables: torch.Tensor, context_lens: torch.Tensor, length: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache slot of positions 0..length-1 of each sequence, `[num_seqs, length]`, and
    which of them lie inside the context.

    A position past its context reads the sequence's position 0 instead: a real token, so
    finite, which the caller masks out. Reading what lies past a context (anything, even NaN)
    would need a pass zeroing it, since a masked NaN still poisons the softmax.
    """
    positions = torch.arange(length, device=block_tables.device)
    visible = positions < context_lens[:, None]
    positions = torch.where(visible, positions, 0)
    blocks = block_tables.long().gather(1, positions // block_size).clamp_(min=0)
    return blocks * block_size + positions % block_size, visible


def gather_slots(cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The cache rows at `slots` (`[num_seqs, length]`) in `dtype` (the query's: a float16
    cache under a float32 model, the engine's on the CPU, is widened after the gather, which
    reads half the bytes): `[num_seqs, length, num_kv_heads, head_dim]`. One row copy per
    token from a 2-D view, several times faster than indexing the 4-D cache."""
    rows = cache.reshape(-1, cache.shape[2] * cache.shape[3])
    gathered = F.embedding(slots, rows).view(*slots.shape, cache.shape[2], cache.shape[3])
    return gathered.to(dtype)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor | None,
    scale: float,
    is_causal: bool = False,
    softcap: float | None = None,
) -> torch.Tensor:
    """GQA attention, batch-first: q `[B, n, H, D]`, k/v `[B, L, KVH, D]`, visible `[B, n, L]`
    (None: every key, or causal when `is_causal`, as HF passes a whole prompt) -> `[B, n, H, D]`.
    `softcap`: scores become softcap * tanh(scores / softcap) before the mask (Gemma 2)."""
    if softcap:
        if visible is None and is_causal:
            visible = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device)
            visible = visible.tril()[None]
        return _softcapped_attention(q, k, v, visible, scale, softcap)
    mask = None if visible is None else visible[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
        is_causal=is_causal,
        enable_gqa=True,
    )
    return out.transpose(1, 2)


def _softcapped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor | None,
    scale: float,
    softcap: float,
) -> torch.Tensor:
    """`attention` with capped scores, computed as transformers' eager Gemma 2 attention does
    (scaled product, cap, mask, softmax in float32, then the probabilities in q's dtype):
    `scaled_dot_product_attention` has no hook between the product and the softmax."""
    group = q.shape[2] // k.shape[2]
    keys = k.repeat_interleave(group, dim=2).permute(0, 2, 3, 1)  # [B, H, D, L]
    values = v.repeat_interleave(group, dim=2).transpose(1, 2)  # [B, H, L, D]
    scores = torch.matmul(q.transpose(1, 2), keys) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if visible is not None:
        scores = scores.masked_fill(~visible[:, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, values).transpose(1, 2)
