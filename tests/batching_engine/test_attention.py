"""The model's paged attention equals plain causal attention over each whole sequence.

Sequences live in scattered blocks of the cache; some arrive as a fresh prompt, some as a
later chunk of a prompt whose start is already cached, some as a single decode token. The
model splits the step into prefill chunks and decode tokens for the kernels (here their torch
references); the result is compared with softmax(QK^T)V written out one sequence at a time.
"""

from __future__ import annotations

import math

import pytest
import torch

from batching_engine.kernels.decode_attention import length_groups
from batching_engine.kernels.dispatch import set_kernel_backend, uses_reference, write_kv_cache
from batching_engine.model.attention import paged_attention
from batching_engine.model.step_metadata import paged_metadata

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 8, 4


def naive_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q, k, v: [length, heads or kv heads, dim] for one whole sequence."""
    group = HEADS // KV_HEADS
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(DIM)
    length = q.shape[0]
    scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def test_prefill_chunks_and_decodes_attend_over_their_whole_cached_context():
    generator = torch.Generator().manual_seed(0)
    lengths, cached = [11, 9, 6, 13], [0, 5, 3, 12]  # tokens already in the cache before this step
    q = [torch.randn(n, HEADS, DIM, generator=generator) for n in lengths]
    k = [torch.randn(n, KV_HEADS, DIM, generator=generator) for n in lengths]
    v = [torch.randn(n, KV_HEADS, DIM, generator=generator) for n in lengths]
    k_cache, v_cache = torch.zeros(2, 16, BLOCK, KV_HEADS, DIM).unbind(0)
    free = torch.randperm(16, generator=generator).tolist()
    tables = [[free.pop() for _ in range(-(-n // BLOCK))] for n in lengths]

    # Earlier steps cached the first tokens of sequences 1 to 3.
    done = [s for s in range(4) if cached[s]]
    before = paged_metadata(
        [0] * len(done), [cached[s] for s in done], [tables[s] for s in done], BLOCK, "cpu"
    )
    write_kv_cache(
        torch.cat([k[s][: cached[s]] for s in done]),
        torch.cat([v[s][: cached[s]] for s in done]),
        k_cache,
        v_cache,
        before.slot_mapping,
    )

    # This step: a fresh prompt, two later chunks, one decode token.
    chunk = [slice(cached[s], lengths[s]) for s in range(4)]
    meta = paged_metadata(cached, [lengths[s] - cached[s] for s in range(4)], tables, BLOCK, "cpu")
    write_kv_cache(
        torch.cat([k[s][chunk[s]] for s in range(4)]),
        torch.cat([v[s][chunk[s]] for s in range(4)]),
        k_cache,
        v_cache,
        meta.slot_mapping,
    )
    out = paged_attention(
        torch.cat([q[s][chunk[s]] for s in range(4)]), k_cache, v_cache, meta, DIM**-0.5
    )

    expected = torch.cat([naive_causal(q[s], k[s], v[s])[chunk[s]] for s in range(4)])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert (meta.num_prefill_seqs, meta.num_prefill_tokens) == (3, 11 + 4 + 3)


def test_slots_are_block_table_entry_times_block_size_plus_offset():
    meta = paged_metadata([6, 0], [3, 2], [[7, 2, 9], [4]], BLOCK, "cpu")
    # Positions 6, 7, 8 of the first sequence: block 2 offsets 2, 3, then block 9 offset 0.
    assert meta.positions.tolist() == [6, 7, 8, 0, 1]
    assert meta.slot_mapping.tolist() == [2 * 4 + 2, 2 * 4 + 3, 9 * 4, 4 * 4, 4 * 4 + 1]
    assert meta.block_tables.tolist() == [[7, 2, 9], [4, -1, -1]]
    assert meta.context_lens.tolist() == [9, 2] and meta.cu_seqlens_q.tolist() == [0, 3, 5]


@pytest.fixture(params=["torch", "auto"])
def kernels(request):
    """The torch reference, and whatever the CPU runs by default (the C kernels if built)."""
    set_kernel_backend(request.param)
    yield request.param
    set_kernel_backend("auto")


@pytest.mark.parametrize("by_length", [False, True], ids=["as-given", "by-length"])
def test_a_decode_batch_of_far_apart_contexts_attends_each_over_its_own(kernels, by_length):
    """Contexts of 1 to 300 tokens: the torch path attends them in several groups of similar
    length, each padded to its longest; every slot outside a context holds NaN, which must not
    leak into any sequence's answer. The runner orders decodes by length, which makes each
    group a run of adjacent rows; any order gives the same answers. The C kernel reads each
    context through its block table, with no plan."""
    generator = torch.Generator().manual_seed(1)
    lengths = [1, 300, 7, 150, 64, 33, 290, 2, 120, 16, 250, 90] * 2
    lengths = sorted(lengths) if by_length else lengths
    assert len(length_groups(lengths)) > 1
    tables, free = [], torch.randperm(2000, generator=generator).tolist()
    for n in lengths:
        tables.append([free.pop() for _ in range(-(-n // BLOCK))])
    k_cache, v_cache = torch.full((2, 2000, BLOCK, KV_HEADS, DIM), float("nan")).unbind(0)
    k = [torch.randn(n, KV_HEADS, DIM, generator=generator) for n in lengths]
    v = [torch.randn(n, KV_HEADS, DIM, generator=generator) for n in lengths]
    pairs = zip(tables, lengths, strict=True)
    slots = [t[p // BLOCK] * BLOCK + p % BLOCK for t, n in pairs for p in range(n)]
    write_kv_cache(torch.cat(k), torch.cat(v), k_cache, v_cache, torch.tensor(slots))

    # Each sequence's last token asks again, as a decode token over its whole context.
    q = torch.randn(len(lengths), HEADS, DIM, generator=generator)
    decode = paged_metadata([n - 1 for n in lengths], [1] * len(lengths), tables, BLOCK, "cpu")
    out = paged_attention(q, k_cache, v_cache, decode, DIM**-0.5)
    if uses_reference(q):
        # The plan is kept for the step's other layers; sorted rows make slices of every group.
        assert decode.decode_plan is not None
        adjacent = [isinstance(g.rows, slice) for g in decode.decode_plan.groups]
        assert all(adjacent) if by_length else not all(adjacent)
    else:
        assert decode.decode_plan is None
    again = paged_attention(q, k_cache, v_cache, decode, DIM**-0.5)
    assert torch.equal(again, out)

    group = HEADS // KV_HEADS
    for s in range(len(lengths)):
        keys, values = k[s].repeat_interleave(group, 1), v[s].repeat_interleave(group, 1)
        weights = (torch.einsum("hd,khd->hk", q[s], keys) / math.sqrt(DIM)).softmax(-1)
        expected = torch.einsum("hk,khd->hd", weights, values)
        torch.testing.assert_close(out[s], expected, rtol=1e-5, atol=1e-5)
