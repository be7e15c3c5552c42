"""The paged KV cache's shape, its size in bytes, and its one allocation.

Per layer, K and V are [num_blocks, block_size, num_kv_heads, head_dim]; all layers live in
one tensor so the cache is a single allocation and each layer's K and V are contiguous views.

On the CPU that allocation is an anonymous memory map: zeroed pages that the kernel commits only
as tokens are written into them, so an engine holds (resident) the cache it has used, not the
whole budget. `torch.zeros` would write, and so commit, every page at start (1 GiB by default).
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
        """The cache of this rank's KV heads (all of them without tensor parallelism)."""
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
