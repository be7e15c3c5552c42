"""KV-cache write: the Triton kernel (interpreted) scatters exactly what the reference does."""

from __future__ import annotations

import pytest
import torch

from batching_engine.kernels._launch import KernelInputError
from batching_engine.kernels.kv_cache_write import (
    write_kv_cache_reference,
    write_kv_cache_triton,
)
from tests.batching_engine.kernels.tensors import DTYPE_IDS, DTYPES, generator, poisoned, randn

pytestmark = pytest.mark.usefixtures("triton_interpreter")
BLOCK_SIZE, KV_HEADS, HEAD_DIM = 8, 2, 24


def caches(dtype):
    shape = (5, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    return poisoned(*shape, dtype=dtype), poisoned(*shape, dtype=dtype)


@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_writes_each_token_to_its_slot_and_skips_minus_one(dtype, slot_dtype):
    gen = generator(0)
    # first and last slot of a block, slots in the last block, and two skipped tokens
    slots = torch.tensor([0, 7, 8, -1, 39, 21, -1], dtype=slot_dtype)
    key = randn(7, KV_HEADS, HEAD_DIM, dtype=dtype, gen=gen)
    value = randn(7, KV_HEADS, HEAD_DIM, dtype=dtype, gen=gen)
    k_cache, v_cache = caches(dtype)
    write_kv_cache_triton(key, value, k_cache, v_cache, slots)
    k_want, v_want = caches(dtype)
    write_kv_cache_reference(key, value, k_want, v_want, slots)
    torch.testing.assert_close(k_cache, k_want, equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(v_cache, v_want, equal_nan=True, atol=0, rtol=0)
    written = ~k_cache.isnan().flatten(0, 1).all(dim=(1, 2))
    assert written.nonzero().flatten().tolist() == [0, 7, 8, 21, 39]


def test_keys_read_through_strides_of_a_fused_qkv():
    gen = generator(1)
    qkv = randn(3, 3 * KV_HEADS * HEAD_DIM, dtype=torch.float32, gen=gen)
    width = KV_HEADS * HEAD_DIM
    key = qkv[:, width : 2 * width].view(3, KV_HEADS, HEAD_DIM)
    value = qkv[:, 2 * width :].view(3, KV_HEADS, HEAD_DIM)
    k_cache, v_cache = caches(torch.float32)
    write_kv_cache_triton(key, value, k_cache, v_cache, torch.tensor([5, 6, 30]))
    assert torch.equal(k_cache[0, 5], key[0]) and torch.equal(v_cache[3, 6], value[2])


def test_a_cache_of_another_dtype_is_refused():
    key = torch.zeros(2, KV_HEADS, HEAD_DIM)
    k_cache, v_cache = caches(torch.float16)
    with pytest.raises(KernelInputError, match="k_cache: dtype torch.float16, expected"):
        write_kv_cache_triton(key, key, k_cache, v_cache, torch.tensor([0, 1]))
