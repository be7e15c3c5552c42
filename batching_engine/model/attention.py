"""Attention as the model sees it: one step's metadata, and the split of a flat batch into its
prefill chunks and its decode tokens.

The math lives in `batching_engine.kernels.dispatch`: the Triton kernels on CUDA tensors, their
torch references elsewhere. The model has this one code path on every device.

Cache layout, per layer: K and V tensors of shape [num_blocks, block_size, num_kv_heads,
head_dim]. Token position p of a sequence lives in slot
`block_table[p // block_size] * block_size + p % block_size` (slot = flat row of the cache).

One step's tokens are flattened, sequence after sequence. Sequences whose chunk has more than
one query token ("prefill" chunks, possibly continuing a prompt already partly cached) come
first; sequences with a single query token ("decode") follow, so decode attention is one call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batching_engine.kernels import dispatch
from batching_engine.kernels._paged import attention
from batching_engine.kernels.decode_attention import DecodePlan, decode_plan


@dataclass(slots=True)
class PagedAttentionMetadata:
    """Where one step's tokens sit in the paged cache, and what context each one sees.

    Tensors live on the model's device; the ints are known on the host, so no kernel launch
    waits for the device to tell it a size.
    """

    positions: torch.Tensor  # [num_tokens] int64: each token's position in its sequence
    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot to write; -1 skips the write
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with -1
    context_lens: torch.Tensor  # [num_seqs] int32: tokens of context after this step's chunk
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32: query chunk boundaries in the flat batch
    max_query_len: int
    num_prefill_seqs: int  # sequences [0, num_prefill_seqs) have more than one query token
    num_prefill_tokens: int  # their tokens come first in the flat batch
    decode_plan: DecodePlan | None = None  # the torch path's, built at the step's first layer


@dataclass(slots=True)
class DenseAttentionMetadata:
    """Whole sequences attended in one pass with no cache (embedding, classification)."""

    positions: torch.Tensor  # [num_tokens] int64
    seq_lens_host: tuple[int, ...]


def decode_metadata(
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
) -> PagedAttentionMetadata:
    """Metadata of a decode-only step from its tensors alone, with no host value: what a
    captured CUDA graph replays with new contents in the same buffers."""
    num_seqs = positions.shape[0]
    cu_seqlens = torch.arange(num_seqs + 1, dtype=torch.int32, device=positions.device)
    return PagedAttentionMetadata(
        positions=positions,
        slot_mapping=slot_mapping,
        block_tables=block_tables,
        context_lens=context_lens,
        cu_seqlens_q=cu_seqlens,
        max_query_len=1,
        num_prefill_seqs=0,
        num_prefill_tokens=0,
    )


def decode_buffers(
    max_num_seqs: int, max_blocks: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """Fixed buffers for `decode_metadata`'s inputs (and the token ids), sized for the largest
    decode batch and the longest block table: what every captured decode graph reads."""

    def full(shape: tuple[int, ...], value: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.full(shape, value, dtype=dtype, device=device)

    return {
        "input_ids": full((max_num_seqs,), 0, torch.int64),
        "positions": full((max_num_seqs,), 0, torch.int64),
        "slot_mapping": full((max_num_seqs,), -1, torch.int64),
        "context_lens": full((max_num_seqs,), 0, torch.int32),
        "block_tables": full((max_num_seqs, max_blocks), -1, torch.int32),
    }


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Attention of every query token ([num_tokens, heads, head_dim]) over its cached context,
    whose K/V (this step's included) are already written; over the last `window` positions
    up to each query's own only, in a sliding-window layer; with a `softcap` (Gemma 2), each
    score s taken as softcap * tanh(s / softcap) before the softmax."""
    split, num_prefill = meta.num_prefill_tokens, meta.num_prefill_seqs
    if num_prefill == 0:
        return _decode(q, k_cache, v_cache, meta, scale, window, softcap)
    if split == q.shape[0]:
        return _prefill(q, k_cache, v_cache, meta, scale, window, softcap)
    out = torch.empty_like(q)
    out[:split] = _prefill(q[:split], k_cache, v_cache, meta, scale, window, softcap)
    out[split:] = _decode(q[split:], k_cache, v_cache, meta, scale, window, softcap)
    return out


def _prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    scale: float,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    seqs = meta.num_prefill_seqs
    return dispatch.prefill_attention(
        q,
        k_cache,
        v_cache,
        meta.block_tables[:seqs],
        meta.context_lens[:seqs],
        meta.cu_seqlens_q[: seqs + 1],
        scale,
        meta.max_query_len,
        window,
        softcap,
    )


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    scale: float,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    seqs = slice(meta.num_prefill_seqs, None)
    tables, lens = meta.block_tables[seqs], meta.context_lens[seqs]
    if meta.decode_plan is None and dispatch.uses_reference(q):
        meta.decode_plan = decode_plan(tables, lens, k_cache.shape[1])
    return dispatch.decode_attention(
        q, k_cache, v_cache, tables, lens, scale, meta.decode_plan, window, softcap
    )


def dense_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: DenseAttentionMetadata,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention inside each whole sequence of the flat batch, with no cache: single-pass
    models only, so no kernel of its own. `window`, `softcap`: as `paged_attention`'s."""
    out = torch.empty_like(q)
    start = 0
    for seq_len in meta.seq_lens_host:
        chunk = slice(start, start + seq_len)
        mask = None
        if window is not None and window < seq_len:
            positions = torch.arange(seq_len, device=q.device)
            offset = positions[:, None] - positions[None, :]
            mask = (offset >= 0) & (offset < window)
        visible = None if mask is None else mask[None]
        attended = attention(
            q[None, chunk], k[None, chunk], v[None, chunk], visible, scale,
            is_causal=mask is None, softcap=softcap,
        )  # fmt: skip
        out[chunk] = attended[0]
        start += seq_len
    return out
