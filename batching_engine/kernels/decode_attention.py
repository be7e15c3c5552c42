"""Paged decode attention: one new query token per sequence against its whole cached context.

Decode is bound by reading the KV cache, so the kernel reads each cached K/V row once: a program
serves one (sequence, kv head) pair and all the query heads that share that kv head (GQA), the
group padded to 16 rows so `tl.dot` can run on the tensor cores.

Split-K: when sequences x kv heads are too few to fill the GPU (small batches, long contexts),
the context is cut into `num_splits` ranges handled by separate programs, each writing a
normalised partial output and its log-sum-exp; a second, tiny kernel merges them. The split count
depends on shapes only (the block-table width bounds the context), never on device values, so a
CUDA graph can capture the launch.

A sequence with context length 0 (a padded row of a CUDA-graph batch) gets zeros, reading nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._launch import (
    Launch,
    check_device,
    check_inner_contiguous,
    is_interpreted,
    next_power_of_2,
    require,
    sm_count,
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

MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 32
PROGRAMS_PER_SM = 4
# The torch path groups sequences by context length: fewer calls against less padding.
MAX_GROUPS = 4
GROUP_CALL_ROWS = 1024  # what one more call costs, in context positions attended


@triton.jit
def _decode_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    lse_ptr,
    scale_log2,
    tokens_per_split,
    window,
    cap_log2,
    stride_q_seq,
    stride_q_head,
    stride_cache_block,
    stride_cache_offset,
    stride_cache_head,
    stride_tables_seq,
    stride_out_seq,
    stride_out_head,
    stride_out_split,
    stride_lse_seq,
    stride_lse_head,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SPLIT: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    split_start = split * tokens_per_split
    end = tl.minimum(split_start + tokens_per_split, context_len)
    # A sliding-window layer reads the last `window` tokens only (NO_WINDOW: all of them).
    start = tl.maximum(split_start, context_len - window)

    g = tl.arange(0, BLOCK_G)
    g_mask = g < GROUP
    heads = kv_head * GROUP + g
    dims = tl.arange(0, BLOCK_D)
    d_mask = dims < HEAD_DIM
    gd_mask = g_mask[:, None] & d_mask[None, :]
    q_offsets = seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=gd_mask, other=0.0).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + seq * stride_tables_seq
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
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
        m_i, l_i, acc = attend_kv_tile(
            q,
            m_i,
            l_i,
            acc,
            k_cache_ptr,
            v_cache_ptr,
            kv_offsets,
            kv_mask,
            n_mask[None, :],
            scale_log2,
            cap_log2,
            DOT_DTYPE,
            DOT_PRECISION,
            SOFTCAP,
        )

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    out_offsets = (
        seq * stride_out_seq
        + heads[:, None] * stride_out_head
        + split * stride_out_split
        + dims[None, :]
    )
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=gd_mask)
    if SPLIT:
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        lse_offsets = seq * stride_lse_seq + heads * stride_lse_head + split
        tl.store(lse_ptr + lse_offsets, lse, mask=g_mask)


@triton.jit
def _decode_reduce_kernel(
    partial_ptr,
    lse_ptr,
    out_ptr,
    num_splits,
    stride_partial_seq,
    stride_partial_head,
    stride_partial_split,
    stride_lse_seq,
    stride_lse_head,
    stride_out_seq,
    stride_out_head,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    s_mask = splits < num_splits
    dims = tl.arange(0, BLOCK_D)
    d_mask = dims < HEAD_DIM
    lse_row = lse_ptr + seq * stride_lse_seq + head * stride_lse_head
    lse = tl.load(lse_row + splits, mask=s_mask, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weights = tl.exp2(lse - lse_max)
    partial_offsets = (
        seq * stride_partial_seq
        + head * stride_partial_head
        + splits[:, None] * stride_partial_split
        + dims[None, :]
    )
    mask = s_mask[:, None] & d_mask[None, :]
    partial = tl.load(partial_ptr + partial_offsets, mask=mask, other=0.0)
    total = tl.sum(weights, axis=0)
    total = tl.where(total > 0.0, total, 1.0)
    out = tl.sum(partial * weights[:, None], axis=0) / total
    out_offsets = seq * stride_out_seq + head * stride_out_head + dims
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=d_mask)


@dataclass(frozen=True, slots=True)
class ContextGroup:
    """Sequences attended in one call of the torch path: their rows of the batch (a slice
    when they are adjacent, as the runner orders decodes by context length), the cache slot
    of each position up to the group's longest context, and which of those are in context."""

    rows: slice | torch.Tensor
    slots: torch.Tensor  # [num_seqs, longest]
    visible: torch.Tensor  # [num_seqs, longest]


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """Where the torch path reads each sequence's context: the same for every layer of a
    step, so the model builds it once per step (`PagedAttentionMetadata.decode_plan`)."""

    groups: tuple[ContextGroup, ...]
    covers_all: bool  # every row is in a group (no empty context to zero)


def decode_plan(
    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int
) -> DecodePlan:
    """Sequences of similar context length share one attention call, each context gathered
    to the longest of its group and masked to its own length.

    Grouping by length bounds the padding (a batch mixing 20- and 600-token contexts would
    otherwise gather and attend 600 positions for every sequence) at a few calls per batch.
    """
    lengths = context_lens.tolist()
    groups = []
    for group in length_groups(lengths):
        start = group[0]
        adjacent = group == list(range(start, start + len(group)))
        rows = slice(start, start + len(group)) if adjacent else torch.tensor(group)
        longest = lengths[group[-1]]
        slots, visible = context_slots(block_tables[rows], context_lens[rows], longest, block_size)
        groups.append(ContextGroup(rows, slots, visible))
    covered = sum(len(g.slots) for g in groups) == len(lengths)
    return DecodePlan(tuple(groups), covered)


def decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    plan: DecodePlan | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """The torch path, batched by `decode_plan` (built here unless the caller kept one for
    the step). Sequences with no context (padded rows of a CUDA-graph batch) get zeros.
    `window`: attend to the last `window` cached tokens only (a sliding-window layer).
    `softcap`: each score s becomes softcap * tanh(s / softcap) (Gemma 2; None or 0: off).
    The cache may hold another dtype than q's (float16 under float32, the engine's on the
    CPU): what it holds is attended in q's dtype."""
    scale = default_scale(q) if scale is None else scale
    plan = plan or decode_plan(block_tables, context_lens, k_cache.shape[1])
    groups = plan.groups
    if plan.covers_all and len(groups) == 1 and isinstance(groups[0].rows, slice):
        assert groups[0].rows == slice(0, len(q)), "a group covering every row is all of them"
        return _attend(q, k_cache, v_cache, groups[0], scale, window, softcap)
    out = torch.empty_like(q) if plan.covers_all else torch.zeros_like(q)
    for group in groups:
        out[group.rows] = _attend(q[group.rows], k_cache, v_cache, group, scale, window, softcap)
    return out


def _attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group: ContextGroup,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """One call: every context of the group gathered to its longest and masked (to its
    last `window` positions too, for a sliding-window layer)."""
    k, v = gather_slots(k_cache, group.slots, q.dtype), gather_slots(v_cache, group.slots, q.dtype)
    visible = group.visible
    if window is not None:
        positions = torch.arange(visible.shape[1], device=visible.device)
        lengths = visible.sum(dim=1, keepdim=True)
        visible = visible & (positions >= lengths - window)
    return attention(q[:, None], k, v, visible[:, None, :], scale, softcap=softcap)[:, 0]


def length_groups(lengths: list[int]) -> list[list[int]]:
    """Indices of the non-empty contexts sorted by length, cut into the runs of about equal
    count that cost least: each run pays a call (GROUP_CALL_ROWS positions' worth) and
    attends its longest context for every sequence in it."""
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lengths.__getitem__)
    best: list[list[int]] = []
    best_cost = float("inf")
    for count in range(1, min(MAX_GROUPS, len(order)) + 1):
        bounds = [len(order) * g // count for g in range(count + 1)]
        groups = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        cost = sum(GROUP_CALL_ROWS + len(g) * lengths[g[-1]] for g in groups)
        if cost < best_cost:
            best, best_cost = groups, cost
    return best


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, num_sms: int) -> int:
    """Enough programs to fill every SM a few times over, without splits shorter than
    MIN_TOKENS_PER_SPLIT tokens (then merging would cost more than it saves)."""
    programs = max(num_seqs * num_kv_heads, 1)
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, programs)
    useful = triton.cdiv(max(max_context_len, 1), MIN_TOKENS_PER_SPLIT)
    return max(1, min(wanted, useful, MAX_SPLITS))


def decode_attention_plan(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    num_splits: int,
    interpreted: bool,
    window: int | None = None,
    softcap: float | None = None,
) -> tuple[Launch, Launch | None]:
    """The attention launch and, when split, the launch that merges the partial outputs.

    The partial buffers are allocated here (fp32 `[num_seqs, num_heads, num_splits, head_dim]` and
    the log-sum-exps); under a CUDA graph they come from the graph's memory pool.
    """
    num_seqs, num_heads, head_dim = q.shape
    block_size = k_cache.shape[1]
    max_context_len = block_tables.shape[1] * block_size
    block_d = max(16, next_power_of_2(head_dim))
    block_n = 16 if interpreted else (64 if block_d <= 128 else 32)
    tokens_per_split = triton.cdiv(triton.cdiv(max_context_len, num_splits), block_n) * block_n
    group = num_heads // k_cache.shape[2]
    dtype, precision = dot_dtype(q.dtype, interpreted)
    split = num_splits > 1
    if split:
        target = torch.empty(
            (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
        target_strides = target.stride()[:3]
        lse_strides = lse.stride()[:2]
    else:
        target, lse = out, out  # lse is never touched without SPLIT
        target_strides = (*out.stride()[:2], 0)
        lse_strides = (0, 0)
    attention = Launch(
        grid=(num_seqs, k_cache.shape[2], num_splits),
        args=(
            q,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            target,
            lse,
            float(scale) * LOG2_E,
            tokens_per_split,
            NO_WINDOW if window is None else window,
            softcap_log2(softcap),
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            block_tables.stride(0),
            *target_strides,
            *lse_strides,
        ),
        constexprs={
            "GROUP": group,
            "BLOCK_G": max(16, next_power_of_2(group)),
            "HEAD_DIM": head_dim,
            "BLOCK_D": block_d,
            "BLOCK_SIZE": block_size,
            "BLOCK_N": block_n,
            "DOT_DTYPE": dtype,
            "DOT_PRECISION": precision,
            "SPLIT": split,
            "SOFTCAP": bool(softcap),
        },
        num_warps=4,
        num_stages=2,
    )
    if not split:
        return attention, None
    merge = Launch(
        grid=(num_seqs, num_heads),
        args=(target, lse, out, num_splits, *target_strides, *lse_strides, *out.stride()[:2]),
        constexprs={
            "HEAD_DIM": head_dim,
            "BLOCK_D": next_power_of_2(head_dim),
            "BLOCK_S": next_power_of_2(num_splits),
        },
        num_warps=4 if head_dim >= 128 else 2,
        num_stages=1,
    )
    return attention, merge


def _check(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor,
    num_splits: int | None,
) -> None:
    check_paged_cache(q, k_cache, v_cache, block_tables, context_lens, num_seqs=q.shape[0])
    require(
        out.shape == q.shape and out.dtype == q.dtype,
        f"out: shape {tuple(out.shape)} {out.dtype}, expected {tuple(q.shape)} {q.dtype}",
    )
    check_inner_contiguous("out", out)
    require(
        num_splits is None or 1 <= num_splits <= 1024,
        f"num_splits: {num_splits} is not within 1..1024",
    )


def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """The Triton path. q `[num_seqs, num_heads, head_dim]` -> out of the same shape.

    `num_splits` overrides the split-K heuristic (tests use it to force either path).
    `window` and `softcap`: as the reference's.
    """
    out = torch.empty_like(q) if out is None else out
    _check(q, k_cache, v_cache, block_tables, context_lens, out, num_splits)
    check_device(
        _decode_attention_kernel,
        {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables,
         "context_lens": context_lens, "out": out},
    )  # fmt: skip
    if q.shape[0] == 0:
        return out
    if num_splits is None:
        max_context_len = block_tables.shape[1] * k_cache.shape[1]
        num_splits = choose_num_splits(
            q.shape[0], k_cache.shape[2], max_context_len, sm_count(q.device)
        )
    scale = default_scale(q) if scale is None else scale
    attention, merge = decode_attention_plan(
        q, k_cache, v_cache, block_tables, context_lens, out, scale, num_splits,
        interpreted=is_interpreted(_decode_attention_kernel), window=window, softcap=softcap,
    )  # fmt: skip
    attention.run(_decode_attention_kernel)
    if merge is not None:
        merge.run(_decode_reduce_kernel)
    return out
