"""The CPU decode kernels (add + RMSNorm, rotary, KV-cache write, decode attention in C)
against the torch references they replace on float32 CPU tensors, over float16 KV caches (the
engine's on the CPU) and float32 ones: rotary and the write bitwise (a float16 cache's values
rounded as `.half()` rounds them), the norm and attention within float32 rounding, and every
out-of-range index refused before anything is written."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batching_engine.kernels import cpu_decode, dispatch
from batching_engine.kernels.decode_attention import decode_attention_reference
from batching_engine.kernels.kv_cache_write import write_kv_cache_reference
from batching_engine.kernels.rmsnorm import fused_add_rmsnorm_reference
from batching_engine.kernels.rotary import rotary_embedding_reference
from tests.batching_engine.kernels.tensors import (
    ATTENTION_TOLERANCES,
    generator,
    paged_cache,
    randn,
)

F32, F16 = torch.float32, torch.float16
CACHE_DTYPES = pytest.mark.parametrize("cache_dtype", [F16, F32], ids=["fp16-cache", "fp32-cache"])
pytestmark = pytest.mark.skipif(
    cpu_decode.available() is not None, reason=f"no CPU decode kernels: {cpu_decode.available()}"
)


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(1, 9),
    heads=st.integers(1, 4),
    half=st.sampled_from([4, 8, 32]),
    partial=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_rotary_is_bitwise_the_reference(tokens, heads, half, partial, seed):
    gen = generator(seed)
    head_dim = 2 * half + (8 if partial else 0)  # a partial rotary leaves the tail as it is
    rows = randn(tokens, 3 * heads * head_dim, dtype=F32, gen=gen)  # q is a view of wider rows
    q = rows[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = rows[:, heads * head_dim : 2 * heads * head_dim].view(tokens, heads, head_dim)
    cos, sin = randn(64, 2 * half, dtype=F32, gen=gen), randn(64, 2 * half, dtype=F32, gen=gen)
    positions = torch.randint(0, 64, (tokens,), generator=gen)
    got = cpu_decode.rotary_embedding(positions, q, k, cos, sin)
    expected = rotary_embedding_reference(positions, q, k, cos, sin)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def test_rotary_refuses_a_position_past_the_table():
    x = torch.zeros(1, 1, 8)
    with pytest.raises(ValueError, match="position"):
        cpu_decode.rotary_embedding(
            torch.tensor([64]), x, x, torch.zeros(64, 8), torch.zeros(64, 8)
        )


@CACHE_DTYPES
def test_the_kv_write_is_the_reference_and_skips_minus_one(cache_dtype):
    gen = generator(0)
    caches = [torch.zeros(4, 8, 2, 16, dtype=cache_dtype) for _ in range(4)]
    key, value = randn(5, 2, 16, dtype=F32, gen=gen), randn(5, 2, 16, dtype=F32, gen=gen)
    slots = torch.tensor([3, -1, 31, 0, 17])
    cpu_decode.write_kv_cache(key, value, caches[0], caches[1], slots)
    write_kv_cache_reference(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_the_float16_write_rounds_each_value_as_half_does():
    """Bitwise `.half()`: ties to even, subnormals, overflow to infinity, and a row of 13
    (past the 8-wide vector, so the scalar tail too)."""
    tie = 1 + 2**-11  # halfway between 1 and the next float16: rounds to 1
    specials = [tie, 1 + 3 * 2**-11, 65504.0, 65520.0, -1e6, 2**-24, 2**-25 * 1.5, 1e-8, -0.0,
                float("inf"), 1 / 3]  # fmt: skip
    rows = torch.cat([torch.tensor(specials), randn(13 * 4 - len(specials), dtype=F32,
                                                    gen=generator(1)) * 100])  # fmt: skip
    key, value = rows.view(4, 1, 13), -rows.view(4, 1, 13)
    k_cache, v_cache = torch.zeros(8, 1, 1, 13, dtype=F16), torch.zeros(8, 1, 1, 13, dtype=F16)
    cpu_decode.write_kv_cache(key, value, k_cache, v_cache, torch.tensor([5, 0, 7, 2]))
    expected_k = key.half().view(torch.int16)
    assert torch.equal(k_cache[[5, 0, 7, 2], 0].view(torch.int16), expected_k)
    assert torch.equal(v_cache[[5, 0, 7, 2], 0].view(torch.int16), value.half().view(torch.int16))


def test_caches_the_kernels_do_not_hold_are_refused_and_left_to_the_reference():
    """K and V of two dtypes, or a dtype the C kernels do not read (bfloat16): the dispatch
    writes through the torch reference, which rounds to the cache's dtype."""
    key = torch.full((1, 1, 8), 1 / 3)
    k_cache, v_cache = torch.zeros(2, 4, 1, 8, dtype=F16), torch.zeros(2, 4, 1, 8)
    assert not cpu_decode.holds(k_cache, v_cache)
    with pytest.raises(ValueError, match="caches of one of"):
        cpu_decode.write_kv_cache(key, key, k_cache, v_cache, torch.tensor([0]))
    bf16 = torch.zeros(2, 4, 1, 8, dtype=torch.bfloat16)
    assert not cpu_decode.holds(bf16, bf16)
    dispatch.write_kv_cache(key, key, bf16, bf16, torch.tensor([5]))
    assert torch.equal(bf16[1, 1], key[0].bfloat16())


def test_a_slot_outside_the_cache_is_refused_and_nothing_is_written():
    k_cache, v_cache = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    ones = torch.ones(2, 1, 8)
    with pytest.raises(ValueError, match="slot"):
        cpu_decode.write_kv_cache(ones, ones, k_cache, v_cache, torch.tensor([0, 8]))
    assert not k_cache.any() and not v_cache.any()


@settings(max_examples=30, deadline=None)
@given(
    lens=st.lists(st.integers(0, 70), min_size=1, max_size=6),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 4),
    block_size=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 2**31),
    window=st.one_of(st.none(), st.integers(1, 80)),
    softcap=st.sampled_from([None, 0.5, 3.0]),
    cache_dtype=st.sampled_from([F16, F32]),
    head_dim=st.sampled_from([32, 36]),
)
def test_decode_attention_matches_the_reference(
    lens, kv_heads, group, block_size, seed, window, softcap, cache_dtype, head_dim
):
    """Ragged contexts in scattered blocks whose unused slots are NaN, whole or through a
    sliding window, with scores soft-capped or not, over a float16 or float32 cache (the
    reference reads the same float16 values widened: float32 rounding apart), rows a multiple
    of the vector or not; a context of 0 (a padded row) gives zeros."""
    gen = generator(seed)
    cache = paged_cache(lens, block_size=block_size, num_kv_heads=kv_heads, head_dim=head_dim,
                        dtype=cache_dtype, gen=gen)  # fmt: skip
    q = randn(len(lens), kv_heads * group, head_dim, dtype=F32, gen=gen)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens, 0.17)
    got = cpu_decode.decode_attention(*args, window, softcap)
    expected = decode_attention_reference(*args, window=window, softcap=softcap)
    torch.testing.assert_close(got, expected, **ATTENTION_TOLERANCES[F32])
    assert not got[torch.tensor(lens) == 0].any()


@pytest.mark.parametrize(
    ("table", "lens"),
    [([[0, 5]], [8]), ([[0, -1]], [8]), ([[0, 1]], [9]), ([[0, 1]], [-1])],
    ids=["block-past-the-cache", "padding-read-as-a-block", "context-past-the-table", "negative"],
)
def test_attention_refuses_what_would_read_outside_the_cache(table, lens):
    cache = torch.zeros(4, 4, 1, 8)
    with pytest.raises(ValueError, match="outside the cache"):
        cpu_decode.decode_attention(torch.zeros(1, 1, 8), cache, cache,
                                    torch.tensor(table, dtype=torch.int32),
                                    torch.tensor(lens, dtype=torch.int32), 1.0)  # fmt: skip


def test_attention_refuses_a_negative_soft_cap():
    cache = torch.zeros(4, 4, 1, 8)
    tables, lens = torch.tensor([[0]], dtype=torch.int32), torch.tensor([4], dtype=torch.int32)
    with pytest.raises(ValueError, match="soft cap is negative"):
        cpu_decode.decode_attention(torch.zeros(1, 1, 8), cache, cache, tables, lens, 1.0,
                                    softcap=-1.0)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), hidden=st.sampled_from([8, 64, 576]),
       with_residual=st.booleans(), seed=st.integers(0, 2**31))  # fmt: skip
def test_add_then_norm_matches_the_reference(rows, hidden, with_residual, seed):
    """Rows of x may be apart (a view of wider rows); one row or many (then threaded)."""
    gen = generator(seed)
    x = randn(rows, 2 * hidden, dtype=F32, gen=gen)[:, :hidden]
    residual = randn(rows, hidden, dtype=F32, gen=gen) if with_residual else None
    weight = randn(hidden, dtype=F32, gen=gen)
    out, summed = cpu_decode.fused_add_rmsnorm(x, residual, weight, 1e-5)
    expected, expected_sum = fused_add_rmsnorm_reference(x, residual, weight, 1e-5)
    assert torch.equal(summed, expected_sum)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_the_norm_refuses_a_weight_of_another_size():
    with pytest.raises(ValueError, match="weight"):
        cpu_decode.fused_add_rmsnorm(torch.zeros(2, 8), None, torch.ones(7), 1e-5)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 9), hidden=st.sampled_from([8, 64, 576]),
       scale=st.sampled_from([1e-3, 1.0, 1e3]), seed=st.integers(0, 2**31))  # fmt: skip
def test_float32_rmsnorm_is_bitwise_the_formula(rows, hidden, scale, seed):
    """The reference takes torch's fused rms_norm in float32: the same bits as HF's formula."""
    gen = generator(seed)
    x, residual = (
        randn(rows, hidden, dtype=F32, gen=gen) * scale,
        randn(rows, hidden, dtype=F32, gen=gen),
    )
    weight = randn(hidden, dtype=F32, gen=gen)
    out, summed = fused_add_rmsnorm_reference(x, residual, weight, 1e-5)
    h = x + residual
    formula = weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.equal(summed, h) and torch.equal(out, formula)


def test_dispatch_takes_the_c_kernels_for_float32_on_the_cpu_unless_torch_is_forced():
    q = torch.zeros(1, 2, 8)
    assert dispatch.uses_cpu_kernels(q) and not dispatch.uses_reference(q)
    assert not dispatch.uses_cpu_kernels(q.to(torch.bfloat16))
    assert cpu_decode.holds(q.half(), q.half()) and cpu_decode.holds(q, q)
    dispatch.set_kernel_backend("torch")
    try:
        assert not dispatch.uses_cpu_kernels(q) and dispatch.uses_reference(q)
    finally:
        dispatch.set_kernel_backend("auto")
