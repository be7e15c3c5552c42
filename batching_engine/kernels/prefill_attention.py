"""Prefill attention: variable-length query chunks attending to the paged KV cache.

The queries of all sequences in a step are flattened (`cu_seqlens_q` marks where each starts).
Sequence s's chunk holds its last `q_len` tokens: `context_lens[s]` counts every token in the
cache *including* the chunk, whose K/V the caller writes first (kv_cache_write). Query i of the
chunk sits at position `context_lens[s] - q_len + i` and attends causally to every cached token up
to it, so one kernel serves a fresh prompt, a chunk of a long prompt, and a prefix-cache hit.

One program computes one query head for `BLOCK_M` queries of one sequence, flash-attention style:
it walks the keys `BLOCK_N` at a time through the block table with an online softmax, and stops at
the tile's last query (keys beyond it are masked by causality anyway).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import (
    INDEX_DTYPES,
    Launch,
    check_device,
    check_dtype,
    check_inner_contiguous,
    check_ndim,
    is_interpreted,
    next_power_of_2,
    require,
)
from ._paged import (
    LOG2_E,
    NO_WINDOW,
    attend_kv_tile,
    attention,
    check_paged_cache,
    context_slots,
    default_scale,
    dot_dtype,
    gather_slots,
    paged_kv_tile,
    softcap_log2,
)


@triton.jit
def _prefill_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    cu_seqlens_q_ptr,
    out_ptr,
    scale_log2,
    window,
    cap_log2,
    stride_q_token,
    stride_q_head,
    stride_cache_block,
    stride_cache_offset,
    stride_cache_head,
    stride_tables_seq,
    stride_out_token,
    stride_out_head,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    tile = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq).to(tl.int64)
    q_len = (tl.load(cu_seqlens_q_ptr + seq + 1) - q_start).to(tl.int32)
    if tile * BLOCK_M < q_len:
        kv_head = head // GROUP
        context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
        first_pos = context_len - q_len
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        m_mask = offs_m < q_len
        q_pos = first_pos + offs_m
        dims = tl.arange(0, BLOCK_D)
        d_mask = dims < HEAD_DIM
        q_rows = (q_start + offs_m)[:, None] * stride_q_token + head * stride_q_head
        q_mask = m_mask[:, None] & d_mask[None, :]
        q = tl.load(q_ptr + q_rows + dims[None, :], mask=q_mask, other=0.0).to(DOT_DTYPE)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        table_row = block_tables_ptr + seq * stride_tables_seq
        kv_end = tl.minimum(context_len, first_pos + (tile + 1) * BLOCK_M)
        # A sliding-window layer: the tile's first query sees no key before this one.
        kv_start = tl.maximum(first_pos + tile * BLOCK_M - window + 1, 0)
        for start in range(kv_start, kv_end, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_mask = offs_n < kv_end
            kv_offsets, kv_mask = paged_kv_tile(
                table_row,
                offs_n,
                n_mask,
                kv_head,
                dims,
                d_mask,
                stride_cache_block,
                stride_cache_offset,
                stride_cache_head,
                BLOCK_SIZE,
            )
            causal = offs_n[None, :] <= q_pos[:, None]
            in_window = offs_n[None, :] > q_pos[:, None] - window
            visible = n_mask[None, :] & causal & in_window
            m_i, l_i, acc = attend_kv_tile(
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
                DOT_DTYPE,
                DOT_PRECISION,
                SOFTCAP,
            )

        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / l_safe[:, None]
        out_rows = (q_start + offs_m)[:, None] * stride_out_token + head * stride_out_head
        out_ptrs = out_ptr + out_rows + dims[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def prefill_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """The torch path, sequence by sequence: gather the context, attend causally (within the
    last `window` positions of each query, for a sliding-window layer). `softcap`: each score
    s becomes softcap * tanh(s / softcap) (Gemma 2; None or 0: off). The cache may hold
    another dtype than q's, as the decode reference's may."""
    scale = default_scale(q) if scale is None else scale
    out = torch.empty_like(q)
    bounds = cu_seqlens_q.tolist()
    lengths = context_lens.tolist()
    for seq, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        if start == end:
            continue
        slots, _ = context_slots(
            block_tables[seq : seq + 1], context_lens[seq : seq + 1], lengths[seq],
            k_cache.shape[1],
        )  # fmt: skip
        k, v = gather_slots(k_cache, slots, q.dtype), gather_slots(v_cache, slots, q.dtype)
        out[start:end] = _chunk_attention(q[None, start:end], k, v, scale, window, softcap)[0]
    return out


def _chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """q `[1, n, H, D]`: the last n of the L positions in k/v `[1, L, KVH, D]`, causal, and
    within `window` of the query."""
    num_queries, context_len = q.shape[1], k.shape[1]
    if num_queries == context_len and (window is None or window >= context_len):
        return attention(q, k, v, None, scale, is_causal=True, softcap=softcap)
    key_positions = torch.arange(context_len, device=q.device)
    query_positions = key_positions[context_len - num_queries :]
    visible = key_positions[None, :] <= query_positions[:, None]
    if window is not None:
        visible &= key_positions[None, :] > query_positions[:, None] - window
    return attention(q, k, v, visible[None], scale, softcap=softcap)


def _check(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    out: torch.Tensor,
) -> None:
    check_ndim("cu_seqlens_q", cu_seqlens_q, 1, "[num_seqs + 1]")
    check_dtype("cu_seqlens_q", cu_seqlens_q, INDEX_DTYPES)
    num_seqs = cu_seqlens_q.shape[0] - 1
    require(num_seqs >= 0, "cu_seqlens_q: needs at least one entry (0)")
    check_paged_cache(q, k_cache, v_cache, block_tables, context_lens, num_seqs)
    require(
        out.shape == q.shape and out.dtype == q.dtype,
        f"out: shape {tuple(out.shape)} {out.dtype}, expected {tuple(q.shape)} {q.dtype}",
    )
    check_inner_contiguous("out", out)


def prefill_attention_plan(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    max_query_len: int,
    interpreted: bool,
    window: int | None = None,
    softcap: float | None = None,
) -> Launch:
    head_dim = q.shape[2]
    block_d = max(16, next_power_of_2(head_dim))
    # Small tiles keep the interpreter quick and make small tests cross many tile edges.
    block_m = 16 if interpreted else 64
    block_n = 16 if interpreted else (64 if block_d <= 128 else 32)
    dtype, precision = dot_dtype(q.dtype, interpreted)
    return Launch(
        grid=(triton.cdiv(max_query_len, block_m), cu_seqlens_q.shape[0] - 1, q.shape[1]),
        args=(
            q,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            cu_seqlens_q,
            out,
            float(scale) * LOG2_E,
            NO_WINDOW if window is None else window,
            softcap_log2(softcap),
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            block_tables.stride(0),
            out.stride(0),
            out.stride(1),
        ),
        constexprs={
            "GROUP": q.shape[1] // k_cache.shape[2],
            "HEAD_DIM": head_dim,
            "BLOCK_D": block_d,
            "BLOCK_SIZE": k_cache.shape[1],
            "BLOCK_M": block_m,
            "BLOCK_N": block_n,
            "DOT_DTYPE": dtype,
            "DOT_PRECISION": precision,
            "SOFTCAP": bool(softcap),
        },
        num_warps=4 if block_d <= 64 else 8,
        num_stages=2,
    )


def prefill_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float | None = None,
    max_query_len: int | None = None,
    out: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """The Triton path. Pass `max_query_len` (the runner knows it) to spare a device sync.
    `window`: each query sees the last `window` positions up to its own only. `softcap`: as
    the reference's."""
    out = torch.empty_like(q) if out is None else out
    _check(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, out)
    check_device(
        _prefill_attention_kernel,
        {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables,
         "context_lens": context_lens, "cu_seqlens_q": cu_seqlens_q, "out": out},
    )  # fmt: skip
    if max_query_len is None:
        max_query_len = int(cu_seqlens_q.diff().max()) if cu_seqlens_q.shape[0] > 1 else 0
    if q.shape[0] == 0 or max_query_len == 0:
        return out
    scale = default_scale(q) if scale is None else scale
    plan = prefill_attention_plan(
        q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, out, scale,
        max_query_len, interpreted=is_interpreted(_prefill_attention_kernel), window=window,
        softcap=softcap,
    )  # fmt: skip
    plan.run(_prefill_attention_kernel)
    return out
