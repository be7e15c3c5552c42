"""/v1/embeddings: inputs checked one by one, then batched with other requests' inputs.

Each input is checked here rather than in its batch, so one bad input fails its own request
and never its batch-mates'. Batches run on the engine's worker thread, between generation
steps: the device runs one thing at a time.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from batching_engine.async_engine import AsyncEngine
from batching_engine.errors import QueueFullError, QueueTimeoutError
from batching_engine.metrics import RequestStatus
from batching_engine.server.body import read_body
from batching_engine.server.errors import RetryLaterError
from batching_engine.server.handler_context import HandlerContext
from batching_engine.server.json_fields import RequestError
from batching_engine.server.protocol import decode_json, parse_embedding
from batching_engine.server.responses import embeddings_response
from batching_engine.server.served_model import Embedder, ServedModel, check_priority
from batching_engine.throughput import retry_after_s


async def embeddings(server: HandlerContext, request: web.Request) -> web.Response:
    model = server.require_model()
    arrival = time.monotonic()
    req = parse_embedding(decode_json(await read_body(request, server.read_timeout_s)))
    model.check_name(req.model)
    check_priority(req.priority, server.priority_levels)
    inputs = await asyncio.to_thread(_all_input_ids, model, req.inputs)  # may take a while
    batcher = server.require_batcher()
    try:
        vectors = await batcher.submit(inputs, req.priority)
    except (QueueFullError, QueueTimeoutError) as err:
        full = isinstance(err, QueueFullError)
        server.metrics.request_finished(RequestStatus.REJECTED if full else RequestStatus.TIMEOUT)
        rate = batcher.completed.rate(time.monotonic())
        raise RetryLaterError(str(err), retry_after_s(batcher.queue_depth, rate)) from None
    server.metrics.request_finished(RequestStatus.SUCCESS)
    server.metrics.e2e.observe(time.monotonic() - arrival)
    tokens = sum(len(ids) for ids in inputs)
    return web.json_response(embeddings_response(model.name, vectors, req.encoding_format, tokens))


async def embed_batch(
    engine: AsyncEngine, runner: Embedder, inputs: list[list[int]]
) -> list[list[float]]:
    """The dynamic batcher's `run`: one pass over a batch of inputs, on the worker.

    It takes the engine and the runner themselves, not the server: queued batches still run
    while the server drains, when `require_model` already refuses new requests.
    """
    return await engine.run_job(lambda: runner.embed(inputs).tolist(), len(inputs))


def _all_input_ids(model: ServedModel, inputs: tuple[str | list[int], ...]) -> list[list[int]]:
    """On a worker thread: every input's ids, or the first bad input's error; every text's
    length is checked before any is tokenized."""
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            model.check_chars(item, f"input[{i}]", model.max_model_len)
    return [_input_ids(model, item, f"input[{i}]") for i, item in enumerate(inputs)]


def _input_ids(model: ServedModel, item: str | list[int], path: str) -> list[int]:
    ids = model.tokenizer.encode(item) if isinstance(item, str) else item
    if not 0 < len(ids) <= model.max_model_len:
        raise RequestError(path, f"needs 1 to {model.max_model_len} tokens, got {len(ids)}")
    model.check_tokens(ids, path)
    return ids
