"""SIGTERM to a real `infergrid-engine` process with 50 streams in flight: none is lost."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from harness.engine_process import EngineProcess, readiness
from harness.tiny_model_dir import write_tiny_model

pytestmark = pytest.mark.timeout(300)
STREAMS = 50
TOKENS = 600  # long enough that the drain is still under way when the test looks


@pytest.fixture
def engine(tmp_path: Path):
    model = write_tiny_model(tmp_path / "tiny", max_positions=1024)
    args = ["--model", str(model), "--kv-cache-memory", "32MiB", "--max-num-seqs", "64"]
    process = EngineProcess(args, tmp_path / "engine.log")
    try:
        process.wait_ready()
        yield process
    finally:
        process.kill()


async def stream_to_the_end(http: aiohttp.ClientSession, url: str, started: asyncio.Event,
                            count: list[int]) -> list[str]:  # fmt: skip
    """The `data:` payloads of one stream; `started` is set once all have their first."""
    body = {"prompt": "hello world", "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True}  # fmt: skip
    events: list[str] = []
    async with http.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line[6:].decode().strip())
                if len(events) == 1:
                    count[0] += 1
                    if count[0] == STREAMS:
                        started.set()
    return events


async def drain_under_load(engine: EngineProcess) -> tuple[list[list[str]], list, int | None]:
    started, count = asyncio.Event(), [0]
    connector = aiohttp.TCPConnector(limit=STREAMS + 10)
    async with aiohttp.ClientSession(connector=connector) as http:
        streams = [asyncio.create_task(stream_to_the_end(http, engine.url, started, count))
                   for _ in range(STREAMS)]  # fmt: skip
        await started.wait()
        engine.terminate()
        seen = []  # readiness answers while the streams finish
        while len(seen) < 3 or seen[-1] == 200:
            seen.append(await readiness(engine.url))
        async with http.post(engine.url + "/v1/completions", json={"prompt": "late"}) as resp:
            late = resp.status
        results = await asyncio.gather(*streams)
    return results, seen, late


def test_sigterm_finishes_every_accepted_stream_and_exits_0(engine: EngineProcess) -> None:
    results, seen, late = asyncio.run(drain_under_load(engine))
    assert engine.wait() == 0, engine.log()
    assert len(results) == STREAMS
    for events in results:
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert 503 in seen, f"readiness never failed during the drain: {seen}"
    assert late == 503  # nothing new is accepted once draining
