"""The paged KV cache on the CPU holds (resident) what has been written into it, not its whole
budget: an engine that reserves 1 GiB for the cache does not take 1 GiB at start."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from batching_engine.model.kv_cache import KVCacheLayout

MIB = 1 << 20


def resident_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024


def test_a_cpu_cache_is_zero_and_commits_memory_only_where_written():
    layout = KVCacheLayout(num_layers=4, block_size=16, num_kv_heads=2, head_dim=64,
                           dtype=torch.float32)  # fmt: skip
    blocks = (256 * MIB) // layout.bytes_per_block
    before = resident_bytes()
    caches = layout.allocate(blocks, torch.device("cpu"))
    assert resident_bytes() - before < 16 * MIB
    assert len(caches) == 4 and caches[0][0].shape == (blocks, 16, 2, 64)
    # All zero; reading it commits nothing (max and min reduce without a temporary).
    assert all(float(t.max()) == float(t.min()) == 0.0 for pair in caches for t in pair)
    assert resident_bytes() - before < 16 * MIB
    caches[0][0].fill_(1.0)  # one layer's K: an eighth of the cache
    grown = resident_bytes() - before
    assert 24 * MIB < grown < 64 * MIB
    assert float(caches[0][1].max()) == 0.0  # the views do not overlap
    del caches
    gc.collect()
    assert resident_bytes() - before < 16 * MIB  # unmapped with the last view
