"""The paged KV cache on the CPU holds (resident) what has been written into it, not its whole
budget: an engine that reserves 1 GiB for the cache does not take 1 GiB at start."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from batching_engine.loading import served_kv_cache_dtype
from batching_engine.model.kv_cache import KVCacheLayout, kv_cache_dtype

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


def test_a_float32_model_on_the_cpu_caches_float16_and_elsewhere_its_own_dtype():
    assert kv_cache_dtype("cpu", torch.float32) == torch.float16
    assert kv_cache_dtype("cpu", torch.bfloat16) == torch.bfloat16
    assert kv_cache_dtype("cuda", torch.float32) == torch.float32
    assert kv_cache_dtype("cpu", torch.float32, triton=True) == torch.float32  # its interpreter


def test_the_served_cache_is_as_asked_or_for_auto_the_devices_choice():
    assert served_kv_cache_dtype("auto", "cpu", "float32") == "float16"
    assert served_kv_cache_dtype("auto", "cuda:0", "bfloat16") == "bfloat16"
    assert served_kv_cache_dtype("float32", "cpu", "float32") == "float32"


def test_a_float16_cache_holds_twice_the_blocks_of_a_float32_one_in_the_same_bytes():
    layouts = [KVCacheLayout(30, 16, 3, 64, dtype) for dtype in (torch.float32, torch.float16)]
    assert [layout.bytes_per_block // 16 for layout in layouts] == [46080, 23040]  # per token
    assert [layout.num_blocks(64 << 20, 256) for layout in layouts] == [91, 182]
