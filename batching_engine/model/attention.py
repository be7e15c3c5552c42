"""Torch reference attention over the paged KV cache, as plain functions.

Cache layout, per layer: K and V tensors of shape [num_blocks, block_size, num_kv_heads,
head_dim]. Token position p of a sequence lives in slot
`block_table[p // block_size] * block_size + p % block_size` (slot = flat row of the cache).

Every function here has one job and takes plain tensors, so a Triton kernel can replace any
one of them without touching the others; the kernels are tested against these.

One step's tokens are flattened, sequence after sequence. Sequences whose chunk has more than
one query token ("prefill" chunks, possibly continuing a prompt already partly cached) come
first; sequences with a single query token ("decode") follow, so decode attention can run as
one batched gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class PagedAttentionMetadata:
    """Where one step's tokens sit in the paged cache, and what context each one sees.

    Tensors live on the model's device; the `*_host` tuples repeat what the reference prefill
    loop needs as Python ints, so it never syncs with the device.
    """

    positions: torch.Tensor  # [num_tokens] int64: each token's position in its sequence
    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot to write; -1 skips the write
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with -1
    context_lens: torch.Tensor  # [num_seqs] int32: tokens of context after this step's chunk
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32: query chunk boundaries in the flat batch
    max_query_len: int
    max_context_len: int
    num_prefill_seqs: int  # sequences [0, num_prefill_seqs) have more than one query token
    num_prefill_tokens: int  # their tokens come first in the flat batch
    query_lens_host: tuple[int, ...]
    context_lens_host: tuple[int, ...]


@dataclass(slots=True)
class DenseAttentionMetadata:
    """Whole sequences attended in one pass with no cache (embedding, classification)."""

    positions: torch.Tensor  # [num_tokens] int64
    seq_lens_host: tuple[int, ...]


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each token's key and value ([num_tokens, kv_heads, head_dim]) into its slot."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    flat_k.index_copy_(0, slots, k[keep])
    flat_v.index_copy_(0, slots, v[keep])


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Attention of every query token ([num_tokens, heads, head_dim]) over its cached context."""
    out = torch.empty_like(q)
    split = meta.num_prefill_tokens
    if meta.num_prefill_seqs:
        out[:split] = paged_prefill_attention(q[:split], k_cache, v_cache, meta, scale)
    if split < q.shape[0]:
        decode = slice(meta.num_prefill_seqs, None)
        out[split:] = paged_decode_attention(
            q[split:],
            k_cache,
            v_cache,
            meta.block_tables[decode],
            meta.context_lens[decode],
            meta.max_context_len,
            scale,
        )
    return out


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Each multi-token chunk attends over its whole context, causally inside the chunk.

    The chunk's queries are the last `query_len` positions of a `context_len` context, so
    query i sees keys 0 .. context_len - query_len + i.
    """
    out = torch.empty_like(q)
    start = 0
    for seq in range(meta.num_prefill_seqs):
        query_len, context_len = meta.query_lens_host[seq], meta.context_lens_host[seq]
        keys, values = gather_context(k_cache, v_cache, meta.block_tables[seq], context_len)
        chunk = slice(start, start + query_len)
        out[chunk] = _causal_sdpa(q[chunk], keys, values, scale)
        start += query_len
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    max_context_len: int,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence ([seqs, heads, head_dim]), all sequences in one gather.

    Every sequence's blocks are gathered up to the longest context (rows past a sequence's own
    context are masked), so the whole decode batch is one attention call.
    """
    num_seqs, num_heads, head_dim = q.shape
    block_size = k_cache.shape[1]
    num_blocks = -(-max_context_len // block_size)
    tables = block_tables[:, :num_blocks].clamp(min=0)
    keys = gather_blocks(k_cache, tables).transpose(1, 2)  # [seqs, kv_heads, keys, head_dim]
    values = gather_blocks(v_cache, tables).transpose(1, 2)
    key_positions = torch.arange(keys.shape[2], device=q.device)
    visible = key_positions[None, :] < context_lens[:, None]
    out = F.scaled_dot_product_attention(
        q[:, :, None, :],
        keys,
        values,
        attn_mask=visible[:, None, None, :],
        scale=scale,
        enable_gqa=True,
    )
    return out.view(num_seqs, num_heads, head_dim)


def gather_blocks(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """The blocks named by `tables` ([seqs, blocks]), as [seqs, blocks * block_size, kv_heads,
    head_dim]; index_select, a plain row copy, is several times faster than fancy indexing."""
    num_seqs, num_blocks = tables.shape
    rows = torch.index_select(cache, 0, tables.reshape(-1).long())
    return rows.view(num_seqs, num_blocks * cache.shape[1], cache.shape[2], cache.shape[3])


def gather_context(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, context_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's first `context_len` keys and values, [context_len, kv_heads, head_dim]."""
    blocks = block_table[None, : -(-context_len // k_cache.shape[1])]
    keys = gather_blocks(k_cache, blocks)[0, :context_len]
    values = gather_blocks(v_cache, blocks)[0, :context_len]
    return keys, values


def dense_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: DenseAttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention inside each whole sequence of the flat batch, with no cache."""
    out = torch.empty_like(q)
    start = 0
    for seq_len in meta.seq_lens_host:
        chunk = slice(start, start + seq_len)
        out[chunk] = _causal_sdpa(q[chunk], k[chunk], v[chunk], scale)
        start += seq_len
    return out


def _causal_sdpa(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """q: [query_len, heads, d], keys/values: [context_len, kv_heads, d]; queries are the last
    positions of the context."""
    query_len, context_len = q.shape[0], keys.shape[0]
    if query_len == context_len:
        mask, causal = None, True
    else:
        mask = torch.ones(query_len, context_len, dtype=torch.bool, device=q.device)
        mask = mask.tril(diagonal=context_len - query_len)
        causal = False
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        keys.transpose(0, 1),
        values.transpose(0, 1),
        attn_mask=mask,
        is_causal=causal,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(0, 1)
