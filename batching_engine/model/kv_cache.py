"""The paged KV cache's shape, its size in bytes, and its one allocation.

Per layer, K and V are [num_blocks, block_size, num_kv_heads, head_dim]; all layers live in
one tensor so the cache is a single allocation and each layer's K and V are contiguous views.

On the CPU that allocation is an anonymous memory map: zeroed pages that the kernel commits only
as tokens are written into them, so an engine holds (resident) the cache it has used, not the
whole budget. `torch.zeros` would write, and so commit, every page at start (1 GiB by default).

On the CPU a model computing in float32 keeps its cache in float16 (`kv_cache_dtype`), as
llama.cpp does: the cache is the engine's largest memory under load after torch itself, and
reading it the largest cost of a batched decode step, so half the bytes hold twice the tokens
and are read in about half the time. The kernels widen what they read back to float32 exactly;
only the rounding of each stored K/V value to float16 differs from a float32 cache.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch

from batching_engine.model.config import LlamaConfig
from batching_engine.model.tensor_parallel import SINGLE, TensorParallel, kv_heads
from infergrid.errors import ContractError

MIB = 1 << 20
KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


def kv_cache_dtype(
    device: torch.device | str, dtype: torch.dtype, triton: bool = False
) -> torch.dtype:
    """The cache's dtype for a model computing in `dtype` on `device`: float16 for float32 on
    the CPU (see the module's note), read there by the C kernels or the torch references;
    the model's own where Triton's kernels read it, which take it in the model's dtype: on a
    GPU, or on the CPU with `triton` forced (its interpreter: bench/kernels_gpu.py's dry run)."""
    if torch.device(device).type == "cpu" and dtype == torch.float32 and not triton:
        return torch.float16
    return dtype


@dataclass(frozen=True, slots=True)
class KVCacheLayout:
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def for_model(
        cls,
        config: LlamaConfig,
        block_size: int,
        dtype: torch.dtype,
        tp: TensorParallel = SINGLE,
    ) -> KVCacheLayout:
        """The cache of this rank's KV heads (all of them without tensor parallelism), held in
        `dtype` (`kv_cache_dtype`'s choice for the model)."""
        heads = len(kv_heads(config.num_key_value_heads, tp))
        return cls(config.num_hidden_layers, block_size, heads, config.head_dim, dtype)

    @property
    def bytes_per_block(self) -> int:
        """K and V of `block_size` tokens in every layer."""
        per_token = 2 * self.num_layers * self.num_kv_heads * self.head_dim
        return per_token * self.block_size * self.dtype.itemsize

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_blocks(self, kv_bytes: int, max_model_len: int) -> int:
        """How many blocks `kv_bytes` holds; refused when not even one longest sequence fits,
        since such a sequence could never finish."""
        blocks = kv_bytes // self.bytes_per_block
        needed = self.blocks_needed(max_model_len)
        if blocks < needed:
            raise ContractError(
                "kv_cache_memory",
                f"{kv_bytes // MIB} MiB holds {blocks} blocks of {self.block_size} tokens, but one"
                f" {max_model_len}-token sequence needs {needed} blocks"
                f" ({-(-needed * self.bytes_per_block // MIB)} MiB): raise the memory budget or"
                " lower max_model_len",
            )
        return blocks

    def allocate(self, num_blocks: int, device: torch.device) -> KVCaches:
        """Zeroed cache; element i is layer i's (K, V)."""
        shape = (
            self.num_layers,
            2,
            num_blocks,
            self.block_size,
            self.num_kv_heads,
            self.head_dim,
        )
        if torch.device(device).type == "cpu":
            cache = _lazily_committed_zeros(shape, self.dtype)
        else:
            cache = torch.zeros(shape, dtype=self.dtype, device=device)
        return [(cache[layer, 0], cache[layer, 1]) for layer in range(self.num_layers)]


def _lazily_committed_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor over an anonymous private mapping (see the module's note). The tensor
    holds the mapping alive; it is unmapped with the tensor's last reference."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(memory, dtype=dtype).view(shape)
