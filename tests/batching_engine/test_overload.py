"""Three times the engine's capacity: only successes and 429s, never a 5xx, bounded memory.

Capacity is what the engine holds at once, running plus queued. The acceptance run is 30 s
(bench/engine_overload.py); CI runs the same overload for INFERGRID_OVERLOAD_SECONDS
(default 3 s), which is enough to fill the queue many times over.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from harness.engine_process import EngineProcess, overload
from harness.tiny_model_dir import write_tiny_model

pytestmark = pytest.mark.timeout(300)
MAX_NUM_SEQS, MAX_QUEUE_SIZE = 4, 8
CAPACITY = MAX_NUM_SEQS + MAX_QUEUE_SIZE
SECONDS = float(os.environ.get("INFERGRID_OVERLOAD_SECONDS", "3"))
RSS_GROWTH_LIMIT_KIB = 256 * 1024
BODY = {"prompt": "hello world", "max_tokens": 8, "temperature": 0, "ignore_eos": True}


def test_three_times_capacity_gets_only_200s_and_429s(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny")
    args = ["--model", str(model), "--kv-cache-memory", "16MiB", "--max-num-seqs",
            str(MAX_NUM_SEQS), "--max-queue-size", str(MAX_QUEUE_SIZE)]  # fmt: skip
    engine = EngineProcess(args, tmp_path / "engine.log")
    try:
        engine.wait_ready()
        asyncio.run(overload(engine.url, 1, 0.5, BODY))  # warm: first-use allocations
        settled, _ = engine.rss_kib()
        statuses = asyncio.run(overload(engine.url, 3 * CAPACITY, SECONDS, BODY))
        _, peak = engine.rss_kib()
        engine.terminate()
        assert engine.wait() == 0, engine.log()
    finally:
        engine.kill()
    assert set(statuses) <= {"200", "429"}, statuses
    assert statuses["200"] > 0 and statuses["429"] > 0, statuses
    assert peak - settled < RSS_GROWTH_LIMIT_KIB, f"RSS grew {peak - settled} KiB"
