"""The async front of the engine: a real LLMEngine and scheduler, a scripted model runner.

The runner is the neighbour across the seam (the only part that touches a model), so it is
the part faked here: it answers token 7 for every chunk that reaches the end of its
sequence, and raises on demand.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from batching_engine.async_engine import AsyncEngine
from batching_engine.config import EngineConfig
from batching_engine.engine import LLMEngine
from batching_engine.errors import EngineDrainingError, InvalidRequestError, QueueFullError
from batching_engine.metrics import EngineMetrics
from batching_engine.sequence import FinishReason, SamplingParams, Sequence

pytestmark = pytest.mark.timeout(60)
TOKEN = 7


class ScriptedRunner:
    num_kv_blocks = 64
    kv_cache_commits_lazily = False
    device = torch.device("cpu")  # a CPU step budget where the config leaves it

    def __init__(self) -> None:
        self.fail_next = False
        self.gate: threading.Semaphore | None = None  # when set, each step takes a permit

    def execute(self, batch: list[tuple[Sequence, int]]) -> list[int | None]:
        if self.gate is not None:
            self.gate.acquire()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("device fell over")
        return [TOKEN if s.num_computed_tokens + n == s.num_tokens else None for s, n in batch]


def make_engine(**config: int) -> tuple[AsyncEngine, ScriptedRunner, EngineMetrics]:
    runner, metrics = ScriptedRunner(), EngineMetrics()
    engine = LLMEngine(EngineConfig(max_model_len=256, **config), runner, eos_token_ids=[0])
    return AsyncEngine(engine, metrics), runner, metrics


def request(max_tokens: int = 3, priority: int = 0) -> Sequence:
    return Sequence([1, 2, 3], SamplingParams(temperature=0, max_tokens=max_tokens), priority)


def count(metrics: EngineMetrics, status: str) -> float:
    return sample(metrics, "infergrid_engine_requests_total", status=status)


def sample(metrics: EngineMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, name
    return value


async def hold_worker(engine: AsyncEngine) -> threading.Event:
    """A job that keeps the worker busy until released: no admission, no step meanwhile."""
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait()

    asyncio.ensure_future(engine.run_job(hold))
    await asyncio.to_thread(started.wait)
    return release


async def collect(engine: AsyncEngine, seq: Sequence) -> tuple[list[int], object]:
    tokens, last = [], None
    async for delta in await engine.submit(seq):
        tokens += delta.token_ids
        last = delta
    return tokens, last


def test_a_request_streams_its_tokens_and_ends_with_its_finish_reason() -> None:
    async def scenario():
        engine, _, metrics = make_engine()
        engine.start()
        result = await collect(engine, request(max_tokens=4))
        await engine.drain()
        await engine.close()
        return result, metrics

    (tokens, last), metrics = asyncio.run(scenario())
    assert tokens == [TOKEN] * 4 and last.finish_reason is FinishReason.LENGTH
    assert count(metrics, "success") == 1
    assert sample(metrics, "infergrid_engine_generation_tokens_total") == 4


def test_refusals_come_from_submit_before_any_output() -> None:
    async def scenario():
        engine, _, _ = make_engine(max_queue_size=1, priority_levels=2)
        engine.start()
        with pytest.raises(InvalidRequestError) as bad:
            await engine.submit(request(priority=5))
        assert bad.value.field == "priority"
        release = await hold_worker(engine)
        first = asyncio.create_task(engine.submit(request()))
        await asyncio.sleep(0)  # the first is in the worker's inbox: the queue is full
        with pytest.raises(QueueFullError):
            await engine.submit(request())
        release.set()
        async for _ in await first:
            pass
        await engine.close()

    asyncio.run(scenario())


def test_a_failed_step_ends_every_request_in_flight_and_the_engine_goes_on() -> None:
    async def scenario():
        engine, runner, metrics = make_engine()
        runner.fail_next = True
        engine.start()
        _, last = await collect(engine, request())
        assert last.error is not None and last.finish_reason is None
        tokens, after = await collect(engine, request())
        await engine.close()
        return tokens, after, metrics, engine

    tokens, after, metrics, engine = asyncio.run(scenario())
    assert tokens == [TOKEN] * 3 and after.finish_reason is FinishReason.LENGTH
    assert count(metrics, "error") == 1 and not engine.engine.has_unfinished()


def test_an_aborted_request_ends_and_frees_its_blocks() -> None:
    async def scenario():
        engine, runner, metrics = make_engine()
        gate = runner.gate = threading.Semaphore(1)  # one step, then wait for the abort
        engine.start()
        stream = await engine.submit(request(max_tokens=200))
        first = await anext(stream)
        engine.abort(stream.seq.seq_id)
        runner.gate = None
        gate.release()  # the step that was waiting runs, then the abort is seen
        await engine.drain()  # the abort ended the stream for the drain's purposes
        await engine.close()
        return first, metrics, engine

    first, metrics, engine = asyncio.run(scenario())
    assert first.token_ids == [TOKEN]
    assert count(metrics, "aborted") == 1
    assert not engine.engine.has_unfinished() and engine.kv_usage == 0


def test_draining_refuses_new_requests_and_waits_for_accepted_ones() -> None:
    async def scenario():
        engine, _, _ = make_engine()
        engine.start()
        stream = await engine.submit(request(max_tokens=20))
        draining = asyncio.create_task(engine.drain())
        await asyncio.sleep(0)
        with pytest.raises(EngineDrainingError):
            await engine.submit(request())
        assert not draining.done()
        tokens = [t async for delta in stream for t in delta.token_ids]
        await draining
        await engine.close()
        return tokens

    assert asyncio.run(scenario()) == [TOKEN] * 20


def test_jobs_run_on_the_worker_and_their_errors_come_back() -> None:
    async def scenario():
        engine, _, metrics = make_engine()
        engine.start()
        assert await engine.run_job(lambda: 6 * 7, batch_size=2) == 42
        with pytest.raises(ZeroDivisionError):
            await engine.run_job(lambda: 1 / 0)
        await engine.close()
        return metrics

    metrics = asyncio.run(scenario())
    # Only the jobs ran; a job of batch size 0 (not a batch) is not counted.
    assert sample(metrics, "infergrid_engine_batch_size_sum") == 2
    assert sample(metrics, "infergrid_engine_batch_size_count") == 1
