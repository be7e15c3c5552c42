"""Build one step's attention metadata from per-sequence numbers, with tensor ops, not loops.

The runner knows, per scheduled sequence, where its chunk starts, how long it is and its block
table; everything per token (positions, cache slots) is derived here by repeat/gather on the
host, then moved to the device in one go (`batching_engine.staging`: on CUDA one non-blocking
copy from pinned memory, which the runner's token ids and sampled rows share).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from batching_engine.model.attention import DenseAttentionMetadata, PagedAttentionMetadata
from batching_engine.staging import stage

_TENSORS = ("positions", "slot_mapping", "block_tables", "context_lens", "cu_seqlens_q")


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
    return paged_step_metadata(starts, query_lens, block_tables, block_size, device, {})[0]


def paged_step_metadata(
    starts: list[int],
    query_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device,
    extra: Mapping[str, torch.Tensor],
) -> tuple[PagedAttentionMetadata, dict[str, torch.Tensor]]:
    """`paged_metadata`, and the `extra` host tensors (the step's token ids, ...) on the
    device, moved with it in the same copy."""
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
    host = {
        "positions": positions,
        "slot_mapping": slots,
        "block_tables": tables.to(torch.int32),
        "context_lens": (first + lens).to(torch.int32),
        "cu_seqlens_q": cu_seqlens.to(torch.int32),
    }
    on_device = stage({**host, **extra}, device)
    meta = PagedAttentionMetadata(
        **{name: on_device.pop(name) for name in _TENSORS},
        max_query_len=max(query_lens),
        num_prefill_seqs=num_prefill_seqs,
        num_prefill_tokens=sum(query_lens[:num_prefill_seqs]),
    )
    return meta, on_device


def dense_metadata(seq_lens: list[int], device: torch.device) -> DenseAttentionMetadata:
    """Metadata for whole sequences attended in one pass, positions from 0."""
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    starts = torch.cumsum(lens, dim=0) - lens
    owner = torch.repeat_interleave(torch.arange(len(lens)), lens)
    positions = torch.arange(int(lens.sum())) - starts[owner]
    return DenseAttentionMetadata(positions=positions.to(device), seq_lens_host=tuple(seq_lens))
