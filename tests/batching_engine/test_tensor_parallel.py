"""Tensor parallelism on the CPU: two real processes over gloo give the tokens one does.

Rank 0 is this test process, as it is the engine's; rank 1 is a worker process it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from batching_engine.device import DeviceChoice
from batching_engine.loading import tensor_parallel_size
from batching_engine.model.gguf_import import import_gguf
from batching_engine.model.tensor_parallel import (
    TensorParallel,
    kv_heads,
    query_heads,
    share,
)
from batching_engine.model_runner import ModelRunner
from batching_engine.tp_workers import TPWorkers
from harness.engine_process import EngineProcess
from harness.tiny_llama import hf_greedy, runner_greedy, save_tiny_decoder, save_tiny_llama
from harness.tiny_model_dir import write_tiny_model
from infergrid.errors import ContractError
from tests.batching_engine.test_model_families import GEMMA2
from tests.batching_engine.test_smollm2 import smollm2_gguf

PROMPTS = [[1, 5, 9, 200, 31], [7, 7, 100], list(range(3, 40))]


@given(st.integers(1, 1000), st.integers(1, 16))
def test_shares_cover_everything_once_and_differ_by_at_most_one(total, size):
    parts = [share(total, size, rank) for rank in range(size)]
    assert [i for part in parts for i in part] == list(range(total))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_query_heads_stay_with_the_kv_head_they_read():
    """SmolLM2: 9 query heads over 3 KV heads, on 2 ranks: KV 0-1 and query 0-5, then 2 and
    6-8."""
    ranks = [TensorParallel(rank, 2) for rank in range(2)]
    assert [kv_heads(3, tp) for tp in ranks] == [range(0, 2), range(2, 3)]
    assert [query_heads(9, 3, tp) for tp in ranks] == [range(0, 6), range(6, 9)]


def test_more_ranks_than_kv_heads_is_refused_naming_the_setting():
    with pytest.raises(ContractError) as caught:
        kv_heads(2, TensorParallel(0, 4))
    assert caught.value.field == "tensor_parallel_size"


@contextlib.contextmanager
def parallel_runner(size: int, failures: list[str], **kwargs) -> Iterator[ModelRunner]:
    """Rank 0 here and ranks 1..size-1 in worker processes, over gloo."""
    workers = TPWorkers(size, kwargs, on_failure=failures.append)
    try:
        runner = ModelRunner(**kwargs, workers=workers)
    except BaseException:
        workers.close()
        raise
    try:
        yield runner
    finally:
        runner.close()


@pytest.mark.parametrize(("heads", "kv"), [(4, 2), (6, 3)], ids=["even-heads", "uneven-heads"])
def test_two_ranks_decode_the_tokens_of_one_and_of_transformers(tmp_path, heads, kv):
    reference = save_tiny_llama(
        tmp_path, hidden_size=96, num_attention_heads=heads, num_key_value_heads=kv,
        intermediate_size=200,
    )  # fmt: skip
    expected = [hf_greedy(reference, prompt, 10) for prompt in PROMPTS]
    kwargs = {"model_dir": tmp_path, "kv_cache_memory_bytes": 1 << 20, "max_model_len": 128}
    assert runner_greedy(ModelRunner(**kwargs), PROMPTS, 10) == expected
    failures: list[str] = []
    with parallel_runner(2, failures, **kwargs) as runner:
        assert runner_greedy(runner, PROMPTS, 10) == expected
    assert failures == []


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("qwen2", {}),
        ("qwen3", {"attention_bias": True}),
        ("phi3", {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
        ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
        (
            "gemma3_text",
            {
                "tie_word_embeddings": False,
                "query_pre_attn_scalar": 24,
                "layer_types": ["sliding_attention", "full_attention"],
            },
        ),
        ("gemma2", {"tie_word_embeddings": False, **GEMMA2}),
    ],
)
def test_two_ranks_split_each_familys_biases_and_head_norms(tmp_path, family, overrides):
    """q/k/v biases split with their heads, o_proj's added once, head norms on every rank,
    Phi-3's fused q/k/v and gate/up cut by head and column as the separate ones are, each of
    Mixtral's experts cut by column, the router whole, Gemma 2's scores capped per head."""
    reference = save_tiny_decoder(
        tmp_path, family, hidden_size=96, num_attention_heads=6, num_key_value_heads=3,
        intermediate_size=200, **overrides,
    )  # fmt: skip
    expected = [hf_greedy(reference, prompt, 10) for prompt in PROMPTS]
    kwargs = {"model_dir": tmp_path, "kv_cache_memory_bytes": 1 << 20, "max_model_len": 128}
    failures: list[str] = []
    with parallel_runner(2, failures, **kwargs) as runner:
        assert runner_greedy(runner, PROMPTS, 10) == expected
    assert failures == []


def test_smollm2_on_two_ranks_decodes_what_it_does_on_one(tmp_path):
    model_dir = import_gguf(smollm2_gguf(), tmp_path)
    kwargs = {"model_dir": model_dir, "kv_cache_memory_bytes": 64 << 20, "max_model_len": 256}
    expected = runner_greedy(ModelRunner(**kwargs), PROMPTS, 12)
    failures: list[str] = []
    with parallel_runner(2, failures, **kwargs) as runner:
        assert runner_greedy(runner, PROMPTS, 12) == expected
    assert failures == []


def test_a_dead_worker_fails_the_step_at_once_and_is_reported(tmp_path):
    save_tiny_llama(tmp_path)
    kwargs = {"model_dir": tmp_path, "kv_cache_memory_bytes": 1 << 20, "max_model_len": 128}
    failures: list[str] = []
    with parallel_runner(2, failures, **kwargs) as runner:
        runner.workers.processes[0].kill()
        started = time.monotonic()
        with pytest.raises(RuntimeError):
            runner_greedy(runner, PROMPTS, 4)
        assert time.monotonic() - started < 30  # not the collective's timeout
        deadline = time.monotonic() + 10
        while not failures and time.monotonic() < deadline:
            time.sleep(0.1)
    assert len(failures) == 1 and "exited with -9" in failures[0]
    assert not dist.is_initialized()


# The engine process: --tensor-parallel-size 2 on the CPU, and a worker killed under it.


def worker_pids(engine: EngineProcess) -> list[int]:
    """The engine's tensor-parallel workers: its children started by multiprocessing's spawn
    (not its resource tracker)."""
    children = Path(f"/proc/{engine.proc.pid}/task/{engine.proc.pid}/children").read_text()
    pids = [int(pid) for pid in children.split()]
    return [pid for pid in pids if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


async def complete(url: str) -> dict:
    body = {"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/v1/completions", json=body) as response,
    ):
        assert response.status == 200
        return await response.json()


@pytest.mark.timeout(300)
def test_an_engine_on_two_ranks_serves_and_exits_1_when_a_worker_dies(tmp_path):
    model = write_tiny_model(tmp_path / "tiny", max_positions=256)
    args = ["--model", str(model), "--device", "cpu", "--kv-cache-memory", "16MiB",
            "--tensor-parallel-size", "2"]  # fmt: skip
    engine = EngineProcess(args, tmp_path / "engine.log")
    try:
        engine.wait_ready()
        assert asyncio.run(complete(engine.url))["usage"]["completion_tokens"] == 4
        (worker,) = worker_pids(engine)
        os.kill(worker, signal.SIGKILL)
        assert engine.wait(limit_s=60) == 1
    finally:
        engine.kill()
    log = engine.log()
    assert "tensor parallelism: 2 ranks" in log
    assert f"tensor-parallel worker tp-rank-1 (pid {worker}) exited with -9; stopping" in log


@pytest.mark.parametrize(
    ("asked", "device", "cuda_devices", "ranks"),
    [
        (0, "cpu", 0, 1),
        (0, "cuda", 4, 4),
        (0, "cuda:1", 4, 1),
        (2, "cpu", 0, 2),
        (2, "cuda", 4, 2),
        (1, "cuda", 1, 1),
    ],
)
def test_the_rank_count_defaults_to_one_per_visible_gpu(asked, device, cuda_devices, ranks):
    choice = DeviceChoice(device, "float32", "test")
    assert tensor_parallel_size(asked, choice, cuda_devices) == ranks


def test_more_ranks_than_visible_gpus_is_refused_naming_the_flag():
    with pytest.raises(ContractError) as caught:
        tensor_parallel_size(4, DeviceChoice("cuda", "bfloat16", "test"), 2)
    assert caught.value.field == "--tensor-parallel-size"
