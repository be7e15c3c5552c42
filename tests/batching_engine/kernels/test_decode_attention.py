"""Paged decode attention: the Triton kernel (interpreted) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from batching_engine.kernels._launch import KernelInputError
from batching_engine.kernels.decode_attention import (
    MAX_SPLITS,
    choose_num_splits,
    decode_attention_reference,
    decode_attention_triton,
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

# (num_heads, num_kv_heads, head_dim, block_size, context lengths)
BOUNDARY_CASE = (4, 2, 32, 16, [1, 15, 16, 17, 32, 33])  # every length around a block edge
SHAPES = {
    "gqa-block-edges": BOUNDARY_CASE,
    "group-of-3-odd-head-dim": (6, 2, 24, 8, [5, 40, 9]),
    "mha-long": (2, 2, 16, 16, [70, 3]),
    "mqa": (8, 1, 32, 32, [31, 64]),
}


def run_both(
    heads,
    kv_heads,
    head_dim,
    block_size,
    lens,
    dtype,
    seed=0,
    num_splits=None,
    window=None,
    softcap=None,
):
    gen = generator(seed)
    cache = paged_cache(
        lens, block_size=block_size, num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, gen=gen
    )
    q = randn(len(lens), heads, head_dim, dtype=dtype, gen=gen)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens)
    out = poisoned(*q.shape, dtype=dtype)
    actual = decode_attention_triton(
        *args, out=out, num_splits=num_splits, window=window, softcap=softcap
    )
    return actual, decode_attention_reference(*args, window=window, softcap=softcap)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_matches_reference_on_ragged_contexts(shape, dtype):
    actual, expected = run_both(*shape, dtype)
    torch.testing.assert_close(actual, expected, **ATTENTION_TOLERANCES[dtype])


@pytest.mark.parametrize("num_splits", [2, 3, 5])
def test_split_k_merges_to_the_same_answer(num_splits):
    # Some splits of the shorter contexts are empty: the merge must ignore them.
    actual, expected = run_both(*BOUNDARY_CASE, torch.float32, num_splits=num_splits)
    torch.testing.assert_close(actual, expected, **ATTENTION_TOLERANCES[torch.float32])


@pytest.mark.parametrize("seed", [1, 2])
def test_random_lengths_with_the_heuristic_split(seed):
    lens = ragged_lengths(generator(seed), count=5, low=1, high=80)
    actual, expected = run_both(4, 2, 16, 16, lens, torch.float16, seed=seed)
    torch.testing.assert_close(actual, expected, **ATTENTION_TOLERANCES[torch.float16])


@pytest.mark.parametrize("num_splits", [1, 4])
def test_a_padded_row_with_no_context_gives_zeros(num_splits):
    actual, expected = run_both(4, 2, 16, 16, [20, 0, 7], torch.float32, num_splits=num_splits)
    assert torch.equal(actual[1], torch.zeros_like(actual[1]))
    torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [1, 5, 16, 100])
def test_a_sliding_window_matches_the_reference_whatever_the_split(num_splits, window):
    actual, expected = run_both(*BOUNDARY_CASE, torch.float32, num_splits=num_splits,
                                window=window)  # fmt: skip
    torch.testing.assert_close(actual, expected, **ATTENTION_TOLERANCES[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [None, 5])
def test_soft_capped_scores_match_the_reference_whatever_the_split(num_splits, window, dtype):
    actual, expected = run_both(*BOUNDARY_CASE, dtype, num_splits=num_splits, window=window,
                                softcap=0.5)  # fmt: skip
    torch.testing.assert_close(actual, expected, **ATTENTION_TOLERANCES[dtype])


@pytest.mark.parametrize("softcap", [None, 0.5], ids=["uncapped", "softcap-0.5"])
def test_the_windowed_reference_is_attention_over_the_last_window_tokens(softcap):
    """The reference against the definition: a window of w leaves a context of L the keys
    L - w .. L - 1, as if the cache held those alone; a soft cap c takes each scaled score s
    to c * tanh(s / c) before the softmax."""
    gen = generator(3)
    lens, window = [3, 12, 20], 5
    cache = paged_cache(lens, block_size=4, num_kv_heads=1, head_dim=8, dtype=torch.float32,
                        gen=gen)  # fmt: skip
    q = randn(len(lens), 2, 8, dtype=torch.float32, gen=gen)
    got = decode_attention_reference(
        q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens, window=window,
        softcap=softcap,
    )  # fmt: skip
    for s, length in enumerate(lens):
        positions = torch.arange(max(0, length - window), length)
        blocks = cache.block_tables[s, positions // 4].long()
        k, v = cache.k_cache[blocks, positions % 4, 0], cache.v_cache[blocks, positions % 4, 0]
        for head in range(2):
            scores = k @ q[s, head] / 8**0.5
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            torch.testing.assert_close(got[s, head], torch.softmax(scores, dim=0) @ v)


def test_split_count_fills_the_gpu_but_keeps_splits_long():
    # One sequence, 8 kv heads, 132 SMs: 66 splits would fill it, 4k tokens allow 16.
    assert choose_num_splits(1, 8, 4096, num_sms=132) == 16
    assert choose_num_splits(1, 8, 1 << 20, num_sms=132) == MAX_SPLITS
    assert choose_num_splits(64, 8, 4096, num_sms=132) == 2
    assert choose_num_splits(256, 8, 4096, num_sms=132) == 1
    assert choose_num_splits(1, 8, 100, num_sms=132) == 1


def test_heads_not_a_multiple_of_kv_heads_is_refused():
    cache = paged_cache([4], block_size=16, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                        gen=generator(0))  # fmt: skip
    q = torch.zeros(1, 3, 16)
    with pytest.raises(KernelInputError, match="not a multiple"):
        decode_attention_triton(
            q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens
        )
