"""KV-cache write: scatter each token's key and value rows into its slot of the paged cache.

Cache layout (per layer): `[num_blocks, block_size, num_kv_heads, head_dim]`; slot
`s = block * block_size + offset`. A slot of -1 means "skip": padded rows of a CUDA-graph batch,
and tokens whose KV is already cached (a prefix-cache hit) carry it, and must leave the cache as
it was.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    Launch,
    check_device,
    check_dim,
    check_dtype,
    check_inner_contiguous,
    check_ndim,
    next_power_of_2,
    require,
)


@triton.jit
def _kv_cache_write_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    num_kv_heads,
    stride_key_token,
    stride_key_head,
    stride_value_token,
    stride_value_head,
    stride_cache_block,
    stride_cache_offset,
    stride_cache_head,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    # The slot test is broadcast from a vector: Triton's interpreter rejects a scalar in a mask.
    slot_ok = (tl.zeros([BLOCK_H], tl.int64) + slot) >= 0
    mask = ((heads < num_kv_heads) & slot_ok)[:, None] & (dims < HEAD_DIM)[None, :]
    src = heads[:, None] * stride_key_head + dims[None, :]
    src_v = heads[:, None] * stride_value_head + dims[None, :]
    block = slot // BLOCK_SIZE
    dst = (
        block * stride_cache_block
        + (slot - block * BLOCK_SIZE) * stride_cache_offset
        + heads[:, None] * stride_cache_head
        + dims[None, :]
    )
    key = tl.load(key_ptr + token * stride_key_token + src, mask=mask)
    value = tl.load(value_ptr + token * stride_value_token + src_v, mask=mask)
    tl.store(k_cache_ptr + dst, key, mask=mask)
    tl.store(v_cache_ptr + dst, value, mask=mask)


def write_kv_cache_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """The torch path: index-copy the rows whose slot is not -1, in the cache's dtype (a
    float16 cache under float32 rows: the engine's on the CPU, rounded as `.half()` rounds).
    The rows are selected (a copy) only when some slot is -1; a decode step's tokens all
    have one."""
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[keep], value[keep]
    blocks, offsets = slots // k_cache.shape[1], slots % k_cache.shape[1]
    k_cache[blocks, offsets] = key.to(k_cache.dtype)
    v_cache[blocks, offsets] = value.to(v_cache.dtype)


def _check(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    check_ndim("key", key, 3, "[num_tokens, num_kv_heads, head_dim]")
    check_ndim("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    check_ndim("slot_mapping", slot_mapping, 1, "[num_tokens]")
    check_dtype("key", key, FLOAT_DTYPES)
    check_dtype("slot_mapping", slot_mapping, INDEX_DTYPES)
    require(
        value.shape == key.shape, f"value: shape {tuple(value.shape)} != key {tuple(key.shape)}"
    )
    require(
        v_cache.shape == k_cache.shape and v_cache.stride() == k_cache.stride(),
        f"v_cache: shape {tuple(v_cache.shape)} strides {v_cache.stride()} differ from k_cache's",
    )
    for name, t in {"value": value, "k_cache": k_cache, "v_cache": v_cache}.items():
        require(t.dtype == key.dtype, f"{name}: dtype {t.dtype}, expected {key.dtype} (key's)")
    check_dim("slot_mapping", slot_mapping, 0, key.shape[0], "one slot per token of key")
    check_dim("k_cache", k_cache, 2, key.shape[1], "num_kv_heads of key")
    check_dim("k_cache", k_cache, 3, key.shape[2], "head_dim of key")
    for name, t in {"key": key, "value": value, "k_cache": k_cache}.items():
        check_inner_contiguous(name, t)


def kv_cache_write_plan(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> Launch:
    block_h = next_power_of_2(key.shape[1])
    block_d = next_power_of_2(key.shape[2])
    return Launch(
        grid=(key.shape[0],),
        args=(
            key,
            value,
            k_cache,
            v_cache,
            slot_mapping,
            key.shape[1],
            key.stride(0),
            key.stride(1),
            value.stride(0),
            value.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
        ),
        constexprs={
            "BLOCK_SIZE": k_cache.shape[1],
            "HEAD_DIM": key.shape[2],
            "BLOCK_H": block_h,
            "BLOCK_D": block_d,
        },
        num_warps=4 if block_h * block_d >= 2048 else 1,
        num_stages=1,
    )


def write_kv_cache_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """The Triton path. Slots must lie in the cache: an out-of-range slot is not checked on the
    device (that would cost a sync) and writes out of bounds."""
    _check(key, value, k_cache, v_cache, slot_mapping)
    check_device(
        _kv_cache_write_kernel,
        {"key": key, "value": value, "k_cache": k_cache, "v_cache": v_cache, "slots": slot_mapping},
    )
    if key.shape[0] > 0:
        kv_cache_write_plan(key, value, k_cache, v_cache, slot_mapping).run(_kv_cache_write_kernel)
