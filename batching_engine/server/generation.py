"""/v1/completions and /v1/chat/completions: a request in, a stream of text out.

A request is admitted before any byte of the answer is sent, so a full queue is a 429.
A stream's headers wait for its first token too, so a request that timed out in the queue
is still a 429 rather than a broken stream. Any way out of the handler that did not see
the request end (the client left, a write failed) aborts it, and the engine frees its KV.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from aiohttp import web

from batching_engine.async_engine import AsyncEngine, Delta, RequestStream
from batching_engine.errors import EngineDrainingError, EngineFailedError, QueueFullError
from batching_engine.metrics import RequestStatus
from batching_engine.sequence import FinishReason, Sequence
from batching_engine.server.body import read_body
from batching_engine.server.errors import NotReadyError, RetryLaterError
from batching_engine.server.handler_context import HandlerContext
from batching_engine.server.protocol import (
    GenerationRequest,
    decode_json,
    parse_chat,
    parse_completion,
)
from batching_engine.server.responses import (
    SSE_DONE,
    Envelope,
    full_response,
    stream_chunk,
    usage_chunk,
)
from batching_engine.server.served_model import ServedModel
from batching_engine.server.text_output import TextOutput
from infergrid.openai_error import error_body

log = logging.getLogger("infergrid.engine.http")


async def generate(
    server: HandlerContext, request: web.Request, *, chat: bool
) -> web.StreamResponse:
    model, engine = server.require_model(), server.require_engine()
    model.check_generates()
    # Before even reading the body: under overload, refusing is most of the work, and it
    # must leave the worker thread (which shares the GIL) its CPU.
    with _refusals(server, engine):
        engine.check_room()
    body = decode_json(await read_body(request, server.read_timeout_s))
    req = parse_chat(body) if chat else parse_completion(body)
    model.check_name(req.model)
    seq = await asyncio.to_thread(_sequence, model, req)  # tokenizing may take a while
    with _refusals(server, engine):
        stream = await engine.submit(seq)
    answer = _Answer(
        Envelope.new(chat, model.name), stream, TextOutput(model.tokenizer, req.params.stop)
    )
    try:
        if req.stream:
            return await answer.stream(request, server, req.include_usage)
        return await answer.collect(server)
    finally:
        if not stream.done:
            engine.abort(stream.seq.seq_id)


def _sequence(model: ServedModel, req: GenerationRequest) -> Sequence:
    prompt = _prompt_ids(model, req)
    params = req.params
    if req.fill_context:
        params = replace(params, max_tokens=max(1, model.max_model_len - len(prompt)))
    return Sequence(prompt, params, priority=req.priority)


def _prompt_ids(model: ServedModel, req: GenerationRequest) -> list[int]:
    """On a worker thread. A prompt leaves room for one output token, hence the - 1."""
    tokenizer, most = model.tokenizer, model.max_model_len - 1
    if req.messages is not None:
        text = tokenizer.apply_chat_template(req.messages)
        model.check_chars(text, "messages", most)
        ids = tokenizer.encode(text, add_special_tokens=False)  # the template has its specials
        model.check_length(ids, "messages")
        return ids
    if isinstance(req.prompt, str):
        model.check_chars(req.prompt, "prompt", most)
        return tokenizer.encode(req.prompt)
    assert req.prompt is not None, "parse_completion requires a prompt"
    model.check_tokens(req.prompt, "prompt")
    return list(req.prompt)


@contextmanager
def _refusals(server: HandlerContext, engine: AsyncEngine) -> Iterator[None]:
    """The engine's refusals, as the errors the client gets."""
    try:
        yield
    except QueueFullError as err:
        server.metrics.request_finished(RequestStatus.REJECTED)
        raise RetryLaterError(str(err), engine.retry_after_s()) from None
    except EngineDrainingError as err:
        raise NotReadyError(str(err)) from None


class _Answer:
    """One request's deltas turned into an OpenAI body or event stream."""

    def __init__(self, env: Envelope, stream: RequestStream, text: TextOutput) -> None:
        self.env, self.deltas, self.text = env, stream, text
        self.seq = stream.seq

    async def collect(self, server: HandlerContext) -> web.Response:
        delta = await self._first(server)
        while not delta.final:
            self.text.push(delta.token_ids)
            delta = await anext(self.deltas)
        _raise_on_error(delta)
        self.text.finish(delta.token_ids, self.seq.text_end)
        counts = (self.seq.num_prompt_tokens, len(self.seq.output_token_ids))
        body = full_response(self.env, self.text.text, delta.finish_reason, *counts)
        return web.json_response(body)

    async def stream(
        self, request: web.Request, server: HandlerContext, usage: bool
    ) -> web.StreamResponse:
        """Server-sent events: `data: {chunk}` lines, then `data: [DONE]`."""
        delta = await self._first(server)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            if self.env.chat:
                await _send(response, stream_chunk(self.env, "", first=True))
            await self._send_deltas(response, delta, usage)
            await response.write_eof()
        except ConnectionResetError:
            log.debug("the client of a stream went away")
        return response

    async def _first(self, server: HandlerContext) -> Delta:
        """The first delta, checked before any byte of the response is sent."""
        delta = await anext(self.deltas)
        _raise_on_error(delta)
        if delta.finish_reason is FinishReason.TIMEOUT:
            raise RetryLaterError(
                "waited in the queue past its timeout", server.require_engine().retry_after_s()
            )
        return delta

    async def _send_deltas(self, response: web.StreamResponse, delta: Delta, usage: bool) -> None:
        while not delta.final:
            piece = self.text.push(delta.token_ids)
            if piece:
                await _send(response, stream_chunk(self.env, piece))
            delta = await anext(self.deltas)
        if delta.error is not None:  # too late for a status code: an error event, no [DONE]
            await _send(response, error_body(delta.error, "server_error", None))
            return
        piece = self.text.finish(delta.token_ids, self.seq.text_end)
        await _send(response, stream_chunk(self.env, piece, delta.finish_reason))
        if usage:
            counts = (self.seq.num_prompt_tokens, len(self.seq.output_token_ids))
            await _send(response, usage_chunk(self.env, *counts))
        await response.write(SSE_DONE)


def _raise_on_error(delta: Delta) -> None:
    if delta.error is not None:
        raise EngineFailedError(delta.error)


async def _send(response: web.StreamResponse, doc: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
