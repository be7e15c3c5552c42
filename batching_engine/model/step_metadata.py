"""Build one step's attention metadata from per-sequence numbers, with tensor ops, not loops.

The runner knows, per scheduled sequence, where its chunk starts, how long it is and its block
table; everything per token (positions, cache slots) is derived here by repeat/gather on the
host, then moved to the device in one go.
"""

from __future__ import annotations

import torch

from batching_engine.model.attention import DenseAttentionMetadata, PagedAttentionMetadata


def paged_metadata(
    starts: list[int],
    query_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device,
) -> PagedAttentionMetadata:
    """Metadata for chunks `[starts[i], starts[i] + query_lens[i])` of each sequence.

    Sequences with a multi-token chunk must come before single-token ones.
    """
    num_prefill_seqs = sum(1 for n in query_lens if n > 1)
    assert all(n > 1 for n in query_lens[:num_prefill_seqs]), "multi-token chunks must come first"
    lens = torch.tensor(query_lens, dtype=torch.int64)
    first = torch.tensor(starts, dtype=torch.int64)
    cu_seqlens = torch.zeros(len(lens) + 1, dtype=torch.int64)
    torch.cumsum(lens, dim=0, out=cu_seqlens[1:])
    owner = torch.repeat_interleave(torch.arange(len(lens)), lens)
    positions = torch.arange(int(cu_seqlens[-1])) - cu_seqlens[owner] + first[owner]
    width = max(len(table) for table in block_tables)
    tables = torch.tensor([table + [-1] * (width - len(table)) for table in block_tables])
    slots = tables[owner, positions // block_size].long() * block_size + positions % block_size
    context_lens = first + lens
    return PagedAttentionMetadata(
        positions=positions.to(device),
        slot_mapping=slots.to(device),
        block_tables=tables.to(dtype=torch.int32, device=device),
        context_lens=context_lens.to(dtype=torch.int32, device=device),
        cu_seqlens_q=cu_seqlens.to(dtype=torch.int32, device=device),
        max_query_len=max(query_lens),
        num_prefill_seqs=num_prefill_seqs,
        num_prefill_tokens=sum(query_lens[:num_prefill_seqs]),
    )


def dense_metadata(seq_lens: list[int], device: torch.device) -> DenseAttentionMetadata:
    """Metadata for whole sequences attended in one pass, positions from 0."""
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    starts = torch.cumsum(lens, dim=0) - lens
    owner = torch.repeat_interleave(torch.arange(len(lens)), lens)
    positions = torch.arange(int(lens.sum())) - starts[owner]
    return DenseAttentionMetadata(positions=positions.to(device), seq_lens_host=tuple(seq_lens))
