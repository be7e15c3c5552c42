"""Prefill attention over the paged cache: chunks of ragged length, each the last tokens of its
sequence's context, against the torch reference (and the reference against plain softmax math)."""

from __future__ import annotations

import math

import pytest
import torch

from batching_engine.kernels._launch import KernelInputError
from batching_engine.kernels.prefill_attention import (
    prefill_attention_reference,
    prefill_attention_triton,
)
from tests.batching_engine.kernels.tensors import (
    ATTENTION_TOLERANCES,
    DTYPE_IDS,
    DTYPES,
    generator,
    paged_cache,
    poisoned,
    ragged_lengths,
    randn,
)

pytestmark = pytest.mark.usefixtures("triton_interpreter")

# (num_heads, num_kv_heads, head_dim, block_size, [(query_len, context_len), ...])
CASES = {
    # a whole prompt, a chunk after cached tokens, a single token, a prompt across block edges
    "mixed-chunks": (4, 2, 32, 16, [(20, 20), (7, 39), (1, 16), (33, 33)]),
    "chunk-ends-on-block-edges": (6, 2, 16, 8, [(8, 16), (16, 32), (9, 17)]),
    "mha-odd-head-dim": (2, 2, 24, 16, [(18, 18), (5, 5)]),
    "empty-chunk-in-the-batch": (4, 4, 16, 16, [(3, 10), (0, 12), (17, 17)]),
}


def run_both(
    heads,
    kv_heads,
    head_dim,
    block_size,
    chunks,
    dtype,
    seed=0,
    max_query_len=None,
    window=None,
    softcap=None,
):
    gen = generator(seed)
    query_lens = [q for q, _ in chunks]
    cache = paged_cache(
        [c for _, c in chunks], block_size=block_size, num_kv_heads=kv_heads,
        head_dim=head_dim, dtype=dtype, gen=gen,
    )  # fmt: skip
    cu_seqlens = torch.zeros(len(chunks) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.tensor(query_lens).cumsum(0)
    q = randn(sum(query_lens), heads, head_dim, dtype=dtype, gen=gen)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens, cu_seqlens)
    out = poisoned(*q.shape, dtype=dtype)
    actual = prefill_attention_triton(
        *args, max_query_len=max_query_len, out=out, window=window, softcap=softcap
    )
    return actual, prefill_attention_reference(*args, window=window, softcap=softcap), args


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_reference_on_ragged_chunks(case, dtype):
    actual, expected, _ = run_both(*case, dtype)
    torch.testing.assert_close(actual, expected, **ATTENTION_TOLERANCES[dtype])


@pytest.mark.parametrize("seed", [1, 2])
def test_random_chunks_of_random_contexts(seed):
    gen = generator(100 + seed)
    contexts = ragged_lengths(gen, count=4, low=1, high=60)
    chunks = [(ragged_lengths(gen, 1, 1, c)[0], c) for c in contexts]
    actual, expected, _ = run_both(4, 2, 16, 16, chunks, torch.float16, seed=seed)
    torch.testing.assert_close(actual, expected, **ATTENTION_TOLERANCES[torch.float16])


def test_the_host_given_max_query_len_gives_the_same_answer():
    case = CASES["mixed-chunks"]
    given, _, _ = run_both(*case, torch.float32, max_query_len=33)
    derived, _, _ = run_both(*case, torch.float32)
    assert torch.equal(given, derived)


@pytest.mark.parametrize("window", [1, 4, 20, 100])
def test_a_sliding_window_matches_the_reference(window):
    actual, expected, _ = run_both(*CASES["mixed-chunks"], torch.float32, window=window)
    torch.testing.assert_close(actual, expected, **ATTENTION_TOLERANCES[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("window", [None, 4])
def test_soft_capped_scores_match_the_reference(window, dtype):
    actual, expected, _ = run_both(*CASES["mixed-chunks"], dtype, window=window, softcap=0.5)
    torch.testing.assert_close(actual, expected, **ATTENTION_TOLERANCES[dtype])


@pytest.mark.parametrize(
    ("window", "softcap"),
    [(None, None), (3, None), (None, 0.5), (3, 0.5)],
    ids=["causal", "window-3", "softcap-0.5", "window-3-softcap-0.5"],
)
def test_reference_is_causal_softmax_attention_at_the_chunk_positions(window, softcap):
    """The reference itself, against the definition: query i of a q_len chunk of a context of
    length L sits at L - q_len + i and sees keys 0..that position (the last `window` of them
    in a sliding-window layer), kv head h // group; a soft cap c takes each scaled score s to
    c * tanh(s / c) before the softmax."""
    _, expected, args = run_both(4, 2, 16, 8, [(5, 12)], torch.float32, window=window,
                                 softcap=softcap)  # fmt: skip
    q, k_cache, v_cache, tables, _, _ = args
    positions = torch.arange(12)
    k = k_cache[tables[0, positions // 8].long(), positions % 8]  # [12, 2, 16]
    v = v_cache[tables[0, positions // 8].long(), positions % 8]
    for i in range(5):
        end = 12 - 5 + i + 1
        first = 0 if window is None else max(0, end - window)
        for head in range(4):
            scores = k[first:end, head // 2] @ q[i, head] / math.sqrt(16)
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            want = torch.softmax(scores, dim=0) @ v[first:end, head // 2]
            torch.testing.assert_close(expected[i, head], want)


def test_cu_seqlens_must_match_the_tables():
    _, _, args = run_both(4, 2, 16, 16, [(3, 3), (2, 5)], torch.float32)
    q, k_cache, v_cache, tables, lens, _ = args
    with pytest.raises(KernelInputError, match="block_tables"):
        prefill_attention_triton(q, k_cache, v_cache, tables, lens, torch.tensor([0, 1, 3, 5]))
