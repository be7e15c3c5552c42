"""Random inputs for kernel tests: poisoned outputs, paged caches with scattered blocks.

Poison is NaN: a kernel that leaves an element unwritten, or reads a cache slot it should not,
shows up as NaN in the comparison (`assert_close` treats NaN as a mismatch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_IDS = ("fp32", "fp16", "bf16")

# fp32 and fp16 at the usual tolerances. The interpreter truncates when it rounds to bf16, and
# several roundings stack, so bf16 gets a few units in the last place (2**-8 each).
TOLERANCES = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 1e-3, "rtol": 1e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}
# Attention accumulates in another order than the reference, and rounds its probabilities to
# the input dtype before multiplying by V.
ATTENTION_TOLERANCES = {
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype)


def poisoned(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


@dataclass
class PagedCache:
    """One layer's K/V cache holding some sequences' contexts in scattered blocks.

    Every slot that holds no context token is NaN, so reading past a context shows."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32, padded with -1 (and one spare -1 column)
    context_lens: torch.Tensor  # int32

    @property
    def block_size(self) -> int:
        return self.k_cache.shape[1]


def paged_cache(
    context_lens: list[int],
    *,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    gen: torch.Generator,
) -> PagedCache:
    needed = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(needed) + 2  # spare blocks stay poisoned
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((len(context_lens), max(needed, default=0) + 1), -1, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = poisoned(*shape, dtype=dtype), poisoned(*shape, dtype=dtype)
    for seq, (length, count) in enumerate(zip(context_lens, needed, strict=True)):
        blocks = [order.pop() for _ in range(count)]
        tables[seq, :count] = torch.tensor(blocks, dtype=torch.int32)
        for position in range(length):
            block, offset = blocks[position // block_size], position % block_size
            k_cache[block, offset] = randn(num_kv_heads, head_dim, dtype=dtype, gen=gen)
            v_cache[block, offset] = randn(num_kv_heads, head_dim, dtype=dtype, gen=gen)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return PagedCache(k_cache, v_cache, tables, lens)


def ragged_lengths(gen: torch.Generator, count: int, low: int, high: int) -> list[int]:
    return torch.randint(low, high + 1, (count,), generator=gen).tolist()
